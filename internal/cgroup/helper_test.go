package cgroup

// The helper processes the real tests start inside groups: re-execs of the
// test binary with THERMITE_CGROUP_HELPER set. Each waits for one byte on
// stdin before it does anything, so a test can place it (Add, on v1) before
// it runs, as a process the caller holds before it runs would be.

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"thermite/internal/caps"
)

const helperEnv = "THERMITE_CGROUP_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode))
	}
	// Orphans of the helpers' forks come back to the test, which reaps
	// them (this machine's PID 1 does not).
	if os.Geteuid() == 0 {
		_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	}
	code := m.Run()
	reapOrphans()
	os.Exit(code)
}

func waitGo() {
	var b [1]byte
	if _, err := os.Stdin.Read(b[:]); err != nil {
		os.Exit(3)
	}
}

func runHelper(mode string) int {
	switch {
	case strings.HasPrefix(mode, "alloc:"):
		mib, _ := strconv.Atoi(strings.TrimPrefix(mode, "alloc:"))
		waitGo()
		buf := make([]byte, mib<<20)
		for i := 0; i < len(buf); i += 4096 {
			buf[i] = 1
		}
		fmt.Println("survived")
		return 0
	case mode == "idle":
		// Echoes every line it reads: proof that it still runs.
		waitGo()
		fmt.Println("ready")
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			fmt.Println("echo " + sc.Text())
		}
		return 0
	case mode == "forkbomb":
		waitGo()
		n, errno := forkUntilRefused()
		// Past the pids limit the runtime must not need a new thread:
		// format into a buffer made beforehand, write and pause with
		// raw system calls only.
		buf := make([]byte, 0, 64)
		buf = append(buf, "forked "...)
		buf = strconv.AppendInt(buf, int64(n), 10)
		buf = append(buf, " errno "...)
		buf = strconv.AppendInt(buf, int64(errno), 10)
		buf = append(buf, '\n')
		syscall.RawSyscall(syscall.SYS_WRITE, 1, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
		for {
			syscall.RawSyscall(syscall.SYS_PAUSE, 0, 0, 0)
		}
	case mode == "forkloop":
		waitGo()
		os.Stdout.WriteString("go\n")
		forkForever()
		return 0
	case mode == "caps":
		return helperCaps()
	case mode == "caps-reduced":
		return helperCapsReduced()
	case mode == "rodetect":
		return helperRODetect()
	}
	fmt.Fprintf(os.Stderr, "unknown helper mode %q\n", mode)
	return 2
}

// forkUntilRefused forks children that pause until the kernel refuses a
// fork, and returns how many it made and the errno of the refusal. Only raw
// system calls run between the fork and the child's pause: the child of a
// multi-threaded Go program has one thread and must not touch the runtime.
//
//go:nosplit
//go:norace
func forkUntilRefused() (int, syscall.Errno) {
	n := 0
	for {
		r, _, e := syscall.RawSyscall6(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
		if e != 0 {
			return n, e
		}
		if r == 0 {
			for {
				syscall.RawSyscall(syscall.SYS_PAUSE, 0, 0, 0)
			}
		}
		n++
	}
}

// forkForever is a fork bomb: every process forks in a loop, parent and
// child alike, and sleeps 1 ms when a fork is refused. The pids limit of
// its group bounds it; Kill ends it.
//
//go:nosplit
//go:norace
func forkForever() {
	ts := syscall.Timespec{Nsec: 1e6}
	for {
		_, _, e := syscall.RawSyscall6(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
		if e != 0 {
			syscall.RawSyscall(syscall.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), 0, 0)
		}
	}
}

// The pids the test's exec.Cmds own, which their Wait reaps; every other
// zombie child is an orphan the test (a subreaper) reaps itself.
var (
	ownedMu sync.Mutex
	owned   = map[int]bool{}
)

// reapOrphans reaps the zombie children of this process that no exec.Cmd
// owns: orphans of the helpers' forks, reparented here.
func reapOrphans() int {
	self := os.Getpid()
	ents, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[0] != "Z" || f[1] != strconv.Itoa(self) {
			continue
		}
		ownedMu.Lock()
		mine := owned[pid]
		ownedMu.Unlock()
		if mine {
			continue
		}
		if p, _ := unix.Wait4(pid, nil, unix.WNOHANG, nil); p == pid {
			n++
		}
	}
	return n
}

// helper is one helper process.
type helper struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr bytes.Buffer
	done   chan struct{}
	err    error // Wait's answer, once done
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 || testing.Short() {
		t.Skip("needs root (and no -short): cgroup files are root's")
	}
}

// uniqueName is a parent group name for this test and process.
func uniqueName(t *testing.T) string {
	n := regexp.MustCompile(`[^A-Za-z0-9_-]`).ReplaceAllString(t.Name(), "_")
	return fmt.Sprintf("thermite-test-%s-%d", n, os.Getpid())
}

// newHelper prepares a helper in mode; prepare may adjust the command.
func newHelper(t *testing.T, mode string, extraEnv ...string) *helper {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, "GOMAXPROCS=1", "GOGC=off")
	cmd.Env = append(cmd.Env, extraEnv...)
	h := &helper{t: t, cmd: cmd, lines: make(chan string, 100), done: make(chan struct{})}
	cmd.Stderr = &h.stderr
	return h
}

// start starts the helper inside g: on v2 by CLONE_INTO_CGROUP, on v1 by
// Add while it waits for its go byte. It checks the helper is in every
// hierarchy of g before it returns; release lets it run.
func (h *helper) start(g *Group) {
	t := h.t
	t.Helper()
	var err error
	h.stdin, err = h.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := h.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if g != nil && g.tree.Version == 2 {
		fd, err := g.FD()
		if err != nil {
			t.Fatal(err)
		}
		if h.cmd.SysProcAttr == nil {
			h.cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		h.cmd.SysProcAttr.UseCgroupFD = true
		h.cmd.SysProcAttr.CgroupFD = fd
	}
	ownedMu.Lock()
	err = h.cmd.Start()
	if err == nil {
		owned[h.cmd.Process.Pid] = true
	}
	ownedMu.Unlock()
	if err != nil {
		t.Fatalf("start helper: %v", err)
	}
	pid := h.cmd.Process.Pid
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		close(h.lines)
	}()
	go func() {
		h.err = h.cmd.Wait()
		ownedMu.Lock()
		delete(owned, pid)
		ownedMu.Unlock()
		close(h.done)
	}()
	t.Cleanup(func() {
		select {
		case <-h.done:
		default:
			_ = unix.Kill(pid, unix.SIGKILL)
			<-h.done
		}
	})
	if g != nil {
		if g.tree.Version == 1 {
			if err := g.Add(pid); err != nil {
				t.Fatalf("Add(%d): %v", pid, err)
			}
		}
		requireIn(t, g, pid)
	}
}

// requireIn checks pid is listed in every directory of g.
func requireIn(t *testing.T, g *Group, pid int) {
	t.Helper()
	for _, d := range g.Paths() {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			t.Fatal(err)
		}
		if !contains(strings.Fields(string(b)), strconv.Itoa(pid)) {
			t.Fatalf("pid %d is not in %s/cgroup.procs (%q)", pid, d, b)
		}
	}
}

func (h *helper) release() {
	h.t.Helper()
	if _, err := h.stdin.Write([]byte("g")); err != nil {
		h.t.Fatalf("release helper: %v", err)
	}
}

// line waits for the helper's next line of output.
func (h *helper) line(d time.Duration) string {
	h.t.Helper()
	select {
	case l, ok := <-h.lines:
		if !ok {
			h.t.Fatalf("helper ended without a line; stderr: %s", h.stderr.String())
		}
		return l
	case <-time.After(d):
		h.t.Fatalf("no line from the helper in %v", d)
	}
	return ""
}

// wait waits for the helper to end and returns how: Wait's error.
func (h *helper) wait(d time.Duration) error {
	h.t.Helper()
	select {
	case <-h.done:
		return h.err
	case <-time.After(d):
		h.t.Fatalf("helper %d still running after %v", h.cmd.Process.Pid, d)
	}
	return nil
}

func (h *helper) running() bool {
	select {
	case <-h.done:
		return false
	default:
		return true
	}
}

// killedBy reports whether err is an exit by signal sig.
func killedBy(err error, sig syscall.Signal) bool {
	ee, ok := err.(*exec.ExitError)
	if !ok {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// helperCaps drops to the broker's capability set the way the broker does
// (bounding set, no_new_privs, re-exec) and goes on in helperCapsReduced.
func helperCaps() int {
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, helperEnv+"=") {
			env = append(env, e)
		}
	}
	env = append(env, helperEnv+"=caps-reduced")
	err := caps.ReduceAndExec(caps.Broker, []string{os.Args[0], "-test.run=^$"}, env)
	fmt.Fprintln(os.Stderr, err)
	return 2
}

// helperCapsReduced runs a group's whole life with exactly the broker's
// capabilities: Detect, Create, a command started as nobody and placed
// before it execs, Stats, Kill, Remove, Close.
func helperCapsReduced() int {
	fail := func(f string, a ...any) int {
		fmt.Fprintf(os.Stderr, f+"\n", a...)
		return 1
	}
	if err := caps.Verify(caps.Broker); err != nil {
		return fail("%v", err)
	}
	st, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(st), "\n") {
		if strings.HasPrefix(l, "CapEff:") || strings.HasPrefix(l, "NoNewPrivs:") {
			fmt.Println(strings.Join(strings.Fields(l), " "))
		}
	}
	tr, err := Detect("/sys/fs/cgroup", os.Getenv("THERMITE_CGROUP_PARENT"))
	if err != nil {
		return fail("Detect: %v", err)
	}
	g, err := tr.Create("g", Limits{MemoryBytes: 64 << 20, Pids: 16})
	if err != nil {
		return fail("Create: %v", err)
	}
	cmd := exec.Command("/bin/sh", "-c", "read x; exec sleep 100")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if tr.Version == 2 {
		fd, err := g.FD()
		if err != nil {
			return fail("FD: %v", err)
		}
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	}
	in, _ := cmd.StdinPipe()
	if err := cmd.Start(); err != nil {
		return fail("start: %v", err)
	}
	pid := cmd.Process.Pid
	defer func() {
		_ = unix.Kill(pid, unix.SIGKILL)
		_ = cmd.Wait()
	}()
	if tr.Version == 1 {
		if err := g.Add(pid); err != nil {
			return fail("Add: %v", err)
		}
	}
	in.Write([]byte("\n"))
	// It execs sleep inside the group.
	ok, _ := pollUntil(time.Now().Add(5*time.Second), func() (bool, error) {
		// comm, not exe: reading another uid's exe link needs
		// CAP_SYS_PTRACE, which the broker does not have.
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		return strings.TrimSpace(string(b)) == "sleep", nil
	})
	if !ok {
		return fail("the command did not exec sleep")
	}
	procs, err := g.Procs()
	if err != nil || len(procs) != 1 || procs[0] != pid {
		return fail("Procs: %v %v, want [%d]", procs, err, pid)
	}
	s, err := g.Stats()
	if err != nil || s.PidsCurrent != 1 {
		return fail("Stats: %+v %v", s, err)
	}
	if err := g.Kill(); err != nil {
		return fail("Kill: %v", err)
	}
	if err := cmd.Wait(); !killedBy(err, syscall.SIGKILL) {
		return fail("sleep ended with %v, not SIGKILL", err)
	}
	if err := g.Remove(); err != nil {
		return fail("Remove: %v", err)
	}
	if err := tr.Close(); err != nil {
		return fail("Close: %v", err)
	}
	fmt.Println("ok " + tr.String())
	return 0
}

// helperRODetect runs in its own mount namespace (the test starts it with
// CLONE_NEWNS; Go makes / private there): it bind-mounts the host's
// hierarchies read-only under a temporary folder and says what Detect
// answers about them. Nothing is mounted outside the namespace.
func helperRODetect() int {
	dir := os.Getenv("THERMITE_CGROUP_DIR")
	name := os.Getenv("THERMITE_CGROUP_PARENT")
	roBind := func(src, dst string) error {
		if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s: %w", src, err)
		}
		return unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, "")
	}
	v1 := filepath.Join(dir, "v1")
	if err := os.Mkdir(v1, 0o755); err != nil {
		fmt.Println("error", err)
		return 1
	}
	if err := unix.Mount("tmpfs", v1, "tmpfs", 0, "mode=755"); err != nil {
		fmt.Println("error", err)
		return 1
	}
	for _, h := range []string{"memory", "pids"} {
		d := filepath.Join(v1, h)
		if err := os.Mkdir(d, 0o755); err != nil {
			fmt.Println("error", err)
			return 1
		}
		if err := roBind("/sys/fs/cgroup/"+h, d); err != nil {
			fmt.Println("error", err)
			return 1
		}
	}
	_, err := Detect(v1, name)
	fmt.Println("v1:", err)
	if magic, _, err := osFS.statfs(osFS{}, "/sys/fs/cgroup/unified"); err == nil && magic == unix.CGROUP2_SUPER_MAGIC {
		v2 := filepath.Join(dir, "v2")
		if err := os.Mkdir(v2, 0o755); err != nil {
			fmt.Println("error", err)
			return 1
		}
		if err := roBind("/sys/fs/cgroup/unified", v2); err != nil {
			fmt.Println("error", err)
			return 1
		}
		_, err := Detect(v2, name)
		fmt.Println("v2:", err)
	}
	return 0
}
