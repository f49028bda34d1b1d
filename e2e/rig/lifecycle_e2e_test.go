package rig

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/testrig"
)

// traceMeThenWait asks for PTRACE_TRACEME (ptrace is system call 101 on
// x86_64), prints what it got, then waits as sleep (which runSleeping
// waits for): the way amicontained probes, and the way a command made the
// broker its tracer.
const traceMeThenWait = `my $r = syscall(101, 0, 0, 0, 0); print(($r == -1 ? "errno=" . ($! + 0) : "traceme=ok"), "\n"); $| = 1; exec "sleep", "300";`

// traceMeThenStop is traceMeThenWait stopping itself instead of waiting,
// for a build whose filter lets it.
const traceMeThenStop = `my $r = syscall(101, 0, 0, 0, 0); print(($r == -1 ? "errno=" . ($! + 0) : "traceme=ok"), "\n"); $| = 1; kill "STOP", $$; print "resumed\n";`

// runStopped runs argv as role through run-as with a 3 s timeout while
// this test, as root, stops every process of the role once n of them run
// sleep (no role may send a stop signal itself: the filter refuses it), and
// checks the end is real: exit 124 (the timeout) no sooner than the
// timeout, with each process seen stopped before it.
func runStopped(t *testing.T, r *testrig.Rig, role string, n int, argv ...string) string {
	t.Helper()
	stopped := make(chan string, 1)
	go func() { stopped <- stopFromOutside(r, role, n, 3*time.Second) }()
	began := time.Now()
	out, stderr, code := r.RunAs(role, []string{"--timeout", "3s"}, argv...)
	took := time.Since(began)
	if why := <-stopped; why != "" {
		t.Errorf("%s: %s", role, why)
	}
	if code != 124 || !strings.Contains(stderr, "timed out") {
		t.Errorf("%s: exit %d after %s, want 124 (timed out)\n%s%s", role, code, took.Round(time.Millisecond), out, stderr)
	}
	if took < 3*time.Second {
		t.Errorf("%s: the command counted as ended after %s, before its 3 s timeout", role, took)
	}
	return out
}

// stopFromOutside waits (up to within) until role runs n processes of
// sleep, sends each SIGSTOP as root, and sees each stopped (state T); ""
// when it did.
func stopFromOutside(r *testrig.Rig, role string, n int, within time.Duration) string {
	deadline := time.Now().Add(within)
	sleeping := func() []int {
		var out []int
		for _, pid := range r.Procs(role) {
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "sleep" {
				out = append(out, pid)
			}
		}
		return out
	}
	var pids []int
	for pids = sleeping(); len(pids) < n; pids = sleeping() {
		if time.Now().After(deadline) {
			return fmt.Sprintf("%d processes of sleep (%v) within %s, want %d to stop", len(pids), pids, within, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, pid := range pids {
		if err := unix.Kill(pid, unix.SIGSTOP); err != nil {
			return fmt.Sprintf("SIGSTOP to %d: %v", pid, err)
		}
	}
	for _, pid := range pids {
		for !procStopped(pid) {
			if time.Now().After(deadline) {
				return fmt.Sprintf("process %d never seen stopped", pid)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	return ""
}

// procStopped says whether process pid is stopped (state T in /proc/PID/stat).
func procStopped(pid int) bool {
	f, err := statFields(pid)
	return err == nil && f[0] == "T"
}

// A command that is stopped, traced or not, with what it forked, is killed
// at its timeout and reported as timed out; nothing of it remains (a
// lane's own command is killed too; only what it leaves running lives
// until the trial's end). No role may stop a process itself (the filter
// refuses every stop signal: TestLaneStoppingItsOwnProcessesRefused), so
// this test stops the command as root from outside, as a stop by its user
// where the filter did not hold would.
func TestStoppedCommandEndsAtItsTimeout(t *testing.T) {
	if _, err := lookPerl(); err != nil {
		t.Skip("needs perl (Debian's perl-base) to call ptrace")
	}
	// Alone: each command must be seen stopped within its 3 s timeout.
	r := aloneRig(t)
	for _, role := range []string{"builder", "lane-1"} {
		t.Run(role+" traced", func(t *testing.T) {
			out := runStopped(t, r, role, 1, "perl", "-e", traceMeThenWait)
			if !strings.Contains(out, "errno=1") {
				t.Errorf("PTRACE_TRACEME as %s: %q, want errno=1 (EPERM): the broker must never become a tracer of role code", role, out)
			}
			if p := r.Procs(role); len(p) != 0 {
				t.Errorf("%s still runs %v after its command's timeout", role, p)
			}
		})
		t.Run(role+" stopped", func(t *testing.T) {
			runStopped(t, r, role, 1, "sh", "-c", "exec sleep 300")
			if p := r.Procs(role); len(p) != 0 {
				t.Errorf("%s still runs %v after its command's timeout", role, p)
			}
		})
	}
	t.Run("builder stopped with its children", func(t *testing.T) {
		runStopped(t, r, "builder", 2, "sh", "-c", "sleep 300 & exec sleep 301")
		if p := r.Procs("builder"); len(p) != 0 {
			t.Errorf("builder still runs %v", p)
		}
	})
}

// Behind the filter, the reaper is the second lock: with the filter off (a
// test build), PTRACE_TRACEME makes the broker the command's tracer; the
// broker holds no tracee: at its first stop it is killed, reported as
// traced, not as an exit, and nothing of it remains.
func TestTracedCommandKilledBehindTheFilter(t *testing.T) {
	if _, err := lookPerl(); err != nil {
		t.Skip("needs perl (Debian's perl-base) to call ptrace")
	}
	r := testrig.New(t, testrig.Options{Tags: "thermite_weaken", Env: []string{"THERMITE_WEAKEN=no-landlock"}, Extra: `startup_selftest = "warn"`})
	out, stderr, code := r.RunAs("builder", []string{"--timeout", "20s"}, "perl", "-e", traceMeThenStop)
	if !strings.Contains(out, "traceme=ok") {
		t.Skipf("PTRACE_TRACEME was refused even without the filter (%q): nothing to show here", out)
	}
	if code != 128+9 || !strings.Contains(stderr, "(traced)") || strings.Contains(out, "resumed") {
		t.Errorf("a command that made the broker its tracer: exit %d %q %q, want 137 and (traced)", code, out, stderr)
	}
	if p := r.Procs("builder"); len(p) != 0 {
		t.Errorf("builder still runs %v", p)
	}
	if !strings.Contains(r.LogText(), "stopped under the broker's trace") {
		t.Error("the broker did not log that it found itself a tracer")
	}
}

func lookPerl() (string, error) { return exec.LookPath("perl") }
