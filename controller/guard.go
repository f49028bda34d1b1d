package controller

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"thermite/controller/ledger"
	"thermite/internal/confined"
	"thermite/internal/procs"
	"thermite/internal/rpc"
)

// decoyPair makes a trial's decoy AWS key pair: shaped like a real one,
// random, different for every trial, and never valid anywhere.
func decoyPair() (id, secret string) {
	const upper = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
	const any = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	pick := func(alphabet string, n int) string {
		b := make([]byte, n)
		rand.Read(b)
		for i := range b {
			b[i] = alphabet[int(b[i])%len(alphabet)]
		}
		return string(b)
	}
	return "AKIA" + pick(upper, 16), pick(any, 40)
}

// trialEnv is what every command of a trial's lane and agent has in its
// environment besides the broker's: the decoy pair.
func trialEnv(t ledger.Trial) []string {
	if t.DecoyKeyID == "" {
		return nil
	}
	return []string{"AWS_ACCESS_KEY_ID=" + t.DecoyKeyID, "AWS_SECRET_ACCESS_KEY=" + t.DecoySecret, "AWS_DEFAULT_REGION=us-east-1"}
}

// DecoySeen decides whether a request carries its trial's decoy
// credential anywhere: the path or query, a header, or the body (a fetch's
// URL and headers, an exec's arguments, a recorded step). It names the
// place, or returns "".
func DecoySeen(t ledger.Trial, r *http.Request, body []byte) string {
	if t.DecoyKeyID == "" {
		return ""
	}
	has := func(s string) bool {
		return strings.Contains(s, t.DecoyKeyID) || strings.Contains(s, t.DecoySecret)
	}
	// Every form it may take: as sent, and each JSON string of the body
	// decoded, and again with its percent-escapes undone (a URL), each
	// well-formed escape even where others are not, and escapes of
	// escapes too: a server at the other end reads them so.
	unescaped := func(v string) bool {
		return anyPercentStage(v, has)
	}
	switch {
	case unescaped(r.URL.Path) || unescaped(r.URL.RawQuery):
		return "the request's URL (" + r.URL.Path + ")"
	case bytes.Contains(body, []byte(t.DecoyKeyID)) || bytes.Contains(body, []byte(t.DecoySecret)):
		return "the body of " + r.Method + " " + r.URL.Path
	}
	var doc any
	if json.Unmarshal(body, &doc) == nil && anyString(doc, unescaped) {
		return "the body of " + r.Method + " " + r.URL.Path
	}
	for k, vs := range r.Header {
		for _, v := range vs {
			if has(v) {
				return "the " + k + " header of " + r.URL.Path
			}
		}
	}
	return ""
}

// anyPercentStage reports whether f holds for s or for any stage of
// undoing its well-formed %XX escapes (ParseUint takes no sign), each pass
// over the last (at most 8: %2541 is %41 is A), a malformed escape and '+'
// left as they are. Every stage is asked, not only the last: in "%0%41KIA"
// one pass gives "%0AKIA", which a server may read, and the next would eat
// its A as "%0A".
func anyPercentStage(s string, f func(string) bool) bool {
	for range 9 {
		if f(s) {
			return true
		}
		if !strings.Contains(s, "%") {
			return false
		}
		var b strings.Builder
		for i := 0; i < len(s); i++ {
			if s[i] == '%' && i+2 < len(s) {
				if v, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
					b.WriteByte(byte(v))
					i += 2
					continue
				}
			}
			b.WriteByte(s[i])
		}
		if b.Len() == len(s) {
			return false
		}
		s = b.String()
	}
	return false
}

// anyString reports whether f holds for any string in a decoded JSON value.
func anyString(v any, f func(string) bool) bool {
	switch x := v.(type) {
	case string:
		return f(x)
	case []any:
		for _, e := range x {
			if anyString(e, f) {
				return true
			}
		}
	case map[string]any:
		for k, e := range x {
			if f(k) || anyString(e, f) {
				return true
			}
		}
	}
	return false
}

// guardDecoy refuses a request, and ends its trial, when the trial's
// decoy shows in it; body is the request's body, already read.
func (c *Controller) guardDecoy(w http.ResponseWriter, r *http.Request, rt *trialRT, body []byte) bool {
	place := DecoySeen(rt.t, r, body)
	if place == "" {
		return true
	}
	if !c.trialEvent(rt, "security.decoy", map[string]any{"place": place, "route": r.URL.Path}) {
		refuse(w, r, http.StatusUnauthorized, unauthorized)
		return false
	}
	c.log.Warn("decoy credential seen; ending the trial", "trial", rt.t.ID, "place", place)
	reason := "security: its decoy credential appeared in " + place
	go c.EndTrial(rt.t.ID, reason)
	writeError(w, http.StatusForbidden, "refused: this request holds the trial's decoy credential (in "+place+"); the trial is ended")
	return false
}

// watchDisks measures every open trial's folders (the lane's and the
// agent's) every trial.disk_check, and ends a trial past trial.disk_cap_mb.
func (c *Controller) watchDisks() {
	t := time.NewTicker(c.cfg.Trial.DiskCheck.Duration)
	defer t.Stop()
	for range t.C {
		c.checkOpenDisks()
	}
}

// checkOpenDisks starts one round of disk checks and returns at once.
// Each trial is measured on its own: a large tree, or a measure the
// broker is slow to answer, delays only its own trial's next check, never
// another trial's, nor the next round. A trial whose check still runs is
// not checked twice at once.
func (c *Controller) checkOpenDisks() {
	c.mu.Lock()
	var open []*trialRT
	for _, rt := range c.trials {
		open = append(open, rt)
	}
	c.mu.Unlock()
	for _, rt := range open {
		if !rt.checking.CompareAndSwap(false, true) {
			continue
		}
		go func() {
			defer rt.checking.Store(false)
			c.checkDisk(rt)
		}()
	}
}

// checkDisk measures one trial, and ends it when it is over its cap. A
// measurement the rig could not make (the controller out of descriptors,
// the broker unreachable) is the rig's failure, not the lane's: it is
// logged loudly, shown in the trial's status, and retried at the next
// check, and the trial goes on. Only what the lane did ends it: a real
// measurement over its cap, or a tree built so that it cannot be walked.
func (c *Controller) checkDisk(rt *trialRT) int64 {
	lane, _ := c.table.Lane(rt.t.Lane)
	// The file helper's changes are counted before the measure: one made
	// while it runs shows at the next.
	fsc := rt.files()
	var changes uint64
	if fsc != nil {
		changes = fsc.Changes()
	}
	rt.mu.Lock()
	idle := fsc != nil && rt.measuredFS == fsc && rt.measuredChanges == changes
	rt.mu.Unlock()
	u, err := c.measureRoles(rt.t.Lane, idle)
	rt.mu.Lock()
	if err == nil {
		rt.measuredFS, rt.measuredChanges = fsc, changes
	} else {
		rt.measuredFS = nil
	}
	rt.mu.Unlock()
	total := u.Bytes
	capBytes := c.cfg.Trial.DiskCapMB << 20
	switch verdict := diskVerdict(total, capBytes, err); verdict {
	case diskOver, diskUnwalkable:
		c.event("trial.disk", rt.t, map[string]any{"bytes": total, "cap_bytes": capBytes, "unlinked_bytes": u.Unlinked, "unlinked_files": u.UnlinkedFiles, "error": errString(err)})
		// Stop the writer first, so the disk stops filling.
		c.broker.stopUser(lane.Name)
		reason := fmt.Sprintf("over its disk limit: %d MiB of %d MiB", total>>20, c.cfg.Trial.DiskCapMB)
		if u.Unlinked > 0 {
			reason += fmt.Sprintf(" (%d MiB of it in %d deleted files its processes kept open)", u.Unlinked>>20, u.UnlinkedFiles)
		}
		if u.Quota {
			reason += " (counted by the file system's user quota, deleted files still open included)"
		}
		switch {
		case verdict == diskUnwalkable && strings.Contains(err.Error(), procs.ErrHidden.Error()):
			reason = "over its disk limit: its processes keep their open files from the measure (" + err.Error() + ")"
		case verdict == diskUnwalkable:
			reason = "over its disk limit: its folders are too deep or too large to walk (" + err.Error() + ")"
		}
		c.EndTrial(rt.t.ID, reason)
	case diskUnmeasured:
		c.diskUnmeasured(rt, total, err)
	default:
		c.diskMeasured(rt, total, u.Reused)
	}
	return total
}

// The verdicts of one disk check.
const (
	diskWithin     = iota // measured, within its cap
	diskOver              // measured (perhaps in part) over its cap
	diskUnwalkable        // the lane's tree defeats the walk: over every cap
	diskUnmeasured        // the rig could not measure it: retried, no verdict
)

// diskVerdict decides what one disk check means for a trial. What was
// measured over the cap ends it, even when another part failed; a walk
// the broker stopped at its bounds (confined.ErrTooBig) and processes that
// keep their open files from the measure (procs.ErrHidden) are the lane's
// doing; every other failure is the rig's.
func diskVerdict(total, capBytes int64, err error) int {
	switch {
	case total > capBytes:
		return diskOver
	case err == nil:
		return diskWithin
	case strings.Contains(err.Error(), confined.ErrTooBig.Error()),
		strings.Contains(err.Error(), procs.ErrHidden.Error()):
		return diskUnwalkable
	}
	return diskUnmeasured
}

// diskUnmeasured records a failed measurement: the first of a run of
// failures as an event, and each as an error in the log at most every
// 30 seconds, with the alert flag an operator's log watch keys on.
func (c *Controller) diskUnmeasured(rt *trialRT, total int64, err error) {
	now := time.Now().UTC()
	rt.mu.Lock()
	first := rt.disk.Error == ""
	if first {
		rt.disk.Since = now
	}
	rt.disk.Error = err.Error()
	rt.disk.Failures++
	n, since := rt.disk.Failures, rt.disk.Since
	loud := first || now.Sub(rt.diskLogged) >= 30*time.Second
	if loud {
		rt.diskLogged = now
	}
	rt.mu.Unlock()
	if first {
		c.trialEvent(rt, "trial.disk.unmeasured", map[string]any{"bytes_measured": total, "error": err.Error()})
	}
	if loud {
		c.log.Error("ALERT: a trial's folders cannot be measured; the trial goes on and the check is retried", "alert", true, "trial", rt.t.ID, "lane", rt.t.Lane, "since", since, "failures", n, "retry_in", c.cfg.Trial.DiskCheck.Duration.String(), "err", err)
	}
}

// diskMeasured records a good measurement, and the end of a run of
// failures.
func (c *Controller) diskMeasured(rt *trialRT, total int64, reused bool) {
	now := time.Now().UTC()
	rt.mu.Lock()
	was, n, prev := rt.disk.Error, rt.disk.Failures, rt.disk.Checked
	rt.disk = DiskState{Bytes: total, Checked: now, Reused: reused}
	if !prev.IsZero() {
		rt.disk.IntervalMS = now.Sub(prev).Milliseconds()
	}
	slow := rt.disk.IntervalMS > 2*c.cfg.Trial.DiskCheck.Milliseconds()
	loud := slow && now.Sub(rt.diskLogged) >= 30*time.Second
	if loud {
		rt.diskLogged = now
	}
	interval := rt.disk.IntervalMS
	rt.mu.Unlock()
	if loud {
		c.log.Error("ALERT: a trial's disk checks fall behind: measured again after more than twice disk_check", "alert", true, "trial", rt.t.ID, "lane", rt.t.Lane, "interval_ms", interval, "disk_check", c.cfg.Trial.DiskCheck.String())
	}
	if was != "" {
		c.trialEvent(rt, "trial.disk.measured", map[string]any{"bytes": total, "after_failures": n})
		c.log.Warn("a trial's folders can be measured again", "trial", rt.t.ID, "after_failures", n, "bytes", total)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// measure is what a lane's and its agent's folders hold now, with the
// unlinked files their processes keep open, and why any part of it could
// not be measured.
func (c *Controller) measure(lane int) (int64, error) {
	u, err := c.measureParts(lane)
	return u.Bytes, err
}

// measureParts is measure with the unlinked files' share apart.
func (c *Controller) measureParts(lane int) (rpc.DiskUsage, error) {
	return c.measureRoles(lane, false)
}

// measureRoles measures a lane's and its agent's folders. With laneIdle
// (the lane's file helper changed nothing since its last measure) the
// broker may reuse its last measure of a role that ran nothing since; the
// agent has no file helper, so only its own commands change its folder.
func (c *Controller) measureRoles(lane int, laneIdle bool) (rpc.DiskUsage, error) {
	l, _ := c.table.Lane(lane)
	a, _ := c.table.Agent(lane)
	var total rpc.DiskUsage
	var errs []error
	for _, r := range []struct {
		name string
		idle bool
	}{{l.Name, laneIdle}, {a.Name, true}} {
		u, err := c.broker.diskUsage(r.name, r.idle)
		total.Reused = (r.name == l.Name || total.Reused) && u.Reused
		total.Quota = (r.name == l.Name || total.Quota) && u.Quota
		total.Bytes += u.Bytes
		total.Entries += u.Entries
		total.Unlinked += u.Unlinked
		total.UnlinkedFiles += u.UnlinkedFiles
		if err != nil {
			errs = append(errs, fmt.Errorf("disk usage of %s: %w", r.name, err))
		}
	}
	return total, errors.Join(errs...)
}

// afterExec ends a trial whose command went over the lane's memory limit:
// the kernel ended only that trial's processes, and the record says so.
func (c *Controller) afterExec(rt *trialRT, f ExecFrame) {
	if f.Stopped == rpc.StoppedLimitMem {
		c.event("trial.memory", rt.t, map[string]any{"stopped": f.Stopped})
		go c.EndTrial(rt.t.ID, "over its memory limit: the kernel's OOM killer ended a command in its cgroup")
	}
}
