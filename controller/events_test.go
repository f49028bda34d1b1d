package controller

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"thermite/controller/ledger"
)

// An agent that calls without end records maxAgentEvents of its calls,
// then one events.unrecorded, then nothing more; the count of the rest
// is kept for the trial's end. A follower waiting on the bell is woken by
// each recorded event.
func TestAgentEventsPastTheCapCountedNotRecorded(t *testing.T) {
	l, err := ledger.Open(filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c := &Controller{ledger: l}
	rt := newTrialRT(ledger.Trial{ID: "t1", Run: "r1"})
	old := maxAgentEvents
	maxAgentEvents = 3
	defer func() { maxAgentEvents = old }()

	bell := c.newEvent.wait()
	for i := range 7 {
		c.agentEvent(rt, "api", map[string]any{"i": i})
		if i == 0 {
			select {
			case <-bell:
			case <-time.After(time.Second):
				t.Fatal("an event recorded, and the bell did not ring")
			}
		}
	}
	evs, err := l.TrialEvents("t1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, e := range evs {
		kinds = append(kinds, e.Kind)
	}
	if got := fmt.Sprint(kinds); got != "[api api api events.unrecorded]" {
		t.Errorf("recorded %s, want 3 calls and one events.unrecorded", got)
	}
	if n := rt.unrecordedEvents(); n != 4 {
		t.Errorf("unrecorded %d, want 4 (7 calls, 3 recorded)", n)
	}
}
