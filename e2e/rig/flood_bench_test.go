package rig

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"thermite/controller"
	"thermite/controller/ledger"
	"thermite/internal/testrig"
)

// floodRigWith is a rig of options o with lanes lanes, each with an open
// trial, for the flood: every lane's trial, in lane order.
func floodRigWith(tb testing.TB, lanes int, o testrig.Options) (*testrig.Rig, []controller.TrialInfo) {
	r := testrig.New(tb, o)
	p := filepath.Join(r.Dir, "project")
	os.MkdirAll(p, 0o755)
	os.WriteFile(filepath.Join(p, "README"), []byte("hello project\n"), 0o644)
	var trials []controller.TrialInfo
	for lane := 1; lane <= lanes; lane++ {
		out, stderr, code := r.Thermite("trial", "start", "--lane", strconv.Itoa(lane), "--project", p, "--json")
		if code != 0 {
			tb.Fatalf("trial start lane %d: %s", lane, stderr)
		}
		var info controller.TrialInfo
		testrig.JSON(tb, out, &info)
		tb.Logf("lane %d: trial %s", lane, info.ID)
		trials = append(trials, info)
	}
	return r, trials
}

// ordinaryCalls runs n of a lane's ordinary calls, as its agent on the
// agent's own socket (a lane's exec ends by stopping what is left of the
// lane's processes: the caller must not be one), and returns the
// helper's line.
func ordinaryCalls(tb testing.TB, r *testrig.Rig, t controller.TrialInfo, n int, within time.Duration) string {
	role := "agent-" + strconv.Itoa(t.Lane)
	v := startAs(tb, r, role, "ordinary", "ATTACK_SOCKET="+t.APISocket, "ATTACK_TOKEN="+tokenOf(tb, t), "ATTACK_N="+strconv.Itoa(n), "ATTACK_MS="+strconv.Itoa(int(within.Milliseconds())))
	l, ok := v.next("ordinary ", within+time.Minute)
	if !ok {
		v.cmd.Wait()
		tb.Fatalf("%s's ordinary calls ended before their report: %v", role, v.cmd.ProcessState)
	}
	v.stop()
	return l
}

// floodPaths says which of a lane's paths startFloods floods, how hard,
// and how its flooders start.
type floodPaths struct {
	// pause is the flooders' pause after each request of each loop (0:
	// none, a real flood).
	pause time.Duration
	// laneSockets floods each lane's own API socket too, as the lane's
	// user, beside its agent's.
	laneSockets bool
	// listed, where set, is a host:port in the rig's agent.egress: each
	// flooding agent also floods its egress proxy with CONNECTs to it and
	// to a host not listed. It needs confined.
	listed string
	// confined starts each flooder as the rig starts a role's command
	// (run-as: its cgroup, its confinement, an agent's own network
	// namespace), as a lane's code runs; else by setuid alone.
	confined bool
}

// floodSet is what startFloods started: each flooding lane's flooders.
type floodSet struct {
	procs []*roleProc
}

// startFloods starts the floods of every lane but the last, and waits
// until all are flooding: on its agent's socket, as the agent, and as
// paths says on its lane's own socket and its agent's egress proxy. Each
// stops when its stdin closes (the test's end) or after limit.
func startFloods(tb testing.TB, r *testrig.Rig, trials []controller.TrialInfo, limit time.Duration, paths floodPaths) *floodSet {
	s := &floodSet{}
	ms := func(d time.Duration) string { return strconv.Itoa(int(d.Milliseconds())) }
	start := func(role string, env ...string) {
		env = append(env, "ATTACK_MS="+ms(limit), "ATTACK_PAUSE_MS="+ms(paths.pause))
		if paths.confined {
			s.procs = append(s.procs, startThroughBroker(tb, r, role, "flood", limit+30*time.Second, env...))
		} else {
			s.procs = append(s.procs, startAs(tb, r, role, "flood", env...))
		}
	}
	for _, t := range trials[:len(trials)-1] {
		lane := strconv.Itoa(t.Lane)
		token := "ATTACK_TOKEN=" + tokenOf(tb, t)
		agent := []string{token, "ATTACK_SOCKET=" + t.APISocket}
		if paths.listed != "" {
			agent = append(agent, "ATTACK_PROXY=127.0.0.1:"+strconv.Itoa(r.Cfg.Agent.EgressPort), "ATTACK_LISTED="+paths.listed, "ATTACK_UNLISTED=127.0.0.1:9")
		}
		start("agent-"+lane, agent...)
		if paths.laneSockets {
			// A lane's socket serves a lane harness run's token alone.
			run := startLaneRun(tb, r, t.ID)
			start("lane-"+lane, "ATTACK_TOKEN="+run.token, "ATTACK_SOCKET="+r.Cfg.RoleAPISocket("lane-"+lane))
		}
	}
	for _, f := range s.procs {
		f.expect("flooding", 2*time.Minute)
	}
	return s
}

// stop stops the floods and returns what each did.
func (s *floodSet) stop(tb testing.TB) []string {
	var report []string
	for _, f := range s.procs {
		f.stdin.Close()
	}
	for _, f := range s.procs {
		if l, ok := f.next("flood ", time.Minute); ok {
			report = append(report, l)
		}
		f.stop()
	}
	return report
}

// listedHost is a TCP server on the host's loopback that accepts and
// closes at once: the host the flood's rig lists in agent.egress, which
// its agents' CONNECTs tunnel to.
func listedHost(tb testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return l.Addr().String()
}

// judgeRound is the judge's work once: a build of the spin kit's project
// and a timed run of build; how long each command took, and the timed
// run.
type judgeRound struct {
	buildMS, timeMS float64
	run             ledger.TimedRun
}

func timeJudge(tb testing.TB, r *testrig.Rig, build string) judgeRound {
	t0 := time.Now()
	judgeBuildOf(tb, r, "spin", filepath.Join(r.Dir, "spin-project"))
	t1 := time.Now()
	tr := judgeTime(tb, r, build, "spin")
	return judgeRound{buildMS: ms(t1.Sub(t0)), timeMS: ms(time.Since(t1)), run: tr}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// startWaits are the most a repeat of tr waited for its start, in µs,
// and the starts of other roles that went before its repeats, all
// together.
func startWaits(tr ledger.TimedRun) (maxUS float64, ahead int) {
	for _, rep := range tr.Repeats {
		maxUS = max(maxUS, float64(rep.StartWaitNS)/1000)
		ahead += rep.StartsAhead
	}
	return maxUS, ahead
}

// BenchmarkFlood is lane 16's ordinary calls (its trial's details, a
// recorded step, an exec of /bin/true, a 4 KiB file write, in turn) and
// the judge's work (a build, then a timed run of 5 repeats) on a rig of
// 16 lanes, idle and then while the other 15 flood every path at once:
// on each agent's socket and each lane's own, connect-and-close loops,
// 40 idle connections, an 8 MiB body withheld its last byte, two execs
// whose output is never read, exec storms, dd with fsync, file writes,
// recorded steps; and on each agent's egress proxy, CONNECT loops to a
// host not listed and to one listed. Each flooder runs as the rig runs a
// role's command (run-as: its cgroup, its confinement, the agent's
// namespace), as a lane's code would. It prints lane 16's p99 idle and
// flooded and their ratio, and fails when the ratio is over 2 or lane 16
// saw any error; and the judge's build and timed run, and its repeats'
// longest wait for their start, idle and flooded, failing when a start of
// another role went before one of the judge's. FLOOD_N sets the calls
// measured (default 100); FLOOD_PAUSE_MS a pause after each request of
// each flooding loop (default 0: none); FLOOD_LANES the rig's lanes
// (default 16).
//
// It prints too how long the controller's and the broker's threads waited
// runnable for a CPU (runQueueWait), which tells a process the scheduler
// starves from one that is busy.
//
// On a machine of two CPUs the 2x bound does not hold. Each flooder's own
// session was an autogroup the kernel weighed as much as the controller's
// (6% of a CPU left to it); the CPU weights (broker.CPUWeight) give the
// controller its share (65-92% of a CPU) and lane 16 no error. What holds
// the rest: the controller is saturated, the flood having no pause (its
// threads wait runnable two to three times as long as they run), and
// serves lane 16's calls among the flood's with no priority of their own;
// the broker's one-at-a-time starts wait on lanes' children that set up
// at their lane's weight; and on a shared machine other sessions take
// their part before the rig's groups share the rest.
//
//	go test ./e2e/rig -run '^$' -bench 'Flood$' -benchtime 1x
func BenchmarkFlood(b *testing.B) {
	n := envOr("FLOOD_N", 100)
	pause := time.Duration(envOr("FLOOD_PAUSE_MS", 0)) * time.Millisecond
	lanes := envOr("FLOOD_LANES", 16)
	listed := listedHost(b)
	r, trials := floodRigWith(b, lanes, testrig.Options{Lanes: lanes, Extra: "\n[agent]\negress = [\"" + listed + "\"]\n"})
	build := spinKit(b, r, 20000, 5)
	victim := trials[len(trials)-1]
	ordinaryCalls(b, r, victim, 40, time.Minute) // warm the controller and the paths
	b.ResetTimer()
	idle := ordinaryCalls(b, r, victim, n, 2*time.Minute)
	judgeIdle := timeJudge(b, r, build.ID)
	floods := startFloods(b, r, trials, 5*time.Minute, floodPaths{pause: pause, laneSockets: true, listed: listed, confined: true})
	ctl, brk := r.Status().ControllerPID, r.Status().BrokerPID
	ctl0, _ := procUsage(ctl)
	brk0, _ := procUsage(brk)
	ctlWait0, brkWait0 := runQueueWait(ctl), runQueueWait(brk)
	t0 := time.Now()
	hit := ordinaryCalls(b, r, victim, n, 3*time.Minute)
	ctl1, _ := procUsage(ctl)
	brk1, _ := procUsage(brk)
	ctlWait, brkWait := runQueueWait(ctl)-ctlWait0, runQueueWait(brk)-brkWait0
	took := time.Since(t0).Seconds()
	ctlCPU, brkCPU := 100*(ctl1-ctl0).Seconds()/took, 100*(brk1-brk0).Seconds()/took
	judgeHit := timeJudge(b, r, build.ID)
	b.StopTimer()
	for _, l := range floods.stop(b) {
		b.Logf("flood: %s", l)
	}
	idle99, hit99 := field(b, idle, "p99"), field(b, hit, "p99")
	errs := field(b, idle, "errors") + field(b, hit, "errors")
	ratio := float64(hit99) / float64(max(idle99, 1))
	var figs benchFigures
	figs.add(float64(field(b, idle, "p50")), "idle-p50-µs")
	figs.add(float64(idle99), "idle-p99-µs")
	figs.add(float64(field(b, hit, "p50")), "flooded-p50-µs")
	figs.add(float64(hit99), "flooded-p99-µs")
	figs.add(ratio, "ratio-p99")
	figs.add(float64(errs), "errors")
	figs.add(float64(pause.Milliseconds()), "pause-ms")
	figs.add(ctlCPU, "ctl-cpu%-flooded")
	figs.add(brkCPU, "broker-cpu%-flooded")
	figs.add(100*ctlWait.Seconds()/took, "ctl-runqueue%-flooded")
	figs.add(100*brkWait.Seconds()/took, "broker-runqueue%-flooded")
	waitIdle, aheadIdle := startWaits(judgeIdle.run)
	waitHit, aheadHit := startWaits(judgeHit.run)
	figs.add(judgeIdle.buildMS, "judge-build-idle-ms")
	figs.add(judgeHit.buildMS, "judge-build-flooded-ms")
	figs.add(judgeIdle.timeMS, "judge-time-idle-ms")
	figs.add(judgeHit.timeMS, "judge-time-flooded-ms")
	figs.add(waitIdle, "judge-wait-idle-µs")
	figs.add(waitHit, "judge-wait-flooded-µs")
	figs.add(float64(aheadIdle+aheadHit), "judge-starts-ahead")
	fmt.Printf("lane 16's ordinary calls (%d), %d lanes flooding every path (pause %s): idle p99 %d µs; flooded p99 %d µs; ratio %.2f (aim <= 2); errors %d (aim 0)\n  idle:    %s\n  flooded: %s\n",
		n, lanes-1, pause, idle99, hit99, ratio, errs, idle, hit)
	fmt.Printf("  while lane 16 called under the flood, the controller used %.0f%% of a CPU, the broker %.0f%% (of %d CPUs); their threads waited runnable for a CPU %.0f%% and %.0f%% of the time, all together\n", ctlCPU, brkCPU, runtime.NumCPU(), 100*ctlWait.Seconds()/took, 100*brkWait.Seconds()/took)
	fmt.Printf("the judge: build %.0f ms idle, %.0f ms flooded (%.2fx); timed run %.0f ms idle, %.0f ms flooded (%.2fx); its repeats' longest wait for their start %.0f µs idle, %.0f µs flooded (%.2fx), other roles' starts ahead of them %d; its median %.2f ms (CV %.1f%%) idle, %.2f ms (CV %.1f%%) flooded\n",
		judgeIdle.buildMS, judgeHit.buildMS, judgeHit.buildMS/judgeIdle.buildMS, judgeIdle.timeMS, judgeHit.timeMS, judgeHit.timeMS/judgeIdle.timeMS,
		waitIdle, waitHit, waitHit/max(waitIdle, 1), aheadIdle+aheadHit,
		ms(time.Duration(judgeIdle.run.MedianWallNS)), judgeIdle.run.CVPercent, ms(time.Duration(judgeHit.run.MedianWallNS)), judgeHit.run.CVPercent)
	figs.report(b, "BenchmarkFlood")
	if errs > 0 {
		b.Errorf("lane 16 saw %d errors: %s", errs, hit)
	}
	if ratio > 2 {
		b.Errorf("lane 16's p99 under the flood is %.2fx its idle p99 (%d µs against %d µs), over the bound of 2x", ratio, hit99, idle99)
	}
	if aheadIdle+aheadHit > 0 {
		b.Errorf("%d starts of other roles went before the judge's timed repeats", aheadIdle+aheadHit)
	}
}

// runQueueWait is how long the threads of pid have waited runnable for a
// CPU, all together (the kernel's schedstat): a process that the
// scheduler's weights starve waits long; one that is slow on its own
// does not.
func runQueueWait(pid int) time.Duration {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	var ns int64
	for _, t := range tasks {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if f := strings.Fields(string(data)); err == nil && len(f) >= 2 {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			ns += n
		}
	}
	return time.Duration(ns)
}

// benchFigures are a benchmark's figures: reported to go test, and
// printed in its benchmark line's form too, since go test prints no line
// for a benchmark that failed one of its bounds and scripts/bench.sh
// reads the figures either way.
type benchFigures struct {
	units  []string
	values []float64
}

func (f *benchFigures) add(v float64, unit string) {
	f.units, f.values = append(f.units, unit), append(f.values, v)
}

func (f *benchFigures) report(b *testing.B, name string) {
	line := name + " 1 0 ns/op"
	for i, u := range f.units {
		b.ReportMetric(f.values[i], u)
		line += fmt.Sprintf(" %g %s", f.values[i], u)
	}
	fmt.Println(line)
}

// envOr is the integer in the environment variable name, or def.
func envOr(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
