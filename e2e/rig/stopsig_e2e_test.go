package rig

import (
	"os"
	"strings"
	"testing"
	"time"

	"thermite/internal/testrig"
	"thermite/internal/weaken"
	"thermite/selftest"
)

// stopsAllowed is o in a thermite_weaken build whose filter lets roles
// send stop signals again (stop-signals), for the tests that prove what
// stands behind that rule (the start's SIGCONT, Landlock's signal scope,
// the helpers' watchers). The self-test's row for the rule fails there,
// so the broker only warns.
func stopsAllowed(o testrig.Options) testrig.Options {
	o.Tags = "thermite_weaken"
	env := "THERMITE_WEAKEN=" + weaken.StopSignals
	var rest []string
	for _, e := range o.Env {
		if w, ok := strings.CutPrefix(e, "THERMITE_WEAKEN="); ok {
			env += "," + w
			continue
		}
		rest = append(rest, e)
	}
	o.Env = append([]string{env}, rest...)
	o.Extra = "startup_selftest = \"warn\"\n" + o.Extra
	return o
}

// TestLaneStoppingItsOwnProcessesRefused: a lane's command tries to stop a
// child of its own, as a lane would stop the broker's starting child or
// stop helper of its user where Landlock cannot scope signals: the
// shell's kill with each stop signal, and the probe's kill, tgkill,
// pidfd_send_signal, rt_sigqueueinfo and F_SETSIG on an O_ASYNC pipe the
// child owns. Each is refused with EPERM, the child is never seen stopped,
// and SIGTERM still ends it.
func TestLaneStoppingItsOwnProcessesRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it starts a broker and role users")
	}
	r := newRig(t)
	// The shell's own kill: each stop signal refused, the child still
	// sleeping, then ended by SIGTERM (wait says 128+15).
	script := `sleep 60 & p=$!
for s in STOP TSTP TTIN TTOU; do
  kill -$s $p 2>/dev/null; e=$?
  sleep 0.2
  st=$(sed 's/.*) //' /proc/$p/stat | cut -d' ' -f1)
  echo "$s exit=$e state=$st"
done
kill -TERM $p; wait $p; echo "term=$?"`
	out, stderr, code := r.RunAs("lane-1", []string{"--timeout", "30s"}, "/bin/sh", "-c", script)
	if code != 0 {
		t.Fatalf("lane-1's shell: exit %d %q %s", code, out, stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 {
		t.Fatalf("lane-1's shell said %q, want a line per signal and term=", out)
	}
	for _, l := range lines[:4] {
		// dash's kill fails with exit 1 (and "Operation not permitted").
		if !strings.Contains(l, "exit=1") || strings.Contains(l, "state=T") {
			t.Errorf("lane-1's shell: %q, want the kill refused and the child not stopped", l)
		}
	}
	if lines[4] != "term=143" {
		t.Errorf("lane-1's shell: %q, want term=143 (its child ended by SIGTERM)", lines[4])
	}
	// Every path that names a signal, through the probe.
	for _, path := range selftest.StopPaths() {
		argv := []string{r.Bin, "__probe", "try", selftest.OpStopChild, path}
		out, stderr, code := r.RunAs("lane-1", nil, argv...)
		if code != 0 || strings.TrimSpace(out) != "EPERM" {
			t.Errorf("lane-1 stopping its own child through %s: exit %d, %q (%s), want EPERM for each stop signal, the child never stopped and ended by SIGTERM", path, code, strings.TrimSpace(out), strings.TrimSpace(stderr))
		}
	}
	if p := r.Procs("lane-1"); len(p) != 0 {
		t.Errorf("lane-1 still runs %v", p)
	}
}

// TestLaneStoppingItsOwnProcessesSeenWithoutTheRule: the same probe in a
// build without the rule (stop-signals) stops its child with each stop
// signal by every path, so the EPERM above is the filter's.
func TestLaneStoppingItsOwnProcessesSeenWithoutTheRule(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it starts a broker and role users")
	}
	r := testrig.New(t, stopsAllowed(testrig.Options{}))
	for _, path := range selftest.StopPaths() {
		t0 := time.Now()
		out, stderr, code := r.RunAs("lane-1", nil, r.Bin, "__probe", "try", selftest.OpStopChild, path)
		t.Logf("%s: %s in %s (%s)", path, strings.TrimSpace(out), time.Since(t0).Round(time.Millisecond), strings.TrimSpace(stderr))
		// The probe's child is in a process group that is not orphaned,
		// so each of the four stops it.
		if code != 0 || !strings.HasPrefix(strings.TrimSpace(out), "stopped its child with SIGSTOP") || strings.Count(stderr, "child stopped") != 4 {
			t.Errorf("without the rule, through %s: exit %d, %q (%s), want its child stopped by each stop signal", path, code, strings.TrimSpace(out), strings.TrimSpace(stderr))
		}
	}
}
