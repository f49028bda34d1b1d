package rig

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"thermite/controller"
	"thermite/internal/testrig"
)

// trialDisk is a trial's record and disk state as `trial list` has them.
func trialDisk(t *testing.T, r *testrig.Rig, id string) controller.TrialStatus {
	t.Helper()
	out, _, _ := r.Thermite("trial", "list", "--json")
	var ts []controller.TrialStatus
	if err := json.Unmarshal([]byte(out), &ts); err != nil {
		t.Fatalf("trial list: %v %q", err, out)
	}
	for _, s := range ts {
		if s.ID == id {
			return s
		}
	}
	t.Fatalf("no trial %s in the list", id)
	return controller.TrialStatus{}
}

// waitTrial polls until f holds for the trial, or fails naming what
// after 90 s (a liveness bound: parallel tests share the machine).
func waitTrial(t *testing.T, r *testrig.Rig, id, what string, f func(controller.TrialStatus) bool) controller.TrialStatus {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		s := trialDisk(t, r, id)
		if f(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("trial %s: %s did not happen: %+v %+v", id, what, s.Trial, s.Disk)
		}
		time.Sleep(150 * time.Millisecond)
	}
}

// An idle trial's disk check walks nothing (the last walk's figure holds
// while nothing of the lane or agent runs and its file helper changes
// nothing), and each way a lane can grow its folders still ends it at the
// cap: a command, the file API, and a process left running that writes
// later.
func TestIdleTrialDiskCheckReusedButGrowthStillEndsIt(t *testing.T) {
	r := testrig.New(t, testrig.Options{Lanes: 3, Extra: "[trial]\ndisk_check = \"300ms\"\ndisk_cap_mb = 1\n"})
	project := makeProject(t, r)
	over := func(s controller.TrialStatus) bool {
		return s.State != "open" && strings.Contains(s.EndReason, "over its disk limit")
	}
	reused := func(s controller.TrialStatus) bool { return s.Disk != nil && s.Disk.Reused }

	t.Run("a command", func(t *testing.T) {
		info, _ := startTrial(t, r, 1, project)
		waitTrial(t, r, info.ID, "an idle check reusing the last walk", reused)
		r.Thermite("trial", "exec", info.ID, "--", "dd", "if=/dev/zero", "of=big", "bs=1M", "count=3")
		waitTrial(t, r, info.ID, "the end for its disk after a command wrote 3 MiB", over)
	})
	t.Run("the file API", func(t *testing.T) {
		info, a := startTrial(t, r, 2, project)
		waitTrial(t, r, info.ID, "an idle check reusing the last walk", reused)
		if code, _, raw := a.do("POST", "/v1/fs/write", map[string]any{"path": "big", "data": bytes.Repeat([]byte("x"), 3<<20)}); code != 200 {
			t.Fatalf("fs/write: %d %s", code, raw)
		}
		waitTrial(t, r, info.ID, "the end for its disk after the file API wrote 3 MiB", over)
	})
	t.Run("a process left running", func(t *testing.T) {
		info, _ := startTrial(t, r, 3, project)
		waitTrial(t, r, info.ID, "an idle check reusing the last walk", reused)
		if _, stderr, code := r.Thermite("trial", "exec", info.ID, "--", "sh", "-c", "setsid -f sh -c 'sleep 2; dd if=/dev/zero of=late bs=1M count=3' </dev/null >/dev/null 2>&1"); code != 0 {
			t.Fatalf("trial exec: %s", stderr)
		}
		waitTrial(t, r, info.ID, "the end for its disk after a leftover process wrote 3 MiB", over)
	})
}
