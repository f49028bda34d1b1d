//go:build linux && (amd64 || arm64)

package seccomp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"thermite/internal/netpolicy"
)

// The attacks run for real: the test binary re-executes itself as a child
// (TestHelperProcess), which locks its OS thread, sets no_new_privs,
// installs the filter and makes one system call from that thread, then
// prints the outcome. Each attack also runs without the filter: as root
// the kernel would let most of them through or fail them with another
// errno, so an EPERM with the filter and anything else without it proves
// that the filter, not the kernel, refused.

const (
	envScenario  = "THERMITE_SECCOMP_SCENARIO"
	envMode      = "THERMITE_SECCOMP_MODE" // one of the mode* constants
	envNetwork   = "THERMITE_SECCOMP_NETWORK"
	envAllowPerf = "THERMITE_SECCOMP_ALLOW_PERF"
	envHelper    = "THERMITE_SECCOMP_FILE_HELPER"
	envCtl       = "THERMITE_SECCOMP_CONTROLLER"
	envDir       = "THERMITE_SECCOMP_DIR"
	resultPrefix = "RESULT: "
)

const (
	modeFiltered  = "filtered"  // no_new_privs, then Install
	modeBaseline  = "baseline"  // neither: what the kernel alone answers
	modeNoNNP     = "no-nnp"    // Install without no_new_privs
	modeInherited = "inherited" // nothing: the filter came through execve
)

// scenario is what a child does after the filter is in place, on the
// locked thread. It returns the outcome as a short string: "ok", an errno
// name, or a description.
type scenario func(dir string) string

// scenarios are looked up by name in the child. Architecture-specific test
// files add theirs from init.
var scenarios = map[string]scenario{}

// attack is one system call a role might make, and what must come of it.
type attack struct {
	name string
	run  scenario
	want string // with the filter; without it, a denied call must differ
}

func (a attack) denied() bool { return a.want == "EPERM" || a.want == "ENOSYS" }

var missing = "/nonexistent-thermite-seccomp-test"

var atFDCWDArg = uintptr(atFDCWD)

func attacks() []attack {
	list := []attack{
		// Mounts. Each call's arguments make the kernel fail it harmlessly
		// (ENOENT, EBADF...) when the filter does not stop it.
		{"mount", func(string) string {
			return raw(unix.SYS_MOUNT, cstr("none"), cstr(missing), cstr("tmpfs"), 0, 0)
		}, "EPERM"},
		{"umount2", func(string) string { return raw(unix.SYS_UMOUNT2, cstr(missing), 0) }, "EPERM"},
		{"fsopen", func(string) string { return raw(unix.SYS_FSOPEN, cstr("thermite-no-such-fs"), 0) }, "EPERM"},
		{"fsconfig", func(string) string { return raw(unix.SYS_FSCONFIG, badFD, unix.FSCONFIG_CMD_CREATE, 0, 0, 0) }, "EPERM"},
		{"fsmount", func(string) string { return raw(unix.SYS_FSMOUNT, badFD, 0, 0) }, "EPERM"},
		{"fspick", func(string) string { return raw(unix.SYS_FSPICK, atFDCWDArg, cstr(missing), 0) }, "EPERM"},
		{"move_mount", func(string) string {
			return raw(unix.SYS_MOVE_MOUNT, atFDCWDArg, cstr(missing), atFDCWDArg, cstr(missing), 0)
		}, "EPERM"},
		{"open_tree", func(string) string { return raw(unix.SYS_OPEN_TREE, atFDCWDArg, cstr(missing), 0) }, "EPERM"},
		{"open_tree_attr", func(string) string {
			return raw(unix.SYS_OPEN_TREE_ATTR, atFDCWDArg, cstr(missing), 0, 0, 0)
		}, "EPERM"},
		{"mount_setattr", func(string) string {
			return raw(unix.SYS_MOUNT_SETATTR, atFDCWDArg, cstr(missing), 0, 0, 0)
		}, "EPERM"},
		{"pivot_root", func(string) string { return raw(unix.SYS_PIVOT_ROOT, cstr(missing), cstr(missing)) }, "EPERM"},
		{"chroot", func(string) string { return raw(unix.SYS_CHROOT, cstr(missing)) }, "EPERM"},

		// Namespaces. unshare affects only this thread of a child that is
		// about to exit. The clone calls add CLONE_THREAD without
		// CLONE_SIGHAND, which the kernel always refuses with EINVAL, so no
		// task is ever created; the filter must answer EPERM first.
		{"unshare-nothing", func(string) string { return raw(unix.SYS_UNSHARE, 0) }, "EPERM"},
		{"unshare-uts", func(string) string { return raw(unix.SYS_UNSHARE, unix.CLONE_NEWUTS) }, "EPERM"},
		{"unshare-user", func(string) string { return raw(unix.SYS_UNSHARE, unix.CLONE_NEWUSER) }, "EPERM"},
		{"unshare-net", func(string) string { return raw(unix.SYS_UNSHARE, unix.CLONE_NEWNET) }, "EPERM"},
		{"setns", func(string) string { return raw(unix.SYS_SETNS, badFD, 0) }, "EPERM"},
		{"clone-thread-only", cloneWith(unix.CLONE_THREAD), "EINVAL"},
		{"clone-newuser-in-high-bits", cloneWith(unix.CLONE_NEWUSER<<32 | unix.CLONE_THREAD), "EINVAL"},
		{"clone3", func(string) string { return raw(unix.SYS_CLONE3, 0, 0) }, "ENOSYS"},

		// The kernel's own extension points.
		{"bpf", func(string) string { return raw(unix.SYS_BPF, 0xffff, 0, 0) }, "EPERM"},
		{"perf_event_open", perfEventOpen, "EPERM"},
		{"keyctl", func(string) string { return raw(unix.SYS_KEYCTL, 0xffff, 0, 0, 0, 0) }, "EPERM"},
		{"add_key", func(string) string { return raw(unix.SYS_ADD_KEY, 0, 0, 0, 0, 0) }, "EPERM"},
		{"request_key", func(string) string { return raw(unix.SYS_REQUEST_KEY, 0, 0, 0, 0) }, "EPERM"},
		// A queue name that would otherwise be made (and left) by the call.
		{"mq_open", func(string) string {
			return raw(unix.SYS_MQ_OPEN, cstr("/thermite-seccomp-test"), unix.O_CREAT|unix.O_RDWR, 0o600, 0)
		}, "EPERM"},
		{"mq_unlink", func(string) string { return raw(unix.SYS_MQ_UNLINK, cstr("/thermite-seccomp-test")) }, "EPERM"},
		// Unknown flags: EINVAL before anything is loaded or unloaded.
		{"kexec_load", func(string) string { return raw(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0x8000) }, "EPERM"},
		{"kexec_file_load", func(string) string {
			return raw(unix.SYS_KEXEC_FILE_LOAD, badFD, badFD, 0, 0, 0x80000000)
		}, "EPERM"},
		{"init_module", func(string) string { return raw(unix.SYS_INIT_MODULE, 0, 0, 0) }, "EPERM"},
		{"finit_module", func(string) string { return raw(unix.SYS_FINIT_MODULE, badFD, cstr(""), 0) }, "EPERM"},
		{"delete_module", func(string) string {
			return raw(unix.SYS_DELETE_MODULE, cstr("thermite_no_such_module"), unix.O_NONBLOCK)
		}, "EPERM"},
		// Wrong magic numbers: EINVAL without the filter, never a reboot.
		{"reboot", func(string) string { return raw(unix.SYS_REBOOT, 0, 0, 0, 0) }, "EPERM"},
		{"swapon", func(string) string { return raw(unix.SYS_SWAPON, cstr(missing), 0) }, "EPERM"},
		{"swapoff", func(string) string { return raw(unix.SYS_SWAPOFF, cstr(missing)) }, "EPERM"},
		// settimeofday(NULL, NULL) succeeds as root and changes nothing.
		{"settimeofday", func(string) string { return raw(unix.SYS_SETTIMEOFDAY, 0, 0) }, "EPERM"},
		{"clock_settime", func(string) string { return raw(unix.SYS_CLOCK_SETTIME, unix.CLOCK_REALTIME, 0) }, "EPERM"},
		{"clock_adjtime", func(string) string { return raw(unix.SYS_CLOCK_ADJTIME, unix.CLOCK_REALTIME, 0) }, "EPERM"},
		{"adjtimex", func(string) string { return raw(unix.SYS_ADJTIMEX, 0) }, "EPERM"},
		{"userfaultfd", func(string) string { return rawFD(unix.SYS_USERFAULTFD, unix.O_CLOEXEC) }, "EPERM"},
		{"io_uring_setup", func(string) string { return raw(unix.SYS_IO_URING_SETUP, 1, 0) }, "EPERM"},
		{"io_uring_enter", func(string) string { return raw(unix.SYS_IO_URING_ENTER, badFD, 0, 0, 0, 0, 0) }, "EPERM"},
		{"io_uring_register", func(string) string { return raw(unix.SYS_IO_URING_REGISTER, badFD, 0, 0, 0) }, "EPERM"},

		// Terminal injection, on a pseudo-terminal of the child's own.
		{"ioctl-tiocsti", ptyIoctl(unix.TIOCSTI), "EPERM"},
		{"ioctl-tiocsti-high-bits", ptyIoctl(0xffffffff00000000 | unix.TIOCSTI), "EPERM"},
		{"ioctl-tioclinux", ptyIoctl(unix.TIOCLINUX), "EPERM"},
		{"ioctl-tiocgwinsz", ptyIoctl(unix.TIOCGWINSZ), "ok"},

		// Set-id modes, on dir/target (0644, made by the parent).
		{"fchmod-4755", fchmodTarget(0o4755), "EPERM"},
		{"fchmod-2755", fchmodTarget(0o2755), "EPERM"},
		{"fchmod-0644", fchmodTarget(0o644), "ok"},
		{"fchmodat-4755", atCall(unix.SYS_FCHMODAT, "target", 0o4755), "EPERM"},
		{"fchmodat-2755", atCall(unix.SYS_FCHMODAT, "target", 0o2755), "EPERM"},
		{"fchmodat-0755", atCall(unix.SYS_FCHMODAT, "target", 0o755), "ok"},
		{"fchmodat2-4755", atCall(unix.SYS_FCHMODAT2, "target", 0o4755, 0), "EPERM"},
		{"fchmodat2-2755", atCall(unix.SYS_FCHMODAT2, "target", 0o2755, 0), "EPERM"},
		{"fchmodat2-0755", atCall(unix.SYS_FCHMODAT2, "target", 0o755, 0), "ok"},
		{"openat-creat-4755", atCall(unix.SYS_OPENAT, "new", unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o4755), "EPERM"},
		{"openat-creat-0644", atCall(unix.SYS_OPENAT, "new", unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644), "ok"},
		{"openat-tmpfile-2755", atCall(unix.SYS_OPENAT, ".", unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o2755), "EPERM"},
		{"openat-existing-ignores-mode", atCall(unix.SYS_OPENAT, "target", unix.O_RDONLY|unix.O_CLOEXEC, 0o4755), "ok"},
		{"mkdirat-2755", atCall(unix.SYS_MKDIRAT, "newdir", 0o2755), "EPERM"},
		{"mkdirat-0755", atCall(unix.SYS_MKDIRAT, "newdir", 0o755), "ok"},
		{"mknodat-4755", atCall(unix.SYS_MKNODAT, "node", unix.S_IFREG|0o4755, 0), "EPERM"},
		{"mknodat-0644", atCall(unix.SYS_MKNODAT, "node", unix.S_IFREG|0o644, 0), "ok"},
		{"openat2", openat2Target, "ENOSYS"},
	}
	list = append(list, legacyAttacks()...)
	list = append(list, sysvAttacks()...)
	list = append(list, openat2Attacks()...)
	list = append(list, socketAttacks()...)
	return list
}

// socketAttacks are named attack/policy; the child reads the policy from
// its environment.
func socketAttacks() []attack {
	type sock struct {
		name                  string
		domain, typ, protocol uintptr
		pair                  bool
	}
	socks := map[string]sock{}
	for _, s := range []sock{
		{name: "unix-stream", domain: unix.AF_UNIX, typ: unix.SOCK_STREAM},
		{name: "unix-dgram-cloexec", domain: unix.AF_UNIX, typ: unix.SOCK_DGRAM | unix.SOCK_CLOEXEC},
		{name: "inet-stream-cloexec", domain: unix.AF_INET, typ: unix.SOCK_STREAM | unix.SOCK_CLOEXEC},
		{name: "inet-stream-tcp", domain: unix.AF_INET, typ: unix.SOCK_STREAM, protocol: unix.IPPROTO_TCP},
		{name: "inet6-stream-nonblock", domain: unix.AF_INET6, typ: unix.SOCK_STREAM | unix.SOCK_NONBLOCK},
		{name: "inet-stream-mptcp", domain: unix.AF_INET, typ: unix.SOCK_STREAM, protocol: unix.IPPROTO_MPTCP},
		{name: "inet-dgram", domain: unix.AF_INET, typ: unix.SOCK_DGRAM},
		{name: "inet6-dgram", domain: unix.AF_INET6, typ: unix.SOCK_DGRAM | unix.SOCK_CLOEXEC},
		{name: "inet-raw", domain: unix.AF_INET, typ: unix.SOCK_RAW, protocol: unix.IPPROTO_ICMP},
		{name: "packet", domain: unix.AF_PACKET, typ: unix.SOCK_RAW},
		{name: "netlink", domain: unix.AF_NETLINK, typ: unix.SOCK_RAW},
		{name: "socketpair-unix", domain: unix.AF_UNIX, typ: unix.SOCK_STREAM, pair: true},
		{name: "socketpair-inet", domain: unix.AF_INET, typ: unix.SOCK_STREAM, pair: true},
	} {
		socks[s.name] = s
	}
	var list []attack
	for _, p := range []struct {
		policy netpolicy.Network
		want   map[string]string // the outcome under the policy; "ok" when absent
	}{
		{NetworkNone, map[string]string{
			"inet-stream-cloexec": "EPERM", "inet-stream-tcp": "EPERM", "inet6-stream-nonblock": "EPERM",
			"inet-stream-mptcp": "EPERM", "inet-dgram": "EPERM", "inet6-dgram": "EPERM", "inet-raw": "EPERM",
			"packet": "EPERM", "netlink": "EPERM", "socketpair-inet": "EPERM",
		}},
		// api is none for the filter (issue 13): TCP too is refused.
		{NetworkAPI, map[string]string{
			"inet-stream-cloexec": "EPERM", "inet-stream-tcp": "EPERM", "inet6-stream-nonblock": "EPERM",
			"inet-stream-mptcp": "EPERM", "inet-dgram": "EPERM", "inet6-dgram": "EPERM", "inet-raw": "EPERM",
			"packet": "EPERM", "netlink": "EPERM", "socketpair-inet": "EPERM",
		}},
		// egress: TCP streams over IPv4 and IPv6 (the agent's namespace
		// and Landlock leave them its proxy alone), nothing else.
		{NetworkEgress, map[string]string{
			"inet-stream-mptcp": "EPERM", "inet-dgram": "EPERM", "inet6-dgram": "EPERM", "inet-raw": "EPERM",
			"packet": "EPERM", "netlink": "EPERM", "socketpair-inet": "EPERM",
		}},
		{NetworkOpen, map[string]string{
			// The kernel's own answer: no AF_INET socketpair exists
			// (EOPNOTSUPP, which ErrnoName calls ENOTSUP).
			"socketpair-inet": "ENOTSUP",
		}},
	} {
		for name, s := range socks {
			want := p.want[name]
			if want == "" {
				want = "ok"
			}
			run := func(string) string {
				if s.pair {
					var fds [2]int32
					r := raw(unix.SYS_SOCKETPAIR, s.domain, s.typ, s.protocol, uintptr(unsafe.Pointer(&fds)))
					runtime.KeepAlive(&fds)
					return r
				}
				return rawFD(unix.SYS_SOCKET, s.domain, s.typ, s.protocol)
			}
			list = append(list, attack{name: "socket-" + name + "/" + string(p.policy), run: run, want: want})
		}
	}
	return list
}

// badFD is -1 as a system-call argument.
var badFD = ^uintptr(0)

// pinned keeps the C strings handed to raw system calls reachable; the Go
// heap does not move objects.
var pinned [][]byte

// cstr is s as a NUL-terminated string for a raw system call.
func cstr(s string) uintptr {
	b := append([]byte(s), 0)
	pinned = append(pinned, b)
	return uintptr(unsafe.Pointer(&b[0]))
}

// raw makes one system call on the calling thread and names the outcome.
func raw(nr uintptr, args ...uintptr) string {
	var a [6]uintptr
	copy(a[:], args)
	_, _, errno := unix.Syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5])
	return errnoName(errno)
}

// rawFD is raw for a call that returns a descriptor, which it closes.
func rawFD(nr uintptr, args ...uintptr) string {
	var a [6]uintptr
	copy(a[:], args)
	fd, _, errno := unix.Syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5])
	if errno == 0 {
		unix.Close(int(fd))
	}
	return errnoName(errno)
}

func errnoName(errno unix.Errno) string {
	if errno == 0 {
		return "ok"
	}
	if name := unix.ErrnoName(errno); name != "" {
		return name
	}
	return fmt.Sprintf("errno %d", int(errno))
}

func cloneWith(flags uintptr) scenario {
	return func(string) string { return raw(unix.SYS_CLONE, flags, 0, 0, 0, 0) }
}

func perfEventOpen(string) string {
	// A NULL attr: EFAULT from the kernel, EPERM from the filter.
	return rawFD(unix.SYS_PERF_EVENT_OPEN, 0, 0, badFD, badFD, 0)
}

func ptyIoctl(request uintptr) scenario {
	return func(string) string {
		fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		if err != nil {
			return "skip: needs pseudo-terminals (devpts on /dev/pts): open /dev/ptmx: " + errnoName(err.(unix.Errno))
		}
		defer unix.Close(fd)
		var buf [64]byte // a char for TIOCSTI and TIOCLINUX, a winsize for TIOCGWINSZ
		r := raw(unix.SYS_IOCTL, uintptr(fd), request, uintptr(unsafe.Pointer(&buf[0])))
		runtime.KeepAlive(&buf)
		return r
	}
}

func fchmodTarget(mode uintptr) scenario {
	return func(dir string) string {
		fd, err := unix.Open(filepath.Join(dir, "target"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return "open target: " + err.Error()
		}
		defer unix.Close(fd)
		return raw(unix.SYS_FCHMOD, uintptr(fd), mode)
	}
}

// atCall is nr(dirfd of dir, name, args...).
func atCall(nr uintptr, name string, args ...uintptr) scenario {
	return func(dir string) string {
		dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return "open dir: " + err.Error()
		}
		defer unix.Close(dfd)
		all := append([]uintptr{uintptr(dfd), cstr(name)}, args...)
		if nr == unix.SYS_OPENAT {
			return rawFD(nr, all...) // closes the descriptor it opens
		}
		return raw(nr, all...)
	}
}

func openat2Target(dir string) string {
	how := unix.OpenHow{Flags: unix.O_RDONLY | unix.O_CLOEXEC}
	fd, err := unix.Openat2(unix.AT_FDCWD, filepath.Join(dir, "target"), &how)
	if err != nil {
		return errnoName(err.(unix.Errno))
	}
	unix.Close(fd)
	return "ok"
}

// TestHelperProcess is the child: it does nothing unless a parent test set
// its environment.
func TestHelperProcess(t *testing.T) {
	name := os.Getenv(envScenario)
	if name == "" {
		t.Skip("the seccomp tests' child process; runs only when they start it")
	}
	os.Exit(child(name))
}

func child(name string) int {
	// Everything below runs on this one thread: the filter, no_new_privs
	// and the attacks are per thread.
	runtime.LockOSThread()
	// No core dump when the filter kills the child with SIGSYS.
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{})
	say := func(format string, args ...any) int {
		fmt.Printf(resultPrefix+format+"\n", args...)
		return 0
	}
	run := scenarios[name]
	if run == nil {
		for _, a := range attacks() {
			if a.name == name {
				run = a.run
			}
		}
	}
	if run == nil {
		return say("unknown scenario %q", name)
	}
	o := Options{Network: netpolicy.Network(os.Getenv(envNetwork)), AllowPerf: os.Getenv(envAllowPerf) == "1", FileHelper: os.Getenv(envHelper) == "1", Controller: os.Getenv(envCtl) == "1"}
	var witness *otherThread
	if name == "thread-only" {
		witness = startOtherThread() // exists before the filter, so has none
	}
	switch mode := os.Getenv(envMode); mode {
	case modeFiltered:
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return say("no_new_privs: %v", err)
		}
		if err := Install(o); err != nil {
			return say("install: %v", err)
		}
	case modeNoNNP:
		if err := Install(o); err != nil {
			return say("install refused: %v; seccomp mode %s", err, threadStatus("Seccomp"))
		}
		return say("installed without no_new_privs; seccomp mode %s", threadStatus("Seccomp"))
	case modeBaseline, modeInherited:
	default:
		return say("unknown mode %q", mode)
	}
	if witness != nil {
		return say("this thread: %s %s; other thread: %s", threadStatus("Seccomp"), raw(unix.SYS_UNSHARE, 0), witness.probe())
	}
	return say("%s", run(os.Getenv(envDir)))
}

// threadStatus is one field of /proc/thread-self/status.
func threadStatus(field string) string {
	data, err := os.ReadFile("/proc/thread-self/status")
	if err != nil {
		return err.Error()
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return field + " missing"
}

// otherThread is a locked goroutine, on a thread of its own, that answers
// probes.
type otherThread struct{ ask, answer chan string }

func startOtherThread() *otherThread {
	o := &otherThread{ask: make(chan string), answer: make(chan string)}
	go func() {
		runtime.LockOSThread()
		o.answer <- "ready"
		for range o.ask {
			o.answer <- threadStatus("Seccomp") + " " + raw(unix.SYS_UNSHARE, 0)
		}
	}()
	<-o.answer
	return o
}

func (o *otherThread) probe() string {
	o.ask <- "probe"
	return <-o.answer
}

// outcome is what a child reported.
type outcome struct {
	result   string // the RESULT line, or "killed by <signal>"
	signaled syscall.Signal
	output   string
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 || testing.Short() {
		t.Skip("needs root (and no -short): without the filter the attacks must succeed, or fail for another reason than EPERM")
	}
}

// runChild starts the test binary as a child running scenario.
func runChild(t *testing.T, scenario, mode string, o Options, dir string) outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		envScenario+"="+scenario, envMode+"="+mode, envNetwork+"="+string(o.Network),
		envAllowPerf+"="+map[bool]string{true: "1", false: "0"}[o.AllowPerf], envDir+"="+dir,
		envHelper+"="+map[bool]string{true: "1", false: "0"}[o.FileHelper],
		envCtl+"="+map[bool]string{true: "1", false: "0"}[o.Controller])
	out, err := cmd.CombinedOutput()
	res := outcome{output: string(out)}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			res.signaled = ws.Signal()
			res.result = "killed by " + unix.SignalName(ws.Signal())
			return res
		}
	}
	if err != nil {
		t.Fatalf("%s (%s): %v\n%s", scenario, mode, err, out)
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if r, ok := strings.CutPrefix(sc.Text(), resultPrefix); ok {
			res.result = r
			return res
		}
	}
	t.Fatalf("%s (%s): no result line:\n%s", scenario, mode, out)
	return res
}

// scratchDir is a fresh folder holding a 0644 file named target.
func scratchDir(t *testing.T) string {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "target"), []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestAttacks(t *testing.T) {
	requireRoot(t)
	for _, a := range attacks() {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			o := Options{Network: NetworkOpen}
			if _, policy, ok := strings.Cut(a.name, "/"); ok {
				o.Network = netpolicy.Network(policy)
			}
			got := runChild(t, a.name, modeFiltered, o, scratchDir(t))
			base := runChild(t, a.name, modeBaseline, o, scratchDir(t))
			// A scenario that needs what this machine lacks says so; the
			// same words with the filter prove the filter did not cause it.
			if reason, ok := strings.CutPrefix(base.result, "skip: "); ok && got.result == base.result {
				t.Skip(reason)
			}
			if got.result != a.want {
				t.Errorf("with the filter: %s, want %s\n%s", got.result, a.want, got.output)
			}
			switch {
			case a.denied() && base.result == a.want:
				// The kernel itself refuses here (a sysctl, a missing
				// capability): this case cannot tell the filter apart.
				t.Logf("without the filter also %s: this kernel cannot show the filter at work here", base.result)
			case !a.denied() && base.result != got.result:
				t.Errorf("the filter changed an allowed call: %s with it, %s without", got.result, base.result)
			default:
				t.Logf("with the filter %s, without %s", got.result, base.result)
			}
		})
	}
}

func TestPerfAllowedByOption(t *testing.T) {
	requireRoot(t)
	for _, allow := range []bool{false, true} {
		o := Options{Network: NetworkNone, AllowPerf: allow}
		got := runChild(t, "perf_event_open", modeFiltered, o, t.TempDir())
		base := runChild(t, "perf_event_open", modeBaseline, o, t.TempDir())
		if base.result == "EPERM" {
			t.Skip("without the filter perf_event_open(NULL) already gives EPERM here (a seccomp profile or LSM around this machine): cannot tell the filter apart")
		}
		want := "EPERM"
		if allow {
			want = base.result // the kernel's own answer (EFAULT for a NULL attr)
		}
		if got.result != want {
			t.Errorf("AllowPerf %v: %s, want %s", allow, got.result, want)
		}
	}
}

func TestCloneNamespaceFlags(t *testing.T) {
	requireRoot(t)
	for name := range namespaceFlags {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			scenario := "clone-" + name
			o := Options{Network: NetworkOpen}
			if got := runChild(t, scenario, modeFiltered, o, ""); got.result != "EPERM" {
				t.Errorf("with the filter: %s, want EPERM", got.result)
			}
			// CLONE_THREAD without CLONE_SIGHAND: the kernel's EINVAL.
			if base := runChild(t, scenario, modeBaseline, o, ""); base.result != "EINVAL" {
				t.Errorf("without the filter: %s, want EINVAL", base.result)
			}
		})
	}
}

// namespaceFlags are issue 7's clone flags, written out here.
var namespaceFlags = map[string]uintptr{
	"CLONE_NEWNS": unix.CLONE_NEWNS, "CLONE_NEWCGROUP": unix.CLONE_NEWCGROUP,
	"CLONE_NEWUTS": unix.CLONE_NEWUTS, "CLONE_NEWIPC": unix.CLONE_NEWIPC,
	"CLONE_NEWUSER": unix.CLONE_NEWUSER, "CLONE_NEWPID": unix.CLONE_NEWPID,
	"CLONE_NEWNET": unix.CLONE_NEWNET, "CLONE_NEWTIME": unix.CLONE_NEWTIME,
}

func init() {
	for name, flag := range namespaceFlags {
		scenarios["clone-"+name] = cloneWith(flag | unix.CLONE_THREAD)
	}
	scenarios["fork-exec"] = func(string) string {
		// os/exec forks with clone (CLONE_VM|CLONE_VFORK) from this
		// thread; the shell forks with glibc's clone.
		for _, argv := range [][]string{{"/bin/true"}, {"/bin/sh", "-c", "true | true; (true) && true"}} {
			if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
				return fmt.Sprintf("%q: %v %s", argv, err, out)
			}
		}
		return "ok"
	}
	scenarios["exec-self"] = func(string) string {
		// The filter must come through execve: the new program starts it
		// in every thread it makes.
		r, err := inheritedResult("threads")
		if err != nil {
			return err.Error()
		}
		return r
	}
	scenarios["threads"] = func(string) string {
		// New OS threads (clone with CLONE_THREAD), each asked for its
		// seccomp mode and to unshare.
		const n = 8
		answers := make(chan string, n)
		for range n {
			go func() {
				runtime.LockOSThread() // a thread of its own, ended with the goroutine
				answers <- "mode " + threadStatus("Seccomp") + " no_new_privs " + threadStatus("NoNewPrivs") + " unshare " + raw(unix.SYS_UNSHARE, 0)
			}()
		}
		seen := map[string]int{}
		for range n {
			seen[<-answers]++
		}
		var parts []string
		for answer, count := range seen {
			parts = append(parts, strconv.Itoa(count)+"x "+answer)
		}
		return strings.Join(parts, ", ")
	}
	scenarios["glibc-threads"] = func(string) string {
		// glibc's pthread_create and posix_spawn try clone3 first and fall
		// back to clone on ENOSYS.
		python, err := exec.LookPath("python3")
		if err != nil {
			return "no python3 on PATH"
		}
		script := "import threading, subprocess\n" +
			"t = threading.Thread(target=lambda: None); t.start(); t.join()\n" +
			"subprocess.run(['/bin/true'], check=True)\n" +
			"print('ok')\n"
		out, err := exec.Command(python, "-c", script).CombinedOutput()
		if err != nil {
			return fmt.Sprintf("python3: %v %s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	scenarios["x32-getpid"] = func(string) string {
		if !hasX32 {
			return "skip: no x32 ABI on " + runtime.GOARCH
		}
		return raw(x32SyscallBit | unix.SYS_GETPID)
	}
	scenarios["thread-only"] = func(string) string { return "" } // answered in child
}

func TestForkAndThreadsStillWork(t *testing.T) {
	requireRoot(t)
	o := Options{Network: NetworkNone}
	for _, name := range []string{"fork-exec", "glibc-threads"} {
		t.Run(name, func(t *testing.T) {
			// Checked here, outside the filter, so that the filter
			// cannot turn a failure into a skip.
			switch name {
			case "fork-exec":
				for _, tool := range []string{"/bin/true", "/bin/sh"} {
					if _, err := os.Stat(tool); err != nil {
						t.Skipf("needs %s to fork and exec under the filter: %v", tool, err)
					}
				}
			case "glibc-threads":
				if _, err := exec.LookPath("python3"); err != nil {
					t.Skip("needs python3 to start glibc threads and posix_spawn under the filter")
				}
			}
			got := runChild(t, name, modeFiltered, o, "")
			if got.result != "ok" {
				t.Errorf("%s under the filter: %s\n%s", name, got.result, got.output)
			}
			t.Logf("%s under the filter: %s", name, got.result)
		})
	}
}

func TestFilterSurvivesExecIntoThreads(t *testing.T) {
	requireRoot(t)
	got := runChild(t, "exec-self", modeFiltered, Options{Network: NetworkNone}, "")
	if want := "8x mode 2 no_new_privs 1 unshare EPERM"; got.result != want {
		t.Errorf("threads of a program started under the filter: %q, want %q\n%s", got.result, want, got.output)
	}
	base := runChild(t, "exec-self", modeBaseline, Options{Network: NetworkNone}, "")
	if want := "8x mode 0 no_new_privs 0 unshare ok"; base.result != want {
		t.Errorf("without the filter: %q, want %q\n%s", base.result, want, base.output)
	}
}

func TestX32Killed(t *testing.T) {
	requireRoot(t)
	if !hasX32 {
		t.Skip("no x32 ABI on " + runtime.GOARCH)
	}
	got := runChild(t, "x32-getpid", modeFiltered, Options{Network: NetworkOpen}, "")
	if got.signaled != unix.SIGSYS {
		t.Errorf("an x32 call under the filter: %s, want killed by SIGSYS\n%s", got.result, got.output)
	}
	base := runChild(t, "x32-getpid", modeBaseline, Options{Network: NetworkOpen}, "")
	if base.signaled != 0 {
		t.Errorf("an x32 call without the filter: %s, want a return", base.result)
	}
	t.Logf("without the filter: %s", base.result)
}

func TestInstallRequiresNoNewPrivs(t *testing.T) {
	requireRoot(t) // as root the kernel alone would accept the filter
	got := runChild(t, "thread-only", modeNoNNP, Options{Network: NetworkNone}, "")
	want := "install refused: seccomp: no_new_privs is not set on this thread; refusing to install the filter; seccomp mode 0"
	if got.result != want {
		t.Errorf("Install without no_new_privs: %q, want %q", got.result, want)
	}
}

func TestInstallFiltersCallingThreadOnly(t *testing.T) {
	requireRoot(t)
	got := runChild(t, "thread-only", modeFiltered, Options{Network: NetworkNone}, "")
	if want := "this thread: 2 EPERM; other thread: 0 ok"; got.result != want {
		t.Errorf("%q, want %q", got.result, want)
	}
}

// inheritedResult runs this test binary again as a helper that runs
// scenario under the filter it inherits (modeInherited), and returns its
// result line.
func inheritedResult(scenario string) (string, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), envScenario+"="+scenario, envMode+"="+modeInherited)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%v %s", err, out)
	}
	for line := range strings.Lines(string(out)) {
		if r, ok := strings.CutPrefix(line, resultPrefix); ok {
			return strings.TrimSpace(r), nil
		}
	}
	return "", fmt.Errorf("no result: %s", out)
}
