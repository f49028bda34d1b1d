package main

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"thermite/internal/testrig"
)

// TestLanesFloodingEveryPathLeaveTheSixteenthServed: 15 lanes (4 on a
// machine of fewer than 8 CPUs; THERMITE_FLOOD_LANES sets the rig's) flood every path to the controller at once, each as its agent
// on its own socket: connect-and-close loops, idle connections, a large
// body withheld its last byte, execs whose output is never read, exec
// storms, dd with fsync, file writes and recorded steps. Meanwhile the
// last lane's agent makes ordinary calls (its trial's details, a step,
// an exec, a file write): every one succeeds, and its trial stays open.
// It asserts errors, never timings (BenchmarkFlood measures those).
func TestLanesFloodingEveryPathLeaveTheSixteenthServed(t *testing.T) {
	testrig.RequireRoot(t)
	lanes := 16
	if runtime.NumCPU() < 8 {
		lanes = 5
	}
	lanes = max(envOr("THERMITE_FLOOD_LANES", lanes), 5)
	r, trials := floodRig(t, lanes)
	victim := trials[len(trials)-1]
	floods := startFloods(t, r, trials, 2*time.Minute, 10*time.Millisecond)
	line := ordinaryCalls(t, r, victim, 24, 2*time.Minute)
	var report []string
	for _, f := range floods {
		f.stdin.Close()
	}
	for i, f := range floods {
		l, ok := f.next("flood ", time.Minute)
		if !ok {
			t.Fatalf("lane %d's flood ended without its report", i+1)
		}
		report = append(report, l)
		// The flood was real: its connects and execs went through.
		if !strings.Contains(l, " connect=") || !strings.Contains(l, " exec=") {
			t.Errorf("lane %d did not flood (no connect or exec went through): %s", i+1, l)
		}
	}
	t.Logf("floods:\n%s", strings.Join(report, "\n"))
	if field(t, line, "errors") != 0 || field(t, line, "ok") != 24 {
		t.Fatalf("lane %d's ordinary calls under %d lanes' flood: %s", victim.Lane, len(floods), line)
	}
	out, stderr, code := r.Thermite("trial", "list", "--json")
	var list []struct {
		ID, State string
	}
	if code != 0 {
		t.Fatalf("trial list: %s", stderr)
	}
	testrig.JSON(t, out, &list)
	for _, tr := range list {
		if tr.ID == victim.ID && tr.State != "open" {
			t.Fatalf("lane %d's trial after the flood: %s, want open", victim.Lane, tr.State)
		}
	}
	t.Logf("lane %d: %s", victim.Lane, line)
}
