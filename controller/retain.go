package controller

import (
	"fmt"
	"time"

	"thermite/controller/ledger"
)

// PruneRequest removes the folders of trials that ended at least OlderThan
// ago ("0s": every ended trial's).
type PruneRequest struct {
	OlderThan string `json:"older_than,omitempty"`
}

// PruneResult says what a prune removed.
type PruneResult struct {
	Trials  []string `json:"trials"`
	Entries int64    `json:"entries"`
	Bytes   int64    `json:"bytes"`
	Errors  []string `json:"errors,omitempty"`
}

// Kept sums what ended trials' folders still hold on disk, from what each
// held when it was last measured: they are root's alone once retired, so
// the controller does not walk them again.
type Kept struct {
	Trials int   `json:"trials"`
	Bytes  int64 `json:"bytes"`
}

// retireTrial takes an ended trial's folder from its lane and agent in one
// step (the broker makes it root's, 0700), and removes it at once when the
// rig keeps no ended trials.
func (c *Controller) retireTrial(t ledger.Trial) error {
	remove := c.cfg.Trial.RetainEnded.Duration == 0
	n, err := c.broker.retire(c.trialDir(t.ID), remove)
	if err != nil {
		return fmt.Errorf("trial %s: %w", t.ID, err)
	}
	if remove {
		c.log.Info("trial folder removed", "trial", t.ID, "entries", n)
		return c.ledger.TrialRemoved(t.ID, time.Now().UTC())
	}
	return nil
}

// pruneEnded removes the folders of ended trials that ended before
// now-olderThan. One prune runs at a time.
func (c *Controller) pruneEnded(olderThan time.Duration) (PruneResult, error) {
	c.pruneMu.Lock()
	defer c.pruneMu.Unlock()
	res := PruneResult{Trials: []string{}}
	ts, err := c.ledger.KeptTrials()
	if err != nil {
		return res, err
	}
	cut := time.Now().Add(-olderThan)
	for _, t := range ts {
		if t.State == ledger.TrialOpen || !t.Removed.IsZero() || t.Ended.After(cut) || c.endUnderWay(t.ID) {
			continue
		}
		n, err := c.broker.retire(c.trialDir(t.ID), true)
		if err != nil {
			res.Errors = append(res.Errors, fmt.Sprintf("trial %s: %v", t.ID, err))
			continue
		}
		if err := c.ledger.TrialRemoved(t.ID, time.Now().UTC()); err != nil {
			res.Errors = append(res.Errors, err.Error())
			continue
		}
		res.Trials = append(res.Trials, t.ID)
		res.Entries += n
		res.Bytes += t.DiskBytes
		c.event("trial.removed", t, map[string]any{"entries": n, "disk_bytes": t.DiskBytes})
	}
	if len(res.Trials) > 0 {
		c.log.Info("ended trials removed", "trials", len(res.Trials), "entries", res.Entries, "bytes", res.Bytes)
	}
	return res, nil
}

// endUnderWay says whether id's end is recorded but not done: its roles
// may still run, and EndTrial retires its folder itself.
func (c *Controller) endUnderWay(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ending[id]
}

// keptEnded is what ended trials not yet removed hold.
func (c *Controller) keptEnded() (Kept, error) {
	ts, err := c.ledger.KeptTrials()
	if err != nil {
		return Kept{}, err
	}
	var k Kept
	for _, t := range ts {
		if t.State != ledger.TrialOpen && t.Removed.IsZero() {
			k.Trials++
			k.Bytes += t.DiskBytes
		}
	}
	return k, nil
}

// watchRetention removes ended trials' folders once they are older than
// trial.retain_ended, in the background, a few times per retention time.
func (c *Controller) watchRetention() {
	keep := c.cfg.Trial.RetainEnded.Duration
	every := min(max(keep/4, time.Second), time.Minute)
	t := time.NewTicker(every)
	defer t.Stop()
	for range t.C {
		res, err := c.pruneEnded(keep)
		if err != nil {
			c.log.Error("removing ended trials", "err", err)
		}
		for _, e := range res.Errors {
			c.log.Error("removing an ended trial", "err", e)
		}
	}
}
