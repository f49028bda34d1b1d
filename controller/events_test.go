package controller

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
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

// The events route: one trial's events as NDJSON, after a sequence
// number; with follow=1 it waits for the next and ends at trial.end; an
// unknown trial is a 404 naming it.
func TestTrialEventsRouteFollowsToTheEnd(t *testing.T) {
	l, err := ledger.Open(filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c := &Controller{ledger: l}
	tr := ledger.Trial{ID: "t1", Run: "r1", Lane: 1, TokenHash: ledger.HashToken("x"), State: ledger.TrialOpen, Started: time.Now().UTC()}
	if err := l.PutRun(ledger.Run{ID: "r1", Created: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	if err := l.StartTrial(tr); err != nil {
		t.Fatal(err)
	}
	c.event("trial.start", tr, map[string]any{"lane": 1})
	c.event("step", ledger.Trial{ID: "t2"}, map[string]any{"kind": "another trial's"})
	srv := httptest.NewServer(c.operatorRoutes())
	defer srv.Close()
	get := func(q string) (int, []ledger.Event) {
		t.Helper()
		resp, err := http.Get(srv.URL + "/v1/trials/" + q)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var evs []ledger.Event
		dec := json.NewDecoder(resp.Body)
		for {
			var e ledger.Event
			if dec.Decode(&e) != nil {
				break
			}
			evs = append(evs, e)
		}
		return resp.StatusCode, evs
	}
	if code, evs := get("t1/events"); code != 200 || len(evs) != 1 || evs[0].Kind != "trial.start" {
		t.Fatalf("t1's events: %d %+v", code, evs)
	}
	go func() {
		time.Sleep(200 * time.Millisecond)
		c.event("trial.exec", tr, map[string]any{"argv0": "sh"})
		time.Sleep(100 * time.Millisecond)
		c.event("trial.end", tr, map[string]any{"reason": "ended"})
	}()
	start := time.Now()
	code, evs := get("t1/events?follow=1&after=1")
	var kinds []string
	for _, e := range evs {
		kinds = append(kinds, e.Kind)
	}
	if code != 200 || fmt.Sprint(kinds) != "[trial.exec trial.end]" {
		t.Errorf("following t1 after its first event: %d %v", code, kinds)
	}
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Errorf("the follower took %s: the bell did not wake it", d)
	}
	resp, err := http.Get(srv.URL + "/v1/trials/tnone/events")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 || !strings.Contains(string(body), "trial: no trial tnone") {
		t.Errorf("an unknown trial: %d %s", resp.StatusCode, body)
	}
	if code, _ := get("t1/events?after=x"); code != 400 {
		t.Errorf("after=x: %d, want 400", code)
	}
}

// An agent's string in one of its events is clipped at a rune's start,
// saying how long it was; a short one is kept whole.
func TestClipEventString(t *testing.T) {
	if got := clipEventString("short"); got != "short" {
		t.Errorf("clipEventString(short) = %q", got)
	}
	long := strings.Repeat("a", maxEventString-1) + "é" + strings.Repeat("b", 100)
	got := clipEventString(long)
	if want := strings.Repeat("a", maxEventString-1) + fmt.Sprintf("… (%d bytes)", len(long)); got != want {
		t.Errorf("clipEventString of %d bytes = %q, want %q", len(long), got, want)
	}
}
