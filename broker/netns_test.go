package broker

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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

// TestChildForkedIntoAgentNetNSAndNoThreadLeftThere: a child forked by
// forkInNetNS is born in the agent's namespace, which has lo up and the
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
		pid, err := forkInNetNS(n.ns, func() (int, error) {
			return syscall.ForkExec("/bin/sh", []string{"sh", "-c", "cat /proc/net/dev; readlink /proc/self/ns/net"}, &syscall.ProcAttr{Files: []uintptr{0, w.Fd(), 2}})
		})
		w.Close()
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(r)
		r.Close()
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, 0, nil)
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

// BenchmarkForkInNetNS compares a fork+exec of /bin/true into an agent's
// namespace (a fresh locked thread that joins it, forks, and goes back)
// with one in the broker's own: what egress mode adds to a command's start.
func BenchmarkForkInNetNS(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) to make a network namespace")
	}
	n, err := newEgressNet(3128)
	if err != nil {
		b.Fatal(err)
	}
	defer n.close()
	for _, c := range []struct {
		name string
		ns   *os.File
	}{{"host", nil}, {"agent-netns", n.ns}} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				pid, err := forkInNetNS(c.ns, func() (int, error) {
					return syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{})
				})
				if err != nil {
					b.Fatal(err)
				}
				var ws syscall.WaitStatus
				syscall.Wait4(pid, &ws, 0, nil)
			}
		})
	}
}
