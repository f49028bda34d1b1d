package controller

import (
	"fmt"
	"sync"
	"time"
)

// DiskLimitError: a judge command held more than its limit (a build past
// judge.build_disk_mb, a timed run past judge.run_out_mb), or what it
// held could not be measured. Key names the limit.
type DiskLimitError struct {
	Key     string // "judge.build_disk_mb" or "judge.run_out_mb"
	What    string // "the build", "the run"
	Role    string
	Bytes   int64
	LimitMB int64
	Err     error // the measurement's failure, when it failed
}

func (e *DiskLimitError) Error() string {
	if e.Err != nil && e.Bytes <= e.LimitMB<<20 {
		return fmt.Sprintf("judge: %s cannot be held to %s (%d MiB): what %s holds could not be measured: %v", e.What, e.Key, e.LimitMB, e.Role, e.Err)
	}
	return fmt.Sprintf("judge: %s is over %s: %s held %d MiB of %d MiB (its folders, HOME, TMPDIR and the unlinked files its processes kept open)",
		e.What, e.Key, e.Role, e.Bytes>>20, e.LimitMB)
}

func (e *DiskLimitError) Unwrap() error { return e.Err }

// diskGuard holds a judge command to a disk limit: it measures the role
// (its folders and its processes' unlinked files, as the broker counts a
// trial's) every judge.disk_check while the command runs, stops the role's
// processes the first time it is over, and measures once more at the end.
type diskGuard struct {
	c        *Controller
	role     string
	what     string
	key      string
	limitMB  int64
	stop     chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	over     *DiskLimitError
	measured error
}

// guardDisk starts holding role's command to limitMB (named key).
func (c *Controller) guardDisk(role, what, key string, limitMB int64) *diskGuard {
	g := &diskGuard{c: c, role: role, what: what, key: key, limitMB: limitMB, stop: make(chan struct{}), done: make(chan struct{})}
	go g.watch()
	return g
}

func (g *diskGuard) watch() {
	defer close(g.done)
	t := time.NewTicker(g.c.cfg.Judge.DiskCheck.Duration)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
			if g.check() {
				// Stop the writer, so the disk stops filling; the command
				// ends as killed, and finish says why.
				if _, err := g.c.broker.stopUser(g.role); err != nil {
					g.c.log.Error("judge: stopping a command over its disk limit", "role", g.role, "limit", g.key, "err", err)
				}
				return
			}
		}
	}
}

// check measures once and says whether the command is over its limit.
func (g *diskGuard) check() bool {
	u, err := g.c.broker.diskUsage(g.role, false)
	g.mu.Lock()
	defer g.mu.Unlock()
	if u.Bytes > g.limitMB<<20 || diskVerdict(u.Bytes, g.limitMB<<20, err) == diskUnwalkable {
		if g.over == nil {
			g.over = &DiskLimitError{Key: g.key, What: g.what, Role: g.role, Bytes: u.Bytes, LimitMB: g.limitMB, Err: err}
		}
		return true
	}
	g.measured = err
	return false
}

// finish stops the watch, measures what the role holds now, and returns
// a *DiskLimitError if the command was over its limit at any check, or if
// the last measure failed: a command the rig cannot hold to its limit does
// not count as within it.
func (g *diskGuard) finish() error {
	close(g.stop)
	<-g.done
	g.check()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.over != nil {
		return g.over
	}
	if g.measured != nil {
		return &DiskLimitError{Key: g.key, What: g.what, Role: g.role, LimitMB: g.limitMB, Err: g.measured}
	}
	return nil
}
