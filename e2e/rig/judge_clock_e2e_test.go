package rig

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"thermite/controller/ledger"
	"thermite/internal/testrig"
	"thermite/internal/weaken"
)

// TestJudgeClockStartsAtExecve: in a test build whose start spends 300 ms
// of CPU and 300 ms asleep before each exec, a trivial candidate's every
// repeat is measured from its execve: wall and CPU time both well under
// the start's 300 ms, stored per repeat, and given to the check (which
// scores 0 unless it sees one wall time and one CPU time per repeat).
func TestJudgeClockStartsAtExecve(t *testing.T) {
	r := testrig.New(t, testrig.Options{Tags: "thermite_weaken", Env: []string{"THERMITE_WEAKEN=" + weaken.SlowStart}})
	importKit(t, r, "clock", `name = "clock"
[build]
command = ["sh", "-c", "echo x > x"]
outputs = ["x"]
[run]
command = ["true"]
repeats = 3
[check]
command = ["sh", "-c", "set -- $THERMITE_WALL_NS; w=$#; set -- $THERMITE_CPU_NS; if [ $w -eq 3 ] && [ $# -eq 3 ]; then echo '{\"score\": 1}'; else echo '{\"score\": 0}'; fi"]
`, nil)
	proj := filepath.Join(r.Dir, "p-clock")
	os.MkdirAll(proj, 0o755)
	b := judgeBuild(t, r, "clock", proj)
	start := time.Now()
	out, stderr, code := r.Thermite("judge", "time", b.ID, "--kit", "clock", "--json")
	took := time.Since(start)
	if code != 0 {
		t.Fatalf("judge time: exit %d: %s", code, stderr)
	}
	var tr ledger.TimedRun
	testrig.JSON(t, out, &tr)
	if tr.PublicScore == nil || *tr.PublicScore != 1 {
		t.Fatalf("the check was not given a wall and a CPU time per repeat: %+v", tr)
	}
	// The control: the slow start really ran before each repeat.
	if took < 3*600*time.Millisecond {
		t.Fatalf("judge time took %v for 3 repeats; the slow start did not run", took)
	}
	// The slow start's own: 150 ms of CPU, 600 ms of wall time in all.
	const startCPU, startWall = 150 * time.Millisecond, 600 * time.Millisecond
	for i, rep := range tr.Repeats {
		if rep.WallNS <= 0 || time.Duration(rep.WallNS) >= startWall {
			t.Errorf("repeat %d: wall %v, want from the candidate's execve (under the start's %v)", i+1, time.Duration(rep.WallNS), startWall)
		}
		if cpu := time.Duration(rep.UserNS + rep.SysNS); cpu >= startCPU {
			t.Errorf("repeat %d: CPU %v, want the candidate's alone (under the start's %v)", i+1, cpu, startCPU)
		}
	}
	if len(tr.Repeats) != 3 {
		t.Fatalf("repeats %+v", tr.Repeats)
	}
}
