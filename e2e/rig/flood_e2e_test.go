package rig

import (
	"fmt"
	"runtime"
	"strconv"
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
// Before the flood, every other lane's agent holds all its token may of
// request bodies (two of 16 MiB, withheld their last byte) on a rig whose
// api.max_inflight_bytes is 16 MiB a lane: the last lane's calls go
// through on its own share. Throughout, a process of the last lane's
// agent that ended is left unreaped (a zombie, whose table only root may
// read): it hides nothing, and the disk checks must not end the trial
// for it. It asserts errors, never timings (BenchmarkFlood measures those).
func TestLanesFloodingEveryPathLeaveTheSixteenthServed(t *testing.T) {
	testrig.RequireRoot(t)
	lanes := 16
	if runtime.NumCPU() < 8 {
		lanes = 5
	}
	lanes = max(envOr("THERMITE_FLOOD_LANES", lanes), 5)
	r, trials := floodRigWith(t, lanes, testrig.Options{Lanes: lanes, Alone: true, APIExtra: fmt.Sprintf("max_inflight_bytes = %d\n", lanes*16<<20)})
	victim := trials[len(trials)-1]
	zombie := startAs(t, r, "agent-"+strconv.Itoa(victim.Lane), "exit")
	defer zombie.cmd.Wait()

	var holders []*roleProc
	for _, tr := range trials[:len(trials)-1] {
		h := startAs(t, r, "agent-"+strconv.Itoa(tr.Lane), "withheld", "ATTACK_SOCKET="+tr.APISocket, "ATTACK_TOKEN="+tokenOf(t, tr),
			"ATTACK_PATH=/v1/fs/write", "ATTACK_N=2", "ATTACK_LEN="+strconv.Itoa(16<<20))
		t.Logf("lane %d's agent: %s", tr.Lane, h.expect("withheld ", time.Minute))
		holders = append(holders, h)
	}
	held := ordinaryCalls(t, r, victim, 8, 2*time.Minute)
	for _, h := range holders {
		h.stop()
	}
	if field(t, held, "errors") != 0 {
		t.Fatalf("lane %d's ordinary calls while %d lanes hold all the bodies their tokens may: %s", victim.Lane, len(holders), held)
	}

	floods := startFloods(t, r, trials, 2*time.Minute, floodPaths{pause: 10 * time.Millisecond})
	line := ordinaryCalls(t, r, victim, 24, 2*time.Minute)
	report := floods.stop(t)
	if len(report) != len(floods.procs) {
		t.Fatalf("%d of %d lanes' floods ended with their report", len(report), len(floods.procs))
	}
	for i, l := range report {
		// The flood was real: its connects and execs went through.
		if !strings.Contains(l, " connect=") || !strings.Contains(l, " exec=") {
			t.Errorf("lane %d did not flood (no connect or exec went through): %s", i+1, l)
		}
	}
	t.Logf("floods:\n%s", strings.Join(report, "\n"))
	if field(t, line, "errors") != 0 || field(t, line, "ok") != 24 {
		t.Fatalf("lane %d's ordinary calls under %d lanes' flood: %s", victim.Lane, len(floods.procs), line)
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
