package rig

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"thermite/controller/ledger"
	"thermite/internal/cpuset"
	"thermite/internal/testrig"
)

// sleepKit imports a kit whose candidate runs cmd (a shell line) and
// stores a build for it; cards is the kit's run.cards.
func sleepKit(t *testing.T, r *testrig.Rig, name, cmd string, cards int) ledger.Build {
	t.Helper()
	importKit(t, r, name, `name = "`+name+`"
[build]
command = ["sh", "-c", "echo x > x"]
outputs = ["x"]
[run]
command = ["sh", "-c", `+strconv.Quote(cmd)+`]
repeats = 1
cards = `+strconv.Itoa(cards)+`
[check]
command = ["sh", "-c", "echo '{\"score\": 1}'"]
`, nil)
	proj := filepath.Join(r.Dir, "p-"+name)
	os.MkdirAll(proj, 0o755)
	return judgeBuild(t, r, name, proj)
}

// allowedCPUs is a process's Cpus_allowed_list, "" when it is gone.
func allowedCPUs(pid int) string {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// waitHold waits until the timing user runs something, and returns its
// pids.
func waitHold(t *testing.T, r *testrig.Rig, role string, done <-chan ledger.TimedRun) []int {
	t.Helper()
	var pids []int
	if !waitFor(20*time.Second, func() bool { pids = r.Procs(role); return len(pids) > 0 }) {
		t.Fatalf("no timed run started as %s: %+v", role, <-done)
	}
	return pids
}

// affinityAs runs the probe's affinity attempt as role: what
// sched_setaffinity(cpus) answered, and the CPUs the probe may run on after.
func affinityAs(t *testing.T, r *testrig.Rig, role, cpus string) (got, after string) {
	t.Helper()
	out, stderr, code := r.RunAs(role, nil, r.Bin, "__probe", "try", "affinity", cpus)
	if code != 0 {
		t.Fatalf("affinity probe as %s: exit %d: %s", role, code, stderr)
	}
	return strings.TrimSpace(out), strings.TrimSpace(stderr)
}

// TestLaneMovesOntoHeldJudgeCPURefused: during a timed run, a lane command
// that asks sched_setaffinity for the held judge CPU gets EINVAL, and one
// that asks for every CPU is left off the held one; after the run it may
// use the judge CPU again.
func TestLaneMovesOntoHeldJudgeCPURefused(t *testing.T) {
	r := newRig(t)
	judge, _ := r.Cfg.JudgeCPUSet()
	b := sleepKit(t, r, "slow", "sleep 4", 0)
	done := startTime(t, r, b.ID, "slow")
	waitHold(t, r, "run", done)
	if got, after := affinityAs(t, r, "lane-1", judge.String()); got != "EINVAL" {
		t.Errorf("lane-1 moves onto held judge CPU %s: %s (CPUs after: %s), want EINVAL", judge, got, after)
	}
	online := "0-" + strconv.Itoa(nCPU()-1)
	got, after := affinityAs(t, r, "lane-1", online)
	if got != "ok" || strings.Contains(","+after+",", ","+judge.String()+",") || after == online {
		t.Errorf("lane-1 asks for %s during the hold: %s, runs on %s; want ok without judge CPU %s", online, got, after, judge)
	}
	if tr := <-done; tr.Status != "scored" {
		t.Fatalf("run: %+v", tr)
	}
	if got, after := affinityAs(t, r, "lane-1", judge.String()); got != "ok" || after != judge.String() {
		t.Errorf("after the run, lane-1 onto %s: %s (%s), want ok", judge, got, after)
	}
}

// nCPU is how many CPUs this test may use.
func nCPU() int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return 1
	}
	return set.Count()
}

// TestLaneStartedBeforeHoldMovedOffJudgeCPU: a lane process that was
// running on every CPU before a timed run began is moved off the held
// judge CPU while the run holds it, and may use it again afterwards.
func TestLaneStartedBeforeHoldMovedOffJudgeCPU(t *testing.T) {
	r := newRig(t)
	judge, _ := r.Cfg.JudgeCPUSet()
	out, stderr, code := r.RunAs("lane-1", nil, "sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!")
	if code != 0 {
		t.Fatalf("lane-1 background sleep: %s", stderr)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(out))
	defer syscall.Kill(pid, syscall.SIGKILL)
	before := allowedCPUs(pid)
	if !strings.Contains(before, "-") && before != judge.String() {
		t.Fatalf("the lane process runs on %s before the hold; the test needs it on the judge CPU %s too", before, judge)
	}
	b := sleepKit(t, r, "slow", "sleep 3", 0)
	done := startTime(t, r, b.ID, "slow")
	waitHold(t, r, "run", done)
	during := allowedCPUs(pid)
	if during == "" || during == before || strings.Contains(","+during+",", ","+judge.String()+",") {
		t.Errorf("lane process started before the hold: on %s before, %s during the hold of %s; want it moved off", before, during, judge)
	}
	if tr := <-done; tr.Status != "scored" {
		t.Fatalf("run: %+v", tr)
	}
	if after := allowedCPUs(pid); after != before {
		t.Errorf("after the run the lane process runs on %s, want %s again", after, before)
	}
}

// TestCandidateWidensAffinityRefused: the candidate asks (taskset) for
// every CPU; it still runs only on its own judge CPU, and the run scores.
func TestCandidateWidensAffinityRefused(t *testing.T) {
	if _, err := os.Stat("/usr/bin/taskset"); err != nil {
		t.Skip("needs taskset (util-linux)")
	}
	r := newRig(t)
	judge, _ := r.Cfg.JudgeCPUSet()
	online := "0-" + strconv.Itoa(nCPU()-1)
	b := sleepKit(t, r, "widen", "taskset -pc "+online+" $$ >/dev/null && exec sleep 3", 0)
	done := startTime(t, r, b.ID, "widen")
	var seen []string
	waitFor(20*time.Second, func() bool {
		for _, p := range r.Procs("run") {
			if comm, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p), "comm")); strings.TrimSpace(string(comm)) == "sleep" {
				seen = append(seen, allowedCPUs(p))
				return true
			}
		}
		return false
	})
	tr := <-done
	if tr.Status != "scored" {
		t.Fatalf("run (taskset must succeed, cut to the cpuset): %+v", tr)
	}
	if len(seen) == 0 || seen[0] != judge.String() {
		t.Fatalf("candidate after asking for %s runs on %v, want only %s", online, seen, judge)
	}
}

// TestTwoCardsTimedRunsGetDisjointCPUs: with two cards and judge CPUs 0-1,
// card 0's timed run runs on CPU 0 and card 1's on CPU 1, at the same
// time, each held in its cpuset.
func TestTwoCardsTimedRunsGetDisjointCPUs(t *testing.T) {
	if nCPU() < 2 {
		t.Skip("needs two CPUs")
	}
	r := testrig.New(t, testrig.Options{GPUs: 2, TimingUsers: 2, Extra: "judge_cpus = \"0-1\"\nstartup_selftest = \"warn\"\n"})
	b := sleepKit(t, r, "card", "exec sleep 3", 1)
	var runs [2]<-chan ledger.TimedRun
	for card := range runs {
		ch := make(chan ledger.TimedRun, 1)
		runs[card] = ch
		go func() {
			out, stderr, code := r.Thermite("judge", "time", b.ID, "--kit", "card", "--card", strconv.Itoa(card), "--json")
			var tr ledger.TimedRun
			if code != 0 {
				tr.Status, tr.Error = "judge time failed", stderr
			} else {
				testrig.JSON(t, out, &tr)
			}
			ch <- tr
		}()
	}
	got := map[string]string{}
	waitFor(20*time.Second, func() bool {
		for _, role := range []string{"run", "run-2"} {
			for _, p := range r.Procs(role) {
				if comm, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p), "comm")); strings.TrimSpace(string(comm)) == "sleep" {
					got[role] = allowedCPUs(p)
				}
			}
		}
		return len(got) == 2
	})
	for card, ch := range runs {
		tr := <-ch
		if tr.Status != "scored" {
			t.Fatalf("card %d: %+v", card, tr)
		}
		if want := strconv.Itoa(card); tr.CPUs != want {
			t.Errorf("card %d's timed run on CPUs %q, want %s", card, tr.CPUs, want)
		}
	}
	if got["run"] != "0" || got["run-2"] != "1" {
		t.Errorf("candidates at once: card 0 on %q, card 1 on %q; want 0 and 1", got["run"], got["run-2"])
	}
}

// TestCardWithoutJudgeCPURefused: two cards but one judge CPU: card 1's
// timed run is refused with the layout named.
func TestCardWithoutJudgeCPURefused(t *testing.T) {
	r := testrig.New(t, testrig.Options{GPUs: 2, TimingUsers: 2, Extra: "judge_cpus = \"1\"\n"})
	b := sleepKit(t, r, "card", "true", 1)
	_, stderr, code := r.Thermite("judge", "time", b.ID, "--kit", "card", "--card", "1", "--json")
	if code == 0 || !strings.Contains(stderr, "card 1 has no judge CPU of its own") {
		t.Fatalf("card 1 with one judge CPU: exit %d %q", code, stderr)
	}
}

// TestTimedRunKeepsTheControllerOffItsCPUs: the controller daemon, busy
// with lanes' calls, must not run on the CPU a timed repeat holds: every
// one of its threads is moved off it while the hold lasts (as every
// role's processes are), and may use it again afterwards.
func TestTimedRunKeepsTheControllerOffItsCPUs(t *testing.T) {
	r := newRig(t)
	judge, _ := r.Cfg.JudgeCPUSet()
	ctl := r.Status().ControllerPID
	threads := func() map[string]string {
		out := map[string]string{}
		tasks, _ := os.ReadDir(filepath.Join("/proc", strconv.Itoa(ctl), "task"))
		for _, e := range tasks {
			tid, _ := strconv.Atoi(e.Name())
			if cpus := allowedCPUs(tid); cpus != "" {
				out[e.Name()] = cpus
			}
		}
		return out
	}
	onJudge := func(cpus string) bool {
		s, err := cpuset.Parse(cpus)
		return err != nil || s.Intersects(judge)
	}
	for tid, cpus := range threads() {
		if !onJudge(cpus) {
			t.Fatalf("before any hold, controller thread %s runs on %s, off judge CPU %s: the test proves nothing", tid, cpus, judge)
		}
	}
	b := sleepKit(t, r, "slow", "sleep 3", 0)
	done := startTime(t, r, b.ID, "slow")
	waitHold(t, r, "run", done)
	during := threads()
	if len(during) == 0 {
		t.Fatalf("no thread of the controller (pid %d) found", ctl)
	}
	for tid, cpus := range during {
		if onJudge(cpus) {
			t.Errorf("during the hold of judge CPU %s, controller thread %s may run on %s", judge, tid, cpus)
		}
	}
	if tr := <-done; tr.Status != "scored" {
		t.Fatalf("run: %+v", tr)
	}
	for tid, cpus := range threads() {
		if !onJudge(cpus) {
			t.Errorf("after the run, controller thread %s runs on %s, still off judge CPU %s", tid, cpus, judge)
		}
	}
}
