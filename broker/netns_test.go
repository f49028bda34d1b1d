package broker

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/spawn"
)

// nsOf is the network namespace's inode of a path under /proc.
func nsOf(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestChildForkedIntoAgentNetNSAndNoThreadLeftThere: a command started
// with the agent's namespace (spawn.Command.NetNS, as startCommand gives
// it) runs in that namespace, which has lo up and the
// proxy's listener alone; and no thread of the broker stays in that
// namespace afterwards (a Go thread returned to the scheduler there would
// start unrelated commands, or make the broker's own sockets, inside it).
func TestChildForkedIntoAgentNetNSAndNoThreadLeftThere(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) to make a network namespace")
	}
	own := nsOf(t, "/proc/self/ns/net")
	n, err := newEgressNet(3128)
	if err != nil {
		t.Fatal(err)
	}
	defer n.close()
	var st unix.Stat_t
	unix.Fstat(int(n.ns.Fd()), &st)
	if st.Ino == own {
		t.Fatal("the agent's namespace is the broker's")
	}
	for i := range 20 {
		r, w, _ := os.Pipe()
		ch, err := spawn.Start(&spawn.Command{
			Argv:  []string{"/bin/sh", "-c", "cat /proc/net/dev; readlink /proc/self/ns/net"},
			Stdin: os.Stdin, Stdout: w, Stderr: os.Stderr, NetNS: n.ns, UID: 65534, GID: 65534,
		})
		w.Close()
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(r)
		r.Close()
		ch.Wait()
		unix.Close(ch.PIDFD)
		got := string(out)
		if want := fmt.Sprintf("net:[%d]", st.Ino); !strings.Contains(got, want) || !strings.Contains(got, "lo:") || strings.Contains(got, "eth") {
			t.Fatalf("child %d: %q, want only lo and %s", i, got, want)
		}
	}
	// Every thread went back to the broker's namespace (one that could
	// not would exit just after its goroutine: look a while).
	var left []string
	for range 100 {
		left = nil
		tasks, _ := filepath.Glob("/proc/self/task/*/ns/net")
		for _, task := range tasks {
			var st unix.Stat_t
			if unix.Stat(task, &st) == nil && st.Ino != own {
				left = append(left, task)
			}
		}
		if len(left) == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("threads %v are still in the agent's namespace, not the broker's %d", left, own)
}
