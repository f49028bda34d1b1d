package rig

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/rpc"
	"thermite/internal/testrig"
	"thermite/internal/weaken"
)

// TestLaneKillingItsStopHelperCannotSurviveItsStop: a role's stop is the
// broker's Go helper, run as the role's own user, doing kill(-1, SIGKILL)
// until nothing of the user is left. A lane leaves behind, in a session
// of its own, a loop of kill(-1, SIGKILL): every process of its user that
// appears, the stop helper included, is killed before it can kill the
// loop. The stop must still end every process of the lane: by the role's
// cgroup (frozen, then killed by root) where there is one, by Landlock's
// signal scoping (the loop's kill(-1) cannot reach the helper, which is
// outside its domain) where the kernel has it.
func TestLaneKillingItsStopHelperCannotSurviveItsStop(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it starts a broker and role users")
	}
	noScope := "[host]\naccept_lost = [\"landlock-scope\"]\n"
	noCgroups := "[cgroup]\nenabled = false\n"
	for _, c := range []struct {
		name, signal string
		opts         testrig.Options
		hole         string
	}{
		{"signals scoped, no cgroups", "KILL", testrig.Options{Extra: noCgroups}, ""},
		{"landlock ABI 5, cgroups", "KILL", oldKernel(5, noScope), ""},
		// A helper stopped by the loop is sent SIGCONT until it has
		// done its kill(-1) (spawn.KeepGoing). The filter refuses every
		// stop signal; the build leaves that rule out (stop-signals) so
		// that the watcher behind it is what this proves.
		{"landlock ABI 5, no cgroups, SIGSTOP", "STOP", stopsAllowed(oldKernel(5, noScope+noCgroups)), ""},
		// Neither protection: the loop killed all five of the broker's
		// helpers before their runtime reached kill(-1), and lived on;
		// the raw child now strikes first, right after its uid switch
		// (spawn.Command.KillUserFirst).
		{"landlock ABI 5, no cgroups, SIGKILL", "KILL", oldKernel(5, noScope+noCgroups), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.hole != "" && os.Getenv("THERMITE_REDTEAM_HOLES") == "" {
				t.Skip(c.hole + " (THERMITE_REDTEAM_HOLES=1 runs it)")
			}
			killStopHelper(t, c.opts, c.signal)
		})
	}
}

func killStopHelper(t *testing.T, opts testrig.Options, signal string) {
	r := testrig.New(t, opts)
	if opts.NoStart {
		if err := r.Start(); err != nil {
			t.Fatal(err)
		}
	} else if st := r.Status(); st.LandlockABI < 6 {
		t.Skipf("needs Landlock ABI 6 (signal scoping); this kernel has %d", st.LandlockABI)
	}
	// Whatever of lane-1 this test left is ended by pid at the end.
	t.Cleanup(func() {
		for _, pid := range r.Procs("lane-1") {
			unix.Kill(pid, unix.SIGKILL)
		}
	})
	// The loop is a shell builtin (no fork): nothing of it is a new
	// process its own kill(-1) would end. The loop may stop or kill the
	// command that leaves it (its timeout ends a stopped one).
	_, stderr, code := r.RunAs("lane-1", []string{"--timeout", "5s"}, "/bin/sh", "-c",
		`setsid /bin/sh -c 'while :; do kill -`+signal+` -1 2>/dev/null; done' </dev/null >/dev/null 2>&1 & echo started`)
	if code != 0 && code != 124 && code != 137 {
		t.Fatalf("lane-1 leaving its loop behind: exit %d %s", code, stderr)
	}
	var left []int
	for range 50 {
		if left = r.Procs("lane-1"); len(left) > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(left) == 0 {
		t.Skip("lane-1's loop did not outlive its command here: nothing to stop")
	}
	type answer struct {
		resp *rpc.Response
		err  error
	}
	stopped := make(chan answer, 1)
	go func() {
		resp, err := rpc.Call(r.Cfg.BrokerSocket(), &rpc.Request{Op: rpc.OpStopUser, StopUser: &rpc.StopUserRequest{Role: "lane-1"}})
		stopped <- answer{resp, err}
	}()
	var a answer
	select {
	case a = <-stopped:
	case <-time.After(5 * time.Minute):
		t.Fatalf("stop lane-1 did not answer in 5 minutes while its loop sends SIG%s to every process of its user", signal)
	}
	err := a.err
	if err == nil && a.resp.Error != "" {
		err = errString(a.resp.Error)
	}
	if pids := r.Procs("lane-1"); len(pids) > 0 {
		t.Fatalf("lane-1's processes %v outlived its stop (stop: %v)", pids, err)
	}
	if err != nil {
		t.Fatalf("stop lane-1: %v", err)
	}
	// The lane runs again afterwards.
	if out, stderr, code := r.RunAs("lane-1", nil, "/bin/echo", "again"); code != 0 || strings.TrimSpace(out) != "again" {
		t.Fatalf("lane-1 after its stop: exit %d %q %s", code, out, stderr)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// TestLaneCrashSignalsToItsOwnStartsLeaveTheBrokerUp: between its uid
// switch and execve the broker's child shares the broker's memory
// (CLONE_VM|CLONE_VFORK). Where Landlock cannot scope signals (ABI 5,
// the loss accepted), a lane may send it a signal whose default action
// dumps core (SIGSEGV, SIGQUIT, SIGABRT, SIGBUS): the dump of a process
// that shares its memory must not take the broker with it (kernels before
// 5.16 ended every process sharing the dumping mm), nor write the
// broker's memory anywhere. The child is not dumpable from its uid switch
// on, so no core is written and only the child ends; the broker goes on
// serving every lane.
func TestLaneCrashSignalsToItsOwnStartsLeaveTheBrokerUp(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it starts a broker and role users")
	}
	r := testrig.New(t, oldKernel(5, "[host]\naccept_lost = [\"landlock-scope\"]\n"))
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, pid := range r.Procs("lane-1") {
			unix.Kill(pid, unix.SIGKILL)
		}
	})
	crasher := make(chan string, 1)
	go func() {
		out, stderr, code := r.RunAs("lane-1", []string{"--timeout", "20s"}, "/bin/sh", "-c",
			`n=0; while [ $n -lt 40000 ]; do kill -SEGV -1 2>/dev/null; kill -QUIT -1 2>/dev/null; kill -ABRT -1 2>/dev/null; kill -BUS -1 2>/dev/null; n=$((n+1)); done; echo "$n"`)
		crasher <- fmt.Sprintf("exit %d, %s %s", code, out, stderr)
	}()
	time.Sleep(300 * time.Millisecond)
	// lane-1's starts, each a child the loop may catch before its exec.
	lane1 := make(chan struct{})
	failed, beforeExec := 0, 0
	go func() {
		defer close(lane1)
		for range 60 {
			if _, stderr, code := r.RunAs("lane-1", []string{"--timeout", "5s"}, "/bin/echo", "started"); code != 0 {
				failed++
				if strings.Contains(stderr, "before its execve") {
					beforeExec++
				}
			}
		}
	}()
	for i := range 25 {
		if out, stderr, code := r.RunAs("lane-2", nil, "/bin/echo", "started"); code != 0 || out != "started\n" {
			t.Fatalf("lane-2 command %d while lane-1 sends crash signals to its own processes: exit %d, %q %q\n%s", i, code, out, stderr, r.LogText())
		}
	}
	<-lane1
	t.Logf("crasher: %s; %d of lane-1's 60 commands ended by its signals, %d of them before their execve", strings.TrimSpace(<-crasher), failed, beforeExec)
	if err, exited := r.WaitExit(0); exited {
		t.Fatalf("the broker exited: %v\n%s", err, r.LogText())
	}
	if out, stderr, code := r.RunAs("lane-1", nil, "/bin/echo", "started"); code != 0 || out != "started\n" {
		t.Fatalf("lane-1 after its crash signals: exit %d, %q %q", code, out, stderr)
	}
	// No core of the broker's memory anywhere lane-1 can read: its HOME,
	// its TMPDIR, the stand-in closed folders.
	for _, d := range []string{filepath.Join(r.Cfg.ScratchDir(), "home", r.Role("lane-1").Name), filepath.Join(r.Cfg.ScratchDir(), "tmp", r.Role("lane-1").Name), filepath.Join(r.Dir, "closed-tmp")} {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "core") {
				t.Errorf("a core file %s/%s", d, e.Name())
			}
		}
	}
}

// TestLaneStoppingItsDiskMeasureCannotHoldIt: a role's disk measure
// counts what its processes keep in unlinked files with the broker's Go
// helper, run as the role's own user while the role's processes run.
// Where Landlock cannot scope signals (ABI 5, the loss accepted), a lane
// that leaves behind a loop of kill(-1, SIGSTOP) stops that helper as soon
// as it appears: the measure must still answer (a helper that cannot
// finish is the lane's doing, and counts as over every cap), never wait
// for ever, which would stop the disk checks of the lane's trial, and so
// its disk cap, for good. The filter refuses every stop signal; the build
// leaves that rule out (stop-signals) so that the measure's own bound is
// what this proves.
func TestLaneStoppingItsDiskMeasureCannotHoldIt(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it starts a broker and role users")
	}
	r := testrig.New(t, stopsAllowed(oldKernel(5, "[host]\naccept_lost = [\"landlock-scope\"]\n")))
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, pid := range r.Procs("lane-1") {
			unix.Kill(pid, unix.SIGKILL)
		}
	})
	_, stderr, code := r.RunAs("lane-1", []string{"--timeout", "5s"}, "/bin/sh", "-c",
		`setsid /bin/sh -c 'while :; do kill -STOP -1 2>/dev/null; done' </dev/null >/dev/null 2>&1 & echo started`)
	if code != 0 && code != 124 {
		t.Fatalf("lane-1 leaving its loop behind: exit %d %s", code, stderr)
	}
	for range 50 {
		if len(r.Procs("lane-1")) > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(r.Procs("lane-1")) == 0 {
		t.Skip("lane-1's loop did not outlive its command here")
	}
	measure := func(role string) chan string {
		done := make(chan string, 1)
		go func() {
			resp, err := rpc.Call(r.Cfg.BrokerSocket(), &rpc.Request{Op: rpc.OpDiskUsage, DiskUsage: &rpc.DiskUsageRequest{Role: role}})
			switch {
			case err != nil:
				done <- err.Error()
			case resp.Error != "":
				done <- resp.Error
			default:
				done <- "ok"
			}
		}()
		return done
	}
	lane1 := measure("lane-1")
	select {
	case got := <-lane1:
		if got == "ok" {
			t.Logf("lane-1's measure answered: the helper got through")
		} else if !strings.Contains(got, "unlinked files of "+r.Role("lane-1").Name) {
			t.Errorf("lane-1's measure: %s, want the measure's failure named", got)
		}
	case <-time.After(90 * time.Second):
		t.Fatalf("lane-1's disk measure did not answer in 90 s while lane-1 stops every process of its user: its helper is held, and so is every later disk check of its trial")
	}
	if got := <-measure("lane-2"); got != "ok" {
		t.Errorf("lane-2's measure: %s", got)
	}
}

// TestSharedRoleLeftoverKillsTheNextLanesCommandRefused: the builder and
// the timing users are shared by every lane's builds and timed runs, and
// what a command of theirs leaves behind is stopped after it. A lane's
// build that leaves a kill(-1, SIGKILL) loop behind must not be alive when
// the next command of that user (another lane's build) starts: either the
// stop ends it, or the next command is refused until a stop does.
func TestSharedRoleLeftoverKillsTheNextLanesCommandRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it starts a broker and role users")
	}
	noScope := "[host]\naccept_lost = [\"landlock-scope\"]\n"
	noCgroups := "[cgroup]\nenabled = false\n"
	for _, c := range []struct {
		name string
		opts testrig.Options
		hole string
	}{
		{"landlock ABI 5, cgroups", oldKernel(5, noScope), ""},
		// The loop outlives its stop (the stop's own hole, see
		// TestLaneKillingItsStopHelperCannotSurviveItsStop): the next
		// command of the builder is refused (leftoverRefusal), where it
		// started beside the loop and was killed before.
		{"landlock ABI 5, no cgroups", oldKernel(5, noScope+noCgroups), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.hole != "" && os.Getenv("THERMITE_REDTEAM_HOLES") == "" {
				t.Skip(c.hole + " (THERMITE_REDTEAM_HOLES=1 runs it)")
			}
			sharedLeftover(t, c.opts)
		})
	}
}

func sharedLeftover(t *testing.T, opts testrig.Options) {
	r := testrig.New(t, opts)
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, pid := range r.Procs("builder") {
			unix.Kill(pid, unix.SIGKILL)
		}
	})
	_, stderr, code := r.RunAs("builder", []string{"--timeout", "5s"}, "/bin/sh", "-c",
		`setsid /bin/sh -c 'while :; do kill -KILL -1 2>/dev/null; done' </dev/null >/dev/null 2>&1 & sleep 0.2; echo built`)
	t.Logf("the build that leaves its loop: exit %d %s", code, strings.TrimSpace(stderr))
	out, stderr, code := r.RunAs("builder", nil, "/bin/sh", "-c", "sleep 1; echo built")
	switch {
	case code == 0 && strings.TrimSpace(out) == "built":
		if left := r.Procs("builder"); len(left) > 0 {
			t.Fatalf("the next build ran beside the last one's leftovers %v", left)
		}
	case strings.Contains(stderr, "still runs what its last stop could not end"):
		// Refused before it started: the user still runs a leftover.
		t.Logf("the next build refused: %s", strings.TrimSpace(stderr))
	default:
		t.Fatalf("the next build started beside the last one's leftover and did not finish: exit %d %q %s", code, out, strings.TrimSpace(stderr))
	}
}

// TestLaneStoppingItsOwnStartsDuringAGCCannotStallTheBroker: the start's
// vfork child runs as the role's user until its execve, while the
// broker's thread that cloned it waits in the kernel, not preemptible (it
// is in the runtime's fork section). A garbage collection that begins
// then must stop the world, and waits for that thread; keepGoing, which
// sends the child SIGCONT, is a goroutine too. Where Landlock cannot
// scope signals (ABI 5), a lane stopping its own processes in a loop must
// not catch a child just as a collection begins and so freeze the whole
// broker. GOGC=1 makes the broker collect at nearly every request, and
// lane-1 starts commands eight at a time. The filter refuses every stop
// signal; the build leaves that rule out (stop-signals) so that the start
// path behind it is what this proves.
func TestLaneStoppingItsOwnStartsDuringAGCCannotStallTheBroker(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it starts a broker and role users")
	}
	opts := oldKernel(5, "[host]\naccept_lost = [\"landlock-scope\"]\n")
	opts.Env = append(opts.Env, "GOGC=1")
	opts = stopsAllowed(opts)
	opts.Alone = true // the broker's starts are judged by how long they take
	r := testrig.New(t, opts)
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, pid := range r.Procs("lane-1") {
			unix.Kill(pid, unix.SIGKILL)
		}
	})
	stopper := make(chan string, 1)
	go func() {
		out, stderr, code := r.RunAs("lane-1", []string{"--timeout", "60s"}, "/bin/sh", "-c",
			`end=$(( $(date +%s) + 20 )); n=0; while [ "$(date +%s)" -lt "$end" ]; do i=0; while [ $i -lt 2000 ]; do kill -STOP -1 2>/dev/null; i=$((i+1)); done; n=$((n+2000)); done; echo "$n"`)
		stopper <- fmt.Sprintf("exit %d, %s %s", code, strings.TrimSpace(out), stderr)
	}()
	time.Sleep(500 * time.Millisecond)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 40 {
				r.RunAs("lane-1", []string{"--timeout", "2s"}, "/bin/true")
			}
		}()
	}
	lane2 := make(chan string, 1)
	go func() {
		for i := range 40 {
			if out, stderr, code := r.RunAs("lane-2", nil, "/bin/echo", "started"); code != 0 || out != "started\n" {
				lane2 <- fmt.Sprintf("lane-2 command %d: exit %d, %q %q", i, code, out, stderr)
				return
			}
		}
		lane2 <- ""
	}()
	select {
	case msg := <-lane2:
		if msg != "" {
			t.Fatal(msg)
		}
	case <-time.After(120 * time.Second):
		t.Fatalf("lane-2's commands did not all start and end in 120 s while lane-1 stopped its own starts: the broker is frozen")
	}
	t.Logf("stopper: %s", <-stopper)
	wg.Wait()
}

// TestRolesProcessStoppingAStartDuringAGCCannotFreezeTheBrokerForGood: the
// start's vfork child runs as the role's user until its execve while the
// broker's thread that cloned it waits in the kernel, not preemptible (it
// is in the runtime's fork section), and a garbage collection that begins
// meanwhile waits for that thread to stop the world. keepGoing, which
// sends a stopped child SIGCONT, is a goroutine: it does not run while the
// world is being stopped. A process of the user that stops the child just
// then (kill(-1, SIGSTOP) in a loop, where Landlock cannot scope signals)
// would freeze the whole broker for as long as it likes. The race made
// wide: a thermite_weaken build whose timed runs' starts spend 600 ms
// between the uid switch and execve (slow-start), a process of the timing
// user (started here, outside any Landlock domain, as a process of a role
// whose signals are not scoped would be) stopping every process of its
// user in a loop, and GOGC=1 with lane-2's commands going on throughout,
// so that collections begin while the child is held. Every one of lane-2's
// commands must start and end: the child's own timers (SIGCONT every
// millisecond, SIGKILL at 30 s) bound the freeze, which a stopper on a
// busy machine can still make last up to the SIGKILL. Every role's
// filter now refuses stop signals (seccomp's denyStopSignals), the whole
// fix; the stopper here, started by the test outside any filter, stands
// for a process where that rule would not hold.
func TestRolesProcessStoppingAStartDuringAGCCannotFreezeTheBrokerForGood(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it starts a broker and role users")
	}
	r := testrig.New(t, testrig.Options{Tags: "thermite_weaken", Env: []string{"THERMITE_WEAKEN=" + weaken.SlowStart, "GOGC=1"}, Alone: true})
	run := r.Role("run")
	stopperCmd := exec.Command("/bin/sh", "-c", "while :; do kill -STOP -1 2>/dev/null; done")
	stopperCmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(run.UID), Gid: uint32(run.GID)}, Setsid: true}
	if err := stopperCmd.Start(); err != nil {
		t.Fatal(err)
	}
	reaped := make(chan struct{})
	go func() { stopperCmd.Wait(); close(reaped) }()
	t.Cleanup(func() {
		stopperCmd.Process.Kill()
		<-reaped
	})
	t.Logf("the timing user's processes: %v", r.Procs("run"))
	timed := make(chan string, 1)
	go func() {
		t0 := time.Now()
		out, stderr, code := r.RunAs("run", []string{"--timeout", "30s"}, "/bin/echo", "timed")
		timed <- fmt.Sprintf("exit %d, %q %s, after %s", code, out, strings.TrimSpace(stderr), time.Since(t0).Round(time.Millisecond))
	}()
	for i := 0; ; i++ {
		lane2 := make(chan string, 1)
		go func() {
			out, stderr, code := r.RunAs("lane-2", nil, "/bin/echo", "started")
			if code != 0 || out != "started\n" {
				lane2 <- fmt.Sprintf("exit %d, %q %q", code, out, stderr)
				return
			}
			lane2 <- ""
		}()
		select {
		case msg := <-lane2:
			if msg != "" {
				t.Fatalf("lane-2 command %d: %s", i, msg)
			}
		case <-time.After(60 * time.Second):
			if os.Getenv("THERMITE_REDTEAM_DUMP") != "" {
				dumpBroker(t, r)
			}
			t.Fatalf("lane-2 command %d did not end in 60 s while a process of the timing user stopped a start of its user: the broker is frozen", i)
		}
		select {
		case got := <-timed:
			t.Logf("the timed command, beside %d of lane-2's: %s", i+1, got)
			return
		default:
		}
	}
}

// dumpBroker asks the rig's broker for its goroutines (SIGQUIT) and logs
// what it wrote: where a frozen broker is stuck.
func dumpBroker(t *testing.T, r *testrig.Rig) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !strings.Contains(string(cmdline), "__broker") || !strings.Contains(string(cmdline), r.Config) {
			continue
		}
		var pid int
		fmt.Sscan(e.Name(), &pid)
		unix.Kill(pid, unix.SIGQUIT)
		time.Sleep(3 * time.Second)
		t.Logf("broker %d after SIGQUIT:\n%s", pid, r.LogText())
	}
}
