//go:build linux && (amd64 || arm64)

package seccomp

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"thermite/internal/netpolicy"
)

// These tests run the built program in x/net/bpf's virtual machine on
// hand-made seccomp_data, so every argument combination can be checked
// without a kernel; seccomp_test.go runs the same attacks for real.

// call is one system call as the filter sees it.
type call struct {
	arch uint32 // 0: the native one
	nr   uint32
	args [6]uint64
}

// data lays call out as struct seccomp_data. The virtual machine loads
// words big-endian where the kernel loads them native-endian, so each
// 32-bit word is written big-endian at the offset the program reads.
func (c call) data() []byte {
	b := make([]byte, offsetArgs+6*8)
	arch := c.arch
	if arch == 0 {
		arch = auditArchNative
	}
	binary.BigEndian.PutUint32(b[offsetNr:], c.nr)
	binary.BigEndian.PutUint32(b[offsetArch:], arch)
	for i, v := range c.args {
		binary.BigEndian.PutUint32(b[offsetArgs+8*i+argLowWord:], uint32(v))
		binary.BigEndian.PutUint32(b[offsetArgs+8*i+(4-argLowWord):], uint32(v>>32))
	}
	return b
}

func sys(nr int, args ...uint64) call {
	c := call{nr: uint32(nr)}
	copy(c.args[:], args)
	return c
}

// vm loads what Program built into the virtual machine.
func vm(t testing.TB, o Options) *bpf.VM {
	t.Helper()
	filter, err := Program(o)
	if err != nil {
		t.Fatal(err)
	}
	instructions := make([]bpf.Instruction, len(filter))
	for i, f := range filter {
		instructions[i] = bpf.RawInstruction{Op: f.Code, Jt: f.Jt, Jf: f.Jf, K: f.K}.Disassemble()
	}
	m, err := bpf.NewVM(instructions)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func verdict(t testing.TB, m *bpf.VM, c call) string {
	t.Helper()
	r, err := m.Run(c.data())
	if err != nil {
		t.Fatal(err)
	}
	return actionName(uint32(r))
}

func actionName(a uint32) string {
	switch {
	case a == actionAllow:
		return "allow"
	case a == actionKill:
		return "kill"
	case a&^unix.SECCOMP_RET_DATA == unix.SECCOMP_RET_ERRNO:
		return unix.ErrnoName(unix.Errno(a & unix.SECCOMP_RET_DATA))
	}
	return fmt.Sprintf("action %#x", a)
}

// deniedOutright is issue 7's list of calls denied whatever their
// arguments, written out here rather than taken from the package.
var deniedOutright = map[string]int{
	"mount": unix.SYS_MOUNT, "umount2": unix.SYS_UMOUNT2, "fsopen": unix.SYS_FSOPEN,
	"fsconfig": unix.SYS_FSCONFIG, "fsmount": unix.SYS_FSMOUNT, "fspick": unix.SYS_FSPICK,
	"move_mount": unix.SYS_MOVE_MOUNT, "open_tree": unix.SYS_OPEN_TREE,
	"open_tree_attr": unix.SYS_OPEN_TREE_ATTR, "mount_setattr": unix.SYS_MOUNT_SETATTR,
	"pivot_root": unix.SYS_PIVOT_ROOT, "chroot": unix.SYS_CHROOT,
	"unshare": unix.SYS_UNSHARE, "setns": unix.SYS_SETNS,
	"bpf":    unix.SYS_BPF,
	"keyctl": unix.SYS_KEYCTL, "add_key": unix.SYS_ADD_KEY, "request_key": unix.SYS_REQUEST_KEY,
	"mq_open": unix.SYS_MQ_OPEN, "mq_unlink": unix.SYS_MQ_UNLINK, "mq_timedsend": unix.SYS_MQ_TIMEDSEND,
	"mq_timedreceive": unix.SYS_MQ_TIMEDRECEIVE, "mq_notify": unix.SYS_MQ_NOTIFY, "mq_getsetattr": unix.SYS_MQ_GETSETATTR,
	"kexec_load": unix.SYS_KEXEC_LOAD, "kexec_file_load": unix.SYS_KEXEC_FILE_LOAD,
	"init_module": unix.SYS_INIT_MODULE, "finit_module": unix.SYS_FINIT_MODULE,
	"delete_module": unix.SYS_DELETE_MODULE,
	"reboot":        unix.SYS_REBOOT, "swapon": unix.SYS_SWAPON, "swapoff": unix.SYS_SWAPOFF,
	"settimeofday": unix.SYS_SETTIMEOFDAY, "clock_settime": unix.SYS_CLOCK_SETTIME,
	"clock_adjtime": unix.SYS_CLOCK_ADJTIME, "adjtimex": unix.SYS_ADJTIMEX,
	"userfaultfd":    unix.SYS_USERFAULTFD,
	"io_uring_setup": unix.SYS_IO_URING_SETUP, "io_uring_enter": unix.SYS_IO_URING_ENTER,
	"io_uring_register": unix.SYS_IO_URING_REGISTER,
}

var allOptions = []Options{
	{Network: NetworkNone}, {Network: NetworkAPI}, {Network: NetworkOpen},
	{Network: NetworkNone, AllowPerf: true}, {Network: NetworkAPI, AllowPerf: true},
	{Network: NetworkOpen, AllowPerf: true},
}

func TestProgramDeniesOutright(t *testing.T) {
	for _, o := range allOptions {
		m := vm(t, o)
		for name, nr := range deniedOutright {
			// Whatever the arguments: none, and all bits set.
			for _, c := range []call{sys(nr), sys(nr, ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0))} {
				if got := verdict(t, m, c); got != "EPERM" {
					t.Errorf("%+v: %s(%x): %s, want EPERM", o, name, c.args, got)
				}
			}
		}
		for name, nr := range map[string]int{"clone3": unix.SYS_CLONE3, "openat2": unix.SYS_OPENAT2} {
			if got := verdict(t, m, sys(nr)); got != "ENOSYS" {
				t.Errorf("%+v: %s: %s, want ENOSYS", o, name, got)
			}
		}
		wantPerf := "EPERM"
		if o.AllowPerf {
			wantPerf = "allow"
		}
		if got := verdict(t, m, sys(unix.SYS_PERF_EVENT_OPEN)); got != wantPerf {
			t.Errorf("%+v: perf_event_open: %s, want %s", o, got, wantPerf)
		}
	}
}

func TestProgramAllowsEverydayCalls(t *testing.T) {
	m := vm(t, Options{Network: NetworkNone})
	for name, c := range map[string]call{
		"read":          sys(unix.SYS_READ, 0, 0, 1),
		"getpid":        sys(unix.SYS_GETPID),
		"execve":        sys(unix.SYS_EXECVE),
		"fork-by-clone": sys(unix.SYS_CLONE, sigchld),
		"thread-by-clone": sys(unix.SYS_CLONE, unix.CLONE_VM|unix.CLONE_FS|unix.CLONE_FILES|unix.CLONE_SIGHAND|
			unix.CLONE_THREAD|unix.CLONE_SYSVSEM|unix.CLONE_SETTLS|unix.CLONE_PARENT_SETTID|unix.CLONE_CHILD_CLEARTID),
		"vfork-by-clone":   sys(unix.SYS_CLONE, unix.CLONE_VM|unix.CLONE_VFORK|sigchld),
		"chmod-0644":       sys(unix.SYS_FCHMODAT, atFDCWD, 0, 0o644),
		"ioctl-tiocgwinsz": sys(unix.SYS_IOCTL, 0, unix.TIOCGWINSZ),
		"socket-unix":      sys(unix.SYS_SOCKET, unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC),
		"ptrace-skip":      {nr: skippedSyscall},
		"listmount":        sys(unix.SYS_LISTMOUNT),
	} {
		if got := verdict(t, m, c); got != "allow" {
			t.Errorf("%s: %s, want allow", name, got)
		}
	}
}

// atFDCWD is AT_FDCWD (-100) as a 64-bit argument.
// sigchld is clone's usual exit signal, as a flags word.
const sigchld = uint64(unix.SIGCHLD)

var atFDCWD = func() uint64 { fd := int64(unix.AT_FDCWD); return uint64(fd) }()

func TestProgramKillsForeignABIs(t *testing.T) {
	m := vm(t, Options{Network: NetworkOpen})
	foreign := []uint32{unix.AUDIT_ARCH_I386, unix.AUDIT_ARCH_ARM, unix.AUDIT_ARCH_X86_64, unix.AUDIT_ARCH_AARCH64}
	for _, arch := range foreign {
		if arch == auditArchNative {
			continue
		}
		// getpid's native number, under another ABI: killed all the same.
		if got := verdict(t, m, call{arch: arch, nr: unix.SYS_GETPID}); got != "kill" {
			t.Errorf("arch %#x: %s, want kill", arch, got)
		}
	}
	if !hasX32 {
		return
	}
	for _, nr := range []uint32{unix.SYS_GETPID, unix.SYS_MOUNT, 0, 0x3fffffff} {
		if got := verdict(t, m, call{nr: x32SyscallBit | nr}); got != "kill" {
			t.Errorf("x32 call %#x: %s, want kill", x32SyscallBit|nr, got)
		}
	}
}

func TestProgramCloneFlags(t *testing.T) {
	m := vm(t, Options{Network: NetworkOpen})
	for name, flag := range map[string]uint64{
		"CLONE_NEWNS": unix.CLONE_NEWNS, "CLONE_NEWCGROUP": unix.CLONE_NEWCGROUP,
		"CLONE_NEWUTS": unix.CLONE_NEWUTS, "CLONE_NEWIPC": unix.CLONE_NEWIPC,
		"CLONE_NEWUSER": unix.CLONE_NEWUSER, "CLONE_NEWPID": unix.CLONE_NEWPID,
		"CLONE_NEWNET": unix.CLONE_NEWNET, "CLONE_NEWTIME": unix.CLONE_NEWTIME,
	} {
		if got := verdict(t, m, sys(unix.SYS_CLONE, flag|sigchld)); got != "EPERM" {
			t.Errorf("clone(%s): %s, want EPERM", name, got)
		}
		// With the high half full of garbage, which the kernel ignores.
		if got := verdict(t, m, sys(unix.SYS_CLONE, 0xffffffff00000000|flag)); got != "EPERM" {
			t.Errorf("clone(%s with high garbage): %s, want EPERM", name, got)
		}
		// Only in the high half: the kernel never sees it, nor does the filter.
		if got := verdict(t, m, sys(unix.SYS_CLONE, flag<<32|sigchld)); got != "allow" {
			t.Errorf("clone(%s<<32): %s, want allow", name, got)
		}
	}
}

func TestProgramTerminalInjection(t *testing.T) {
	m := vm(t, Options{Network: NetworkOpen})
	for _, tc := range []struct {
		request uint64
		want    string
	}{
		{unix.TIOCSTI, "EPERM"},
		{unix.TIOCLINUX, "EPERM"},
		{0xffffffff00000000 | unix.TIOCSTI, "EPERM"}, // the kernel reads unsigned int
		{0x0000dead00000000 | unix.TIOCLINUX, "EPERM"},
		{unix.TIOCSTI << 32, "allow"}, // the kernel sees request 0
		{unix.TIOCGWINSZ, "allow"},
		{unix.TIOCSCTTY, "allow"},
		{unix.TIOCINQ, "allow"},
	} {
		if got := verdict(t, m, sys(unix.SYS_IOCTL, 0, tc.request, 0)); got != tc.want {
			t.Errorf("ioctl(%#x): %s, want %s", tc.request, got, tc.want)
		}
	}
}

// PTRACE_TRACEME is refused whole; every other request, and a request with
// high bits (the kernel compares the whole long: not TRACEME), passes.
func TestProgramPtraceTraceMe(t *testing.T) {
	m := vm(t, Options{Network: NetworkOpen})
	for _, tc := range []struct {
		request uint64
		want    string
	}{
		{unix.PTRACE_TRACEME, "EPERM"},
		{1 << 32, "allow"},
		{unix.PTRACE_ATTACH, "allow"},
		{unix.PTRACE_PEEKDATA, "allow"},
		{unix.PTRACE_SEIZE, "allow"},
	} {
		if got := verdict(t, m, sys(unix.SYS_PTRACE, tc.request, 0, 0, 0)); got != tc.want {
			t.Errorf("ptrace(%#x): %s, want %s", tc.request, got, tc.want)
		}
	}
}

// modeCall makes a call with the given mode argument.
type modeCall struct {
	name string
	make func(mode uint64) call
}

func TestProgramSetIDModes(t *testing.T) {
	m := vm(t, Options{Network: NetworkOpen})
	calls := []modeCall{
		{"fchmod", func(mode uint64) call { return sys(unix.SYS_FCHMOD, 3, mode) }},
		{"fchmodat", func(mode uint64) call { return sys(unix.SYS_FCHMODAT, atFDCWD, 0, mode) }},
		{"fchmodat2", func(mode uint64) call { return sys(unix.SYS_FCHMODAT2, atFDCWD, 0, mode, 0) }},
		{"mkdirat", func(mode uint64) call { return sys(unix.SYS_MKDIRAT, atFDCWD, 0, mode) }},
		{"mknodat", func(mode uint64) call { return sys(unix.SYS_MKNODAT, atFDCWD, 0, unix.S_IFREG|mode, 0) }},
		{"openat-creat", func(mode uint64) call {
			return sys(unix.SYS_OPENAT, atFDCWD, 0, unix.O_CREAT|unix.O_WRONLY, mode)
		}},
		{"openat-tmpfile", func(mode uint64) call {
			return sys(unix.SYS_OPENAT, atFDCWD, 0, unix.O_TMPFILE|unix.O_RDWR, mode)
		}},
	}
	calls = append(calls, legacyModeCalls()...)
	for _, c := range calls {
		for mode, want := range map[uint64]string{
			0o4755: "EPERM", 0o2755: "EPERM", 0o6755: "EPERM", 0o4000: "EPERM",
			0xffff0000 | 0o4644: "EPERM",
			0o755:               "allow", 0o644: "allow", 0o1777: "allow", 0o777: "allow",
			0xffff0000 | 0o755: "allow", // bits umode_t drops
		} {
			if got := verdict(t, m, c.make(mode)); got != want {
				t.Errorf("%s mode %#o: %s, want %s", c.name, mode, got, want)
			}
		}
	}
	// Without O_CREAT or O_TMPFILE the mode argument is ignored by the
	// kernel, and by the filter: opening a file, even O_DIRECTORY.
	for _, flags := range []uint64{unix.O_RDONLY, unix.O_RDWR | unix.O_TRUNC, unix.O_DIRECTORY, unix.O_PATH} {
		if got := verdict(t, m, sys(unix.SYS_OPENAT, atFDCWD, 0, flags, 0o4755)); got != "allow" {
			t.Errorf("openat flags %#x with a set-id mode: %s, want allow", flags, got)
		}
	}
}

func TestProgramSockets(t *testing.T) {
	const (
		stream = unix.SOCK_STREAM
		dgram  = unix.SOCK_DGRAM
		flags  = unix.SOCK_NONBLOCK | unix.SOCK_CLOEXEC
	)
	type socketCall struct {
		domain, typ, protocol uint64
	}
	cases := []struct {
		c           socketCall
		none, open_ string
	}{
		{socketCall{unix.AF_UNIX, stream, 0}, "allow", "allow"},
		{socketCall{unix.AF_UNIX, dgram | flags, 0}, "allow", "allow"},
		{socketCall{unix.AF_UNIX, unix.SOCK_SEQPACKET, 0}, "allow", "allow"},
		{socketCall{unix.AF_INET, stream, 0}, "EPERM", "allow"},
		{socketCall{unix.AF_INET, stream | unix.SOCK_CLOEXEC, unix.IPPROTO_TCP}, "EPERM", "allow"},
		{socketCall{unix.AF_INET6, stream | flags, 0}, "EPERM", "allow"},
		{socketCall{unix.AF_INET, stream | 0x100, 0}, "EPERM", "allow"}, // not a known flag
		{socketCall{unix.AF_INET, stream, unix.IPPROTO_MPTCP}, "EPERM", "allow"},
		{socketCall{unix.AF_INET6, stream, unix.IPPROTO_SCTP}, "EPERM", "allow"},
		{socketCall{unix.AF_INET, stream, 256 /* IPPROTO_SMC */}, "EPERM", "allow"},
		{socketCall{unix.AF_INET, dgram, 0}, "EPERM", "allow"},
		{socketCall{unix.AF_INET6, dgram | flags, unix.IPPROTO_UDP}, "EPERM", "allow"},
		{socketCall{unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP}, "EPERM", "allow"},
		{socketCall{unix.AF_INET, unix.SOCK_SEQPACKET, 0}, "EPERM", "allow"},
		{socketCall{unix.AF_PACKET, unix.SOCK_RAW, 0}, "EPERM", "allow"},
		{socketCall{unix.AF_NETLINK, unix.SOCK_RAW, 0}, "EPERM", "allow"},
		{socketCall{unix.AF_VSOCK, stream, 0}, "EPERM", "allow"},
		{socketCall{unix.AF_BLUETOOTH, stream, 0}, "EPERM", "allow"},
		// The kernel reads int arguments: garbage above them changes nothing.
		{socketCall{0xffffffff00000000 | unix.AF_INET, stream, 0}, "EPERM", "allow"},
		{socketCall{0xffffffff00000000 | unix.AF_PACKET, stream, 0}, "EPERM", "allow"},
		{socketCall{unix.AF_INET, 0xffffffff00000000 | dgram, 0}, "EPERM", "allow"},
	}
	// egress is none plus TCP streams over IPv4 and IPv6, with no flag
	// but SOCK_NONBLOCK and SOCK_CLOEXEC (the kernel reads ints).
	egress := func(c socketCall) string {
		domain, typ := uint32(c.domain), uint32(c.typ)&^uint32(unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if (domain == unix.AF_INET || domain == unix.AF_INET6) && typ == stream && c.typ>>32 == 0 && (c.protocol == 0 || c.protocol == unix.IPPROTO_TCP) {
			return "allow"
		}
		if domain == unix.AF_UNIX {
			return "allow"
		}
		return "EPERM"
	}
	for _, policy := range []netpolicy.Network{NetworkNone, NetworkAPI, NetworkEgress, NetworkOpen} {
		m := vm(t, Options{Network: policy})
		for _, tc := range cases {
			// api is none for the filter (issue 13): no TCP socket either.
			want := map[netpolicy.Network]string{NetworkNone: tc.none, NetworkAPI: tc.none, NetworkEgress: egress(tc.c), NetworkOpen: tc.open_}[policy]
			if got := verdict(t, m, sys(unix.SYS_SOCKET, tc.c.domain, tc.c.typ, tc.c.protocol)); got != want {
				t.Errorf("%s: socket(%#x, %#x, %d): %s, want %s", policy, tc.c.domain, tc.c.typ, tc.c.protocol, got, want)
			}
		}
		wantPair := map[netpolicy.Network]string{NetworkNone: "EPERM", NetworkAPI: "EPERM", NetworkEgress: "EPERM", NetworkOpen: "allow"}[policy]
		for _, domain := range []uint64{unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK} {
			if got := verdict(t, m, sys(unix.SYS_SOCKETPAIR, domain, unix.SOCK_STREAM, 0, 0)); got != wantPair {
				t.Errorf("%s: socketpair(%d): %s, want %s", policy, domain, got, wantPair)
			}
		}
		if got := verdict(t, m, sys(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0, 0)); got != "allow" {
			t.Errorf("%s: socketpair(AF_UNIX): %s, want allow", policy, got)
		}
	}
}

func TestProgramLength(t *testing.T) {
	for _, o := range allOptions {
		filter, err := Program(o)
		if err != nil {
			t.Fatal(err)
		}
		// At least a test per denied call; far below the kernel's 4096,
		// and short enough that every call's walk through it stays cheap.
		if n := len(filter); n < len(deniedOutright) || n > 400 {
			t.Errorf("%+v: %d instructions, want %d to 400", o, n, len(deniedOutright))
		}
		last := filter[len(filter)-1]
		if last.Code != unix.BPF_RET|unix.BPF_K || last.K != actionAllow {
			t.Errorf("%+v: the last instruction is %+v, not ret ALLOW", o, last)
		}
		t.Logf("%+v: %d instructions", o, len(filter))
	}
}

func TestProgramRefusesUnknownNetwork(t *testing.T) {
	for _, network := range []netpolicy.Network{"foo", "", "None", "tcp"} {
		_, err := Program(Options{Network: network})
		want := fmt.Sprintf("seccomp: network policy: %q is not one of none, api, egress, open", network)
		if err == nil || err.Error() != want {
			t.Errorf("network %q: error %v, want %q", network, err, want)
		}
		if err := Install(Options{Network: network}); err == nil || err.Error() != want {
			t.Errorf("Install with network %q: error %v, want %q", network, err, want)
		}
	}
}

func TestAssemblerRefusesMistakes(t *testing.T) {
	a := newAssembler()
	a.denyCalls("first", actionEPERM, unix.SYS_MOUNT)
	a.denyCalls("second", actionEPERM, unix.SYS_MOUNT)
	a.ret(actionAllow)
	if _, err := a.assemble(); err == nil || !strings.Contains(err.Error(), "decided twice") {
		t.Errorf("a call decided twice: %v", err)
	}
	a = newAssembler()
	a.jump(a.newLabel())
	a.ret(actionAllow)
	if _, err := a.assemble(); err == nil || !strings.Contains(err.Error(), "never placed") {
		t.Errorf("a jump to nowhere: %v", err)
	}
	a = newAssembler()
	far := a.newLabel()
	a.jump(far)
	for range 300 {
		a.ret(actionAllow)
	}
	a.place(far)
	a.ret(actionAllow)
	if _, err := a.assemble(); err == nil || !strings.Contains(err.Error(), "does not fit") {
		t.Errorf("a jump too far: %v", err)
	}
}

func BenchmarkProgram(b *testing.B) {
	for b.Loop() {
		if _, err := Program(Options{Network: NetworkAPI}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkInstall installs the filter for real, each time on a fresh OS
// thread that then ends: a goroutine that exits while locked takes its
// thread with it, so the filter never reaches the benchmark's own threads
// (and the runtime never clones new threads from a locked one).
func BenchmarkInstall(b *testing.B) {
	errs := make(chan error)
	for b.Loop() {
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
				errs <- err
				return
			}
			errs <- Install(Options{Network: NetworkAPI})
		}()
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
}
