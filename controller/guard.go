package controller

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"thermite/controller/ledger"
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
		return has(v) || has(percentUndone(v))
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

// percentUndone undoes every well-formed %XX escape in s (ParseUint takes
// no sign), again and again while that changes it (at most 8 times: %2541
// is %41 is A), and leaves a malformed one and '+' as they are.
func percentUndone(s string) string {
	for range 8 {
		if !strings.Contains(s, "%") {
			return s
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
			return s
		}
		s = b.String()
	}
	return s
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

// guardDecoy reads a request's body (within the API's limit), and refuses
// the request and ends its trial when the decoy shows. The body is put
// back for the handler.
func (c *Controller) guardDecoy(w http.ResponseWriter, r *http.Request, rt *trialRT) bool {
	body, err := io.ReadAll(io.LimitReader(r.Body, c.cfg.API.MaxBodyBytes+1))
	r.Body.Close()
	if err != nil {
		writeError(w, http.StatusBadRequest, "reading the body: "+err.Error())
		return false
	}
	if int64(len(body)) > c.cfg.API.MaxBodyBytes {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body over the %d-byte limit", c.cfg.API.MaxBodyBytes))
		return false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	place := DecoySeen(rt.t, r, body)
	if place == "" {
		return true
	}
	c.event("security.decoy", rt.t, map[string]any{"place": place, "route": r.URL.Path})
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
		c.mu.Lock()
		var open []*trialRT
		for _, rt := range c.trials {
			open = append(open, rt)
		}
		c.mu.Unlock()
		for _, rt := range open {
			c.checkDisk(rt)
		}
	}
}

// checkDisk measures one trial, and ends it when it is over its cap.
func (c *Controller) checkDisk(rt *trialRT) int64 {
	lane, _ := c.table.Lane(rt.t.Lane)
	agent, _ := c.table.Agent(rt.t.Lane)
	var total int64
	unmeasurable := ""
	for _, r := range []string{lane.Name, agent.Name} {
		n, err := c.broker.diskUsage(r)
		if err != nil {
			unmeasurable = err.Error()
		}
		total += n
	}
	capBytes := c.cfg.Trial.DiskCapMB << 20
	if unmeasurable != "" {
		c.event("trial.disk", rt.t, map[string]any{"bytes": total, "error": unmeasurable})
		c.broker.stopUser(lane.Name)
		c.EndTrial(rt.t.ID, "over its disk limit: its folders cannot be measured ("+unmeasurable+")")
		return total
	}
	if total > capBytes {
		c.event("trial.disk", rt.t, map[string]any{"bytes": total, "cap_bytes": capBytes})
		// Stop the writer first, so the disk stops filling.
		c.broker.stopUser(lane.Name)
		c.EndTrial(rt.t.ID, fmt.Sprintf("over its disk limit: %d MiB of %d MiB", total>>20, c.cfg.Trial.DiskCapMB))
	}
	return total
}

// measure is what a lane's and its agent's folders hold now.
func (c *Controller) measure(lane int) int64 {
	l, _ := c.table.Lane(lane)
	a, _ := c.table.Agent(lane)
	var total int64
	for _, r := range []string{l.Name, a.Name} {
		n, _ := c.broker.diskUsage(r)
		total += n
	}
	return total
}

// afterExec ends a trial whose command went over the lane's memory limit:
// the kernel ended only that trial's processes, and the record says so.
func (c *Controller) afterExec(rt *trialRT, f ExecFrame) {
	if f.Stopped == rpc.StoppedLimitMem {
		c.event("trial.memory", rt.t, map[string]any{"stopped": f.Stopped})
		go c.EndTrial(rt.t.ID, "over its memory limit: the kernel's OOM killer ended a command in its cgroup")
	}
}
