package rig

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"thermite/internal/rpc"
	"thermite/internal/testrig"
)

// sweepScanned runs /bin/true as role and returns how many entries the
// set-id sweep after it looked at: the cost every command of the role pays.
func sweepScanned(t *testing.T, r *testrig.Rig, role string) int {
	t.Helper()
	_, stderr, code := r.RunAs(role, []string{"--json"}, "true")
	if code != 0 {
		t.Fatalf("run-as %s: exit %d %s", role, code, stderr)
	}
	var res rpc.RunResult
	line := strings.TrimSpace(stderr)
	if i := strings.LastIndex(line, "\n"); i >= 0 {
		line = line[i+1:]
	}
	if err := json.Unmarshal([]byte(line), &res); err != nil || res.SetID == nil {
		t.Fatalf("run-as %s --json: %v %q", role, err, stderr)
	}
	return res.SetID.Scanned
}

// No cost from history: after trials have come and gone, a command of the
// controller's role and of the lane sweeps what it can write now, not every
// folder it was ever handed (which grew with every trial before).
func TestCommandCostDoesNotGrowWithEndedTrials(t *testing.T) {
	r := newRig(t)
	ctl0, lane0 := sweepScanned(t, r, "thermite"), sweepScanned(t, r, "lane-1")
	project := filepath.Join(testrig.ModuleRoot(), "examples", "projects", "sum")
	for i := 0; i < 3; i++ {
		out, stderr, code := r.Thermite("trial", "start", "--lane", "1", "--project", project, "--json")
		if code != 0 {
			t.Fatalf("trial start: %s", stderr)
		}
		var info struct{ ID string }
		testrig.JSON(t, out, &info)
		if _, stderr, code := r.Thermite("trial", "end", info.ID); code != 0 {
			t.Fatalf("trial end: %s", stderr)
		}
	}
	if ctl := sweepScanned(t, r, "thermite"); ctl != ctl0 {
		t.Errorf("a command of the controller's role sweeps %d entries after 3 ended trials, %d before", ctl, ctl0)
	}
	if lane := sweepScanned(t, r, "lane-1"); lane != lane0 {
		t.Errorf("a lane command sweeps %d entries after 3 ended trials, %d before", lane, lane0)
	}
}
