package rig

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"thermite/controller/ledger"
	"thermite/internal/testrig"
)

// spinKit imports a kit that needs no compiler: its build writes a shell
// loop of n steps, its run runs it repeats times, its check scores 1. It
// returns a stored build of it.
func spinKit(tb testing.TB, r *testrig.Rig, n, repeats int) ledger.Build {
	tb.Helper()
	dir := filepath.Join(r.Dir, "kit-spin")
	os.MkdirAll(dir, 0o755)
	manifest := `name = "spin"
[build]
command = ["sh", "-c", "printf 'i=0; while [ $i -lt ` + strconv.Itoa(n) + ` ]; do i=$((i+1)); done\n' > spin.sh"]
outputs = ["spin.sh"]
[run]
command = ["sh", "{build}/spin.sh"]
repeats = ` + strconv.Itoa(repeats) + `
[check]
command = ["sh", "-c", "echo '{\"score\": 1}'"]
`
	os.WriteFile(filepath.Join(dir, "kit.toml"), []byte(manifest), 0o644)
	if _, stderr, code := r.Thermite("kit", "import", dir); code != 0 {
		tb.Fatalf("kit import: %s", stderr)
	}
	proj := filepath.Join(r.Dir, "spin-project")
	os.MkdirAll(proj, 0o755)
	os.WriteFile(filepath.Join(proj, "README"), []byte("spin\n"), 0o644)
	return judgeBuildOf(tb, r, "spin", proj)
}

// judgeBuildOf is judgeBuild for a test or a benchmark.
func judgeBuildOf(tb testing.TB, r *testrig.Rig, kitName, project string) ledger.Build {
	tb.Helper()
	out, stderr, code := r.Thermite("judge", "build", "--kit", kitName, "--project", project, "--json")
	if code != 0 {
		tb.Fatalf("judge build: exit %d\n%s", code, stderr)
	}
	var b ledger.Build
	testrig.JSON(tb, out, &b)
	return b
}

// judgeTime times a stored build of kit once.
func judgeTime(tb testing.TB, r *testrig.Rig, build, kitName string) ledger.TimedRun {
	tb.Helper()
	out, stderr, code := r.Thermite("judge", "time", build, "--kit", kitName, "--json")
	if code != 0 {
		tb.Fatalf("judge time: exit %d %s", code, stderr)
	}
	var tr ledger.TimedRun
	testrig.JSON(tb, out, &tr)
	if tr.Status != "scored" {
		tb.Fatalf("judge time: %+v", tr)
	}
	return tr
}

// TestLaneExecStormLeavesTheJudgesTimedRunFirst: three lanes' agents each
// run their api.max_runs_per_lane of /bin/true execs at once, in a loop,
// so that the broker's starts (one at a time) always have lanes' starts
// waiting. The judge then times a build, five repeats: each repeat's
// start had no other role's start go before it while it waited (the
// judge's starts go first), and the broker's counts say the judge's
// starts did wait (the storm was real: lanes' starts were under way and
// queued) yet none was behind a lane's. Ordering facts only: no time is
// asserted.
func TestLaneExecStormLeavesTheJudgesTimedRunFirst(t *testing.T) {
	const lanes = 3
	r := testrig.New(t, testrig.Options{Lanes: lanes})
	b := spinKit(t, r, 2000, 5)
	p := makeProject(t, r)
	var storms []*roleProc
	for lane := 1; lane <= lanes; lane++ {
		info, _ := startTrial(t, r, lane, p)
		s := startAs(t, r, "agent-"+strconv.Itoa(lane), "exec-storm", "ATTACK_SOCKET="+info.APISocket, "ATTACK_TOKEN="+tokenOf(t, info), "ATTACK_N="+strconv.Itoa(r.Cfg.API.MaxRunsPerLane))
		s.expect("storming", time.Minute)
		storms = append(storms, s)
	}
	// The storm is under way once lanes' starts queue behind each other.
	for deadline := time.Now().Add(2 * time.Minute); r.Status().Starts.MostWaiting < 2; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the lanes' storm never queued two starts at the broker: %+v", r.Status().Starts)
		}
	}
	before := r.Status().Starts
	tr := judgeTime(t, r, b.ID, "spin")
	after := r.Status().Starts
	for _, s := range storms {
		s.stdin.Close()
	}
	for i, s := range storms {
		l := s.expect("exec-storm ", time.Minute)
		t.Logf("lane %d: %s", i+1, l)
		if field(t, l, "ok") == 0 || field(t, l, "errors") != 0 {
			t.Errorf("lane %d's storm: %s, want execs that went through and no errors", i+1, l)
		}
	}
	t.Logf("the broker's starts during the timed run: before %+v, after %+v", before, after)
	for i, rep := range tr.Repeats {
		if rep.StartsAhead != 0 {
			t.Errorf("repeat %d of the timed run waited while %d starts of other roles went first (%d µs from its Run to its start)", i+1, rep.StartsAhead, rep.StartWaitNS/1000)
		}
	}
	if n := after.JudgeBehind - before.JudgeBehind; n != 0 {
		t.Errorf("%d of the judge's starts saw a lane's start go first", n)
	}
	if after.JudgeWaited == before.JudgeWaited || after.Waited-before.Waited < 10 {
		t.Fatalf("the judge's starts never waited, or few starts did (%d): the storm proves nothing; before %+v after %+v", after.Waited-before.Waited, before, after)
	}
	if len(tr.Repeats) != 5 {
		t.Fatalf("the timed run has %d repeats, want 5", len(tr.Repeats))
	}
}
