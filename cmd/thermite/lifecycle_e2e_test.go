package main

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"thermite/internal/testrig"
)

// traceMeThenStop asks for PTRACE_TRACEME (ptrace is system call 101 on
// x86_64), prints what it got, then stops itself: the way amicontained
// probes, and the way a command made the broker its tracer.
const traceMeThenStop = `my $r = syscall(101, 0, 0, 0, 0); print(($r == -1 ? "errno=" . ($! + 0) : "traceme=ok"), "\n"); $| = 1; kill "STOP", $$; print "resumed\n";`

// runStopped runs argv as role through run-as with a 2 s timeout and
// checks the end is real: exit 124 (the timeout) no sooner than the
// timeout, and no process of the role left where it should not be.
func runStopped(t *testing.T, r *testrig.Rig, role string, argv ...string) string {
	t.Helper()
	began := time.Now()
	out, stderr, code := r.RunAs(role, []string{"--timeout", "2s"}, argv...)
	took := time.Since(began)
	if code != 124 || !strings.Contains(stderr, "timed out") {
		t.Errorf("%s: exit %d after %s, want 124 (timed out)\n%s%s", role, code, took.Round(time.Millisecond), out, stderr)
	}
	if took < 2*time.Second {
		t.Errorf("%s: the command counted as ended after %s, before its 2 s timeout", role, took)
	}
	if strings.Contains(out, "resumed") {
		t.Errorf("%s: the stopped command went on: %q", role, out)
	}
	return out
}

// A command that stops itself, traced or not, or stops what it forked, is
// killed at its timeout and reported as timed out; nothing of it remains
// (a lane's own command is killed too; only what it leaves running lives
// until the trial's end).
func TestStoppedCommandEndsAtItsTimeout(t *testing.T) {
	if _, err := lookPerl(); err != nil {
		t.Skip("needs perl (Debian's perl-base) to call ptrace")
	}
	r := newRig(t)
	for _, role := range []string{"builder", "lane-1"} {
		t.Run(role+" traced", func(t *testing.T) {
			out := runStopped(t, r, role, "perl", "-e", traceMeThenStop)
			if !strings.Contains(out, "errno=1") {
				t.Errorf("PTRACE_TRACEME as %s: %q, want errno=1 (EPERM): the broker must never become a tracer of role code", role, out)
			}
			if p := r.Procs(role); len(p) != 0 {
				t.Errorf("%s still runs %v after its command's timeout", role, p)
			}
		})
		t.Run(role+" stops itself", func(t *testing.T) {
			runStopped(t, r, role, "sh", "-c", "kill -STOP $$; echo resumed")
			if p := r.Procs(role); len(p) != 0 {
				t.Errorf("%s still runs %v after its command's timeout", role, p)
			}
		})
	}
	t.Run("builder stops its children", func(t *testing.T) {
		runStopped(t, r, "builder", "sh", "-c", "sleep 300 & kill -STOP $!; kill -STOP $$")
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
