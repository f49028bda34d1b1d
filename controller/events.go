package controller

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"thermite/controller/ledger"
)

// A trial's events as they happen: what `thermite trial events` shows
// the operator, from the ledger, so that an ended trial's read the same.

// maxAgentEvents is how many events of one trial its agent alone decides
// the number of (API calls, refused fetches, tunnels and their refusals) are recorded: an
// agent can call the API without end, and the ledger must not grow with
// it. Past it they are counted, and the trial's end says how many went
// unrecorded. A variable so tests can lower it.
var maxAgentEvents int64 = 50000

// maxEventString bounds each string an agent chooses in one of its
// events (a refused fetch's URL and error, a tunnel's target, up to the
// 64 KiB of a request body or header): the cap counts events, and 50 000
// refused fetches of a 60 kB URL would be 7.4 GiB of the ledger.
const maxEventString = 512

// agentEvent records an event of that kind, within maxAgentEvents, each
// of its strings clipped to maxEventString; the first one past it is
// recorded as "events.unrecorded".
func (c *Controller) agentEvent(rt *trialRT, kind string, data map[string]any) {
	switch n := rt.agentEvents.Add(1); {
	case n <= maxAgentEvents:
		for k, v := range data {
			if s, ok := v.(string); ok {
				data[k] = clipEventString(s)
			}
		}
		c.trialEvent(rt, kind, data)
	case n == maxAgentEvents+1:
		c.trialEvent(rt, "events.unrecorded", map[string]any{"after": maxAgentEvents, "why": fmt.Sprintf("more than %d API calls and tunnels: the rest are counted, not recorded; the trial's end gives the count", maxAgentEvents)})
	}
}

// clipEventString is s cut to at most maxEventString bytes at a rune's
// start, saying how long it was.
func clipEventString(s string) string {
	if len(s) <= maxEventString {
		return s
	}
	cut := maxEventString
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", s[:cut], len(s))
}

// unrecordedEvents is how many of the trial's agent's events went
// unrecorded past maxAgentEvents.
func (rt *trialRT) unrecordedEvents() int64 {
	return max(0, rt.agentEvents.Load()-maxAgentEvents)
}

// eventBell rings when an event is recorded, for the streams that
// follow a trial.
type eventBell struct {
	mu sync.Mutex
	ch chan struct{}
}

// wait is a channel closed at the next event.
func (b *eventBell) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

func (b *eventBell) ring() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}

// callStatus sees the status a route answers.
type callStatus struct {
	http.ResponseWriter
	status int
}

func (s *callStatus) WriteHeader(status int) {
	if s.status == 0 {
		s.status = status
	}
	s.ResponseWriter.WriteHeader(status)
}

func (s *callStatus) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *callStatus) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *callStatus) Unwrap() http.ResponseWriter { return s.ResponseWriter }

var toolName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`) })

// recordCall serves a route of the harness API and records the call as
// the trial's "api" event (the route, its operationId, which is the
// trial client's MCP tool for the file routes, the status and the time),
// once the answer is sent, so the ledger's write does not delay it.
func (c *Controller) recordCall(route apiRoute, serve func(http.ResponseWriter, *http.Request, *trialRT)) func(http.ResponseWriter, *http.Request, *trialRT) {
	return func(w http.ResponseWriter, r *http.Request, rt *trialRT) {
		start := time.Now()
		cs := &callStatus{ResponseWriter: w}
		serve(cs, r, rt)
		cs.Flush()
		data := map[string]any{"route": route.Method + " " + route.Path, "id": route.ID, "status": cs.status, "ms": time.Since(start).Milliseconds()}
		if tool := r.Header.Get(ToolHeader); toolName().MatchString(tool) {
			data["tool"] = tool
		}
		c.agentEvent(rt, "api", data)
	}
}

// trialEvents answers GET /v1/trials/{id}/events: the trial's events
// after ?after=SEQ as NDJSON, one ledger.Event a line; with ?follow=1 it
// goes on as they are recorded until the trial's end is (then the stream
// ends) or the operator goes.
func (c *Controller) trialEvents(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if _, ok, err := c.ledger.Trial(id); err != nil {
		writeError(w, 500, err.Error())
		return
	} else if !ok {
		writeError(w, http.StatusNotFound, "trial: no trial "+id)
		return
	}
	var after uint64
	if s := r.URL.Query().Get("after"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("after: %q is not an event's sequence number", s))
			return
		}
		after = n
	}
	follow := r.URL.Query().Get("follow") == "1"
	// The operator socket's read timeout is for a request's arrival, not
	// for a stream that follows a trial for hours.
	http.NewResponseController(w).SetReadDeadline(time.Time{})
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(200)
	flush := func() {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	enc := json.NewEncoder(w)
	for {
		// The bell is taken before the read, so no event recorded between
		// the two is missed.
		bell := c.newEvent.wait()
		ended := c.trialOver(id)
		evs, err := c.ledger.TrialEvents(id, after, 1000)
		if err != nil {
			c.log.Error("trial events", "trial", id, "err", err)
			return
		}
		for _, e := range evs {
			if enc.Encode(e) != nil {
				return
			}
			after = e.Seq
			if follow && e.Kind == "trial.end" {
				flush()
				return
			}
		}
		flush()
		if len(evs) == 1000 {
			continue
		}
		// Without --follow, what is recorded now; with it, until the end
		// (a trial ended with no trial.end event, as one a restarted rig
		// ends at resume, ends the stream once it is read to the last).
		if !follow || ended {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-bell:
		case <-time.After(2 * time.Second):
		}
	}
}

// trialOver says whether a trial has ended and its end is recorded in
// full: not open in the ledger and not still ending.
func (c *Controller) trialOver(id string) bool {
	t, ok, err := c.ledger.Trial(id)
	if err != nil || !ok || t.State == ledger.TrialOpen {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.ending[id]
}
