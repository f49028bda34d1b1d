package rig

import (
	"fmt"
	"os"
	"testing"
	"time"

	"thermite/internal/testrig"
)

// TestLaneStoppingItsOwnStartsCannotStallTheBroker: between its uid
// switch and execve, the broker's vfork child already runs as the role's
// user, and the broker's thread waits in the kernel until it execs. A lane
// that sends SIGSTOP to every process of its user in a tight loop must not
// catch a new command of its own there and hold the broker's start path:
// its next commands, and every other lane's, still start and end. The
// child is in a Landlock domain of its own from before the uid switch, and
// LANDLOCK_SCOPE_SIGNAL keeps the looping command's signals inside its
// own domain (kill(-1) gets EPERM for the child). Every role's filter
// refuses stop signals outright (TestLaneStoppingItsOwnProcessesRefused);
// both cases leave that rule out (stop-signals) so that the stops are
// sent and what stands behind the filter is what this proves.
func TestLaneStoppingItsOwnStartsCannotStallTheBroker(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it starts a broker and role users")
	}
	for _, c := range []struct {
		name string
		opts testrig.Options
	}{
		{"signals scoped", stopsAllowed(testrig.Options{})},
		// A kernel without signal scoping (Landlock ABI 5, the loss
		// accepted): the child is not out of the stopper's reach.
		{"landlock ABI 5", stopsAllowed(oldKernel(5, "[host]\naccept_lost = [\"landlock-scope\"]\n"))},
	} {
		t.Run(c.name, func(t *testing.T) { stallStarts(t, c.opts) })
	}
}

func stallStarts(t *testing.T, opts testrig.Options) {
	r := testrig.New(t, opts)
	if opts.NoStart {
		if err := r.Start(); err != nil {
			t.Fatal(err)
		}
	} else if st := r.Status(); st.LandlockABI < 6 {
		t.Skipf("needs Landlock ABI 6 (signal scoping); this kernel has %d", st.LandlockABI)
	}
	// The stopper: kill(-1, SIGSTOP) as lane-1, as fast as the shell goes,
	// for about ten seconds.
	stopper := make(chan string, 1)
	go func() {
		out, stderr, code := r.RunAs("lane-1", nil, "/bin/sh", "-c",
			`end=$(( $(date +%s) + 10 )); n=0; while [ "$(date +%s)" -lt "$end" ]; do i=0; while [ $i -lt 2000 ]; do kill -STOP -1 2>/dev/null; i=$((i+1)); done; n=$((n+2000)); done; echo "$n"`)
		stopper <- fmt.Sprintf("exit %d, %s %s", code, out, stderr)
	}()
	time.Sleep(500 * time.Millisecond)
	// lane-1 keeps asking for commands meanwhile: each start is a chance
	// for the stopper to catch the child between its uid switch and
	// execve. What lane-1's own commands come to after their exec is
	// lane-1's business (it stops them too); each ends by its timeout.
	lane1 := make(chan struct{})
	go func() {
		defer close(lane1)
		for range 40 {
			r.RunAs("lane-1", []string{"--timeout", "2s"}, "/bin/echo", "started")
		}
	}()
	// Another lane's commands all start and end, while lane-1's starts go
	// on beside them.
	lane2 := make(chan string, 1)
	go func() {
		for i := range 25 {
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
	case <-time.After(90 * time.Second):
		t.Fatalf("lane-2's commands did not all start and end in 90 s while lane-1 stopped its own processes: the broker's start path is held\n%s", r.LogText())
	}
	t.Logf("stopper: %s", <-stopper)
	<-lane1
	// And once the stopper is gone, lane-1's next command runs: nothing of
	// the broker stayed held.
	if out, stderr, code := r.RunAs("lane-1", nil, "/bin/echo", "started"); code != 0 || out != "started\n" {
		t.Fatalf("lane-1 after the stopper: exit %d, %q %q", code, out, stderr)
	}
}
