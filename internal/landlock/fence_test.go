package landlock

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"

	"thermite/internal/netpolicy"
	"thermite/internal/testrig"
)

// standIn makes dir/dev with stand-in GPU nodes (the null device's
// numbers): the control nodes and n cards, nvidia0 … nvidiaN-1.
func standIn(t testing.TB, n int) string {
	t.Helper()
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	testrig.StandInGPUs(t, dir, n)
	return dir
}

// The child half of the enforcement tests: it builds the fence, restricts
// itself, and reports what each open got.
func TestMain(m *testing.M) {
	if spec := os.Getenv("FENCE_CHILD"); spec != "" {
		os.Exit(fenceChild(spec))
	}
	os.Exit(m.Run())
}

type childSpec struct {
	Deny   []string  `json:"deny"`
	Always []string  `json:"always"`
	MinABI int       `json:"min_abi"`
	Try    []string  `json:"try"`  // "open:PATH", "ioctl3:PATH", "create:PATH", "tcp:ADDR", "wait"
	Role   *RoleSpec `json:"role"` // build a role's rule set (RolePolicy) instead of the fence alone
}

func fenceChild(raw string) int {
	var s childSpec
	json.Unmarshal([]byte(raw), &s)
	runtime.LockOSThread()
	rules, _, err := GrantAllExcept(FenceRights, s.Deny, s.Always)
	p := &Policy{HandledFS: FenceRights, Rules: rules}
	if s.Role != nil {
		p, _, err = RolePolicy(*s.Role)
	}
	if err != nil {
		fmt.Println("build:", err)
		return 3
	}
	f, err := p.Build(s.MinABI)
	if err != nil {
		fmt.Println("build:", err)
		return 3
	}
	unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
	if err := ll.LandlockRestrictSelf(int(f.Fd()), 0); err != nil {
		fmt.Println("restrict:", err)
		return 3
	}
	in := make([]byte, 1)
	for _, t := range s.Try {
		op, path, _ := strings.Cut(t, ":")
		var err error
		switch op {
		case "wait":
			fmt.Println("ready")
			os.Stdin.Read(in) // the parent makes a node meanwhile
			continue
		case "open":
			var fd int
			fd, err = unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err == nil {
				unix.Close(fd)
			}
		case "create":
			var fd int
			fd, err = unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
			if err == nil {
				unix.Close(fd)
				unix.Unlink(path)
			}
		case "tcp":
			var c net.Conn
			if c, err = net.Dial("tcp", path); err == nil {
				c.Close()
			}
			var errno syscall.Errno
			if errors.As(err, &errno) {
				err = errno
			}
		case "ioctl3":
			var fd int
			fd, err = unix.Open(path, 3|unix.O_CLOEXEC, 0)
			if err == nil {
				_, err = unix.IoctlGetTermios(fd, unix.TCGETS)
				unix.Close(fd)
				if err == unix.ENOTTY {
					err = nil // the stand-in's driver answered
				}
			}
		}
		if err == nil {
			fmt.Println(t, "ok")
		} else {
			var errno syscall.Errno
			if errors.As(err, &errno) {
				fmt.Println(t, unix.ErrnoName(errno))
			} else {
				fmt.Println(t, "error:"+strings.ReplaceAll(err.Error(), " ", "_"))
			}
		}
	}
	return 0
}

func runChild(t *testing.T, s childSpec, during func()) map[string]string {
	t.Helper()
	raw, _ := json.Marshal(s)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "FENCE_CHILD="+string(raw))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		l := sc.Text()
		if l == "ready" {
			// The child's fence is built and in force: now make the nodes.
			if during != nil {
				during()
			}
			stdin.Write([]byte("x"))
			stdin.Close()
			continue
		}
		if i := strings.LastIndex(l, " "); i > 0 {
			got[l[:i]] = l[i+1:]
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v (%v)", err, got)
	}
	return got
}

func TestFenceLeavesOutDeniedNodes(t *testing.T) {
	testrig.RequireRootForNodes(t)
	if err := CheckABI(FenceABI); err != nil {
		t.Skipf("needs Landlock ABI %d: %v", FenceABI, err)
	}
	dir := standIn(t, 4)
	dev := filepath.Join(dir, "dev")
	p := func(n string) string { return filepath.Join(dev, n) }
	got := runChild(t, childSpec{
		Deny:   []string{p("nvidia0"), p("nvidia2"), p("nvidia3")},
		Always: []string{dev},
		MinABI: FenceABI,
		Try: []string{
			"open:" + p("nvidia1"), "open:" + p("nvidia0"), "open:" + p("nvidia3"),
			"ioctl3:" + p("nvidia0"), "ioctl3:" + p("nvidia1"),
			"open:" + p("nvidiactl"), "open:" + p("null"), "open:/dev/null",
			"wait",
			"open:" + p("nvidia9"), "open:" + p("later"),
		},
	}, func() {
		// Made after the fence was built: denied, fail closed.
		unix.Mknod(p("nvidia9"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
		unix.Mknod(p("later"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
	})
	want := map[string]string{
		"open:" + p("nvidia1"):   "ok",
		"open:" + p("nvidia0"):   "EACCES",
		"open:" + p("nvidia3"):   "EACCES",
		"ioctl3:" + p("nvidia0"): "EACCES", // access mode 3 opens, but the ioctl is refused
		"ioctl3:" + p("nvidia1"): "ok",
		"open:" + p("nvidiactl"): "ok",
		"open:" + p("null"):      "ok",
		"open:/dev/null":         "ok",
		"open:" + p("nvidia9"):   "EACCES",
		"open:" + p("later"):     "EACCES",
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: got %q, want %q", k, got[k], w)
		}
	}
}

func TestFenceRefusesAnOldKernel(t *testing.T) {
	p := &Policy{HandledFS: FenceRights}
	_, err := p.Build(ABI() + 1)
	if err == nil {
		t.Fatal("built a fence needing a newer ABI than the kernel's")
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("landlock ABI %d ", ABI())) {
		t.Fatalf("error does not name the ABI: %v", err)
	}
	if err := CheckABI(99); err == nil || !strings.Contains(err.Error(), "need 99") {
		t.Fatal(err)
	}
}

func TestStaleWhenAFolderChanges(t *testing.T) {
	dir := t.TempDir()
	st := Stamps([]string{dir})
	if s := Stale(st); s != "" {
		t.Fatalf("fresh stamps stale: %s", s)
	}
	os.WriteFile(filepath.Join(dir, "x"), nil, 0o644)
	if s := Stale(st); s != dir {
		t.Fatalf("a new entry did not make %s stale (%q)", dir, s)
	}
}

// A role's rule set in force: the command writes only in its own places
// and on the safe devices, reads the rest, and reaches no TCP port at all
// under none and api (Landlock pins ports, not addresses); open reaches
// it.
func TestRoleWritesOnlyItsOwnPlacesAndTCPOnlyWhenOpen(t *testing.T) {
	if err := CheckABI(PolicyABI); err != nil {
		t.Skipf("needs Landlock ABI %d for a role's rule set: %v", PolicyABI, err)
	}
	own, other := t.TempDir(), t.TempDir()
	theirs := filepath.Join(other, "theirs")
	if err := os.WriteFile(theirs, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	tcp := "tcp:" + ln.Addr().String()
	for _, n := range netpolicy.All {
		got := runChild(t, childSpec{
			MinABI: PolicyABI,
			Role:   &RoleSpec{DevRoot: "/dev", Network: n, Writable: []string{own}},
			Try:    []string{"create:" + filepath.Join(own, "f"), "create:" + filepath.Join(other, "f"), "open:" + theirs, "open:/dev/null", tcp},
		}, nil)
		want := map[string]string{
			"create:" + filepath.Join(own, "f"):   "ok",
			"create:" + filepath.Join(other, "f"): "EACCES",
			"open:" + theirs:                      "EACCES", // read and write: the write is refused
			"open:/dev/null":                      "ok",
			tcp:                                   "EACCES",
		}
		if n.AllowsInet() {
			want[tcp] = "ok"
		}
		for k, w := range want {
			if got[k] != w {
				t.Errorf("network %s: %s: got %q, want %q", n, k, got[k], w)
			}
		}
	}
}

// Fit keeps what an older kernel knows and drops the rest, never leaving a
// rule with no right (which the kernel refuses).
func TestFitTrimsToTheKernelsABI(t *testing.T) {
	p := &Policy{
		HandledFS: RoleRights,
		Rules: []Rule{
			{Path: "/dev/nvidia0", Access: ll.AccessFSIoctlDev},
			{Path: "/home", Access: ll.AccessFSReadFile | ll.AccessFSTruncate},
		},
		HandledNet: ll.AccessNetConnectTCP,
		TCPPorts:   map[uint16]uint64{80: ll.AccessNetConnectTCP},
		Scoped:     ll.ScopeSignal,
	}
	p.Fit(3)
	if p.HandledFS&ll.AccessFSIoctlDev != 0 || p.HandledFS&ll.AccessFSTruncate == 0 {
		t.Errorf("handled %#x after Fit(3)", p.HandledFS)
	}
	if len(p.Rules) != 1 || p.Rules[0].Path != "/home" {
		t.Errorf("rules %+v: the IOCTL_DEV-only rule should be gone, /home kept", p.Rules)
	}
	if p.HandledNet != 0 || p.TCPPorts != nil || p.Scoped != 0 {
		t.Errorf("ABI 3 has no network rules or scoping: net %#x ports %v scoped %#x", p.HandledNet, p.TCPPorts, p.Scoped)
	}
}
