package main

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"thermite/internal/testrig"
)

// openPTY opens a pseudo-terminal pair: the operator's terminal (the
// other end is what is typed into it).
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("needs /dev/ptmx for a terminal: %v", err)
	}
	var unlock int32
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, m.Fd(), unix.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		t.Fatal(e)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(); s.Close() })
	return m, s
}

// The operator runs a lane's command from a terminal: the command must
// not hold that terminal. A process it leaves behind (in a session of its
// own) reading the terminal would get what the operator types after the
// command ended, at root's shell (a password, say). The client relays the
// terminal through pipes instead: the command still reads what is typed
// while it runs and its output still shows, on a descriptor that is not a
// terminal.
func TestRoleKeepsTheOperatorsTerminalAfterRunAsRefused(t *testing.T) {
	r := testrig.New(t, testrig.Options{})
	m, s := openPTY(t)
	var shown strings.Builder
	var mu sync.Mutex
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := m.Read(b)
			mu.Lock()
			shown.Write(b[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	home := light(t, r, nil, "lane-1", "--", "sh", "-c", "echo $HOME")
	stolen := strings.TrimSpace(home.stdout) + "/stolen"
	run := func(script string, typed string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, testrig.RunAsBinary(t), "--config", r.Config, "lane-1", "--", "sh", "-c", script)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = s, s, s
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if typed != "" {
			time.Sleep(500 * time.Millisecond)
			m.Write([]byte(typed))
		}
		if err := cmd.Wait(); err != nil {
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("run-as %q: %v; the terminal shows %q", script, err, shown.String())
		}
	}
	// A leftover that reads the terminal, then what the operator types
	// next, at root's shell.
	run("setsid -f sh -c 'head -c 7 > "+stolen+"'; echo started", "")
	m.Write([]byte("secret\n"))
	time.Sleep(time.Second)
	if b, err := os.ReadFile(stolen); err == nil && strings.Contains(string(b), "secret") {
		t.Fatalf("the lane's leftover read what the operator typed after run-as ended: %q", b)
	}
	// No shell read it here: it goes, as the shell would have taken it.
	unix.IoctlSetInt(int(s.Fd()), unix.TCFLSH, unix.TCIFLUSH)
	// What is typed while the command runs still reaches it.
	run(`read line; echo "got $line"; [ -t 0 ] || [ -t 1 ] || [ -t 2 ] || echo "no terminal"`, "hello\n")
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for _, want := range []string{"started", "got hello", "no terminal"} {
		if !strings.Contains(shown.String(), want) {
			t.Errorf("the terminal shows %q; want %q", shown.String(), want)
		}
	}
}
