//go:build linux && (amd64 || arm64)

package seccomp

import (
	"math/rand/v2"
	"slices"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"thermite/internal/netpolicy"
)

// everyOptionSet is each role option set, the controller's, and each with
// every rule a thermite_weaken build can leave out (which only such a build
// honours, so in a plain build they repeat the strict set).
func everyOptionSet() []Options {
	var out []Options
	for _, network := range []netpolicy.Network{NetworkNone, NetworkAPI, NetworkEgress, NetworkOpen} {
		for _, perf := range []bool{false, true} {
			for _, helper := range []bool{false, true} {
				out = append(out, Options{Network: network, AllowPerf: perf, FileHelper: helper})
			}
			// The judge's users: no unix socket, no watch.
			out = append(out, Options{Network: network, AllowPerf: perf, NoUnixSockets: true, NoWatches: true},
				Options{Network: network, AllowPerf: perf, NoUnixSockets: true},
				Options{Network: network, AllowPerf: perf, NoWatches: true})
		}
	}
	out = append(out, ControllerOptions())
	var weakened []Options
	for _, o := range out {
		for _, w := range [][]string{{WeakenSysVIPC}, {WeakenSetIDOpenat2}, {WeakenAPITCP}, {WeakenSysVIPC, WeakenSetIDOpenat2, WeakenAPITCP}} {
			o.Weakened = w
			weakened = append(weakened, o)
		}
	}
	return append(out, weakened...)
}

// interestingArgs are the argument values the rules compare with, plain and
// with garbage in the high half (which the kernel drops for int arguments).
var interestingArgs = func() []uint64 {
	low := []uint64{
		0, 1, 2, 3, 0xffffffff,
		unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK, unix.AF_PACKET, unix.AF_VSOCK,
		unix.SOCK_STREAM, unix.SOCK_DGRAM, unix.SOCK_RAW, unix.SOCK_SEQPACKET,
		unix.SOCK_STREAM | unix.SOCK_CLOEXEC | unix.SOCK_NONBLOCK, unix.SOCK_DGRAM | unix.SOCK_CLOEXEC, unix.SOCK_STREAM | 0x100,
		unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_ICMP, unix.IPPROTO_SCTP, unix.IPPROTO_MPTCP,
		unix.NETLINK_ROUTE, unix.NETLINK_AUDIT,
		unix.TIOCSTI, unix.TIOCLINUX, unix.TIOCGWINSZ, unix.TIOCSCTTY,
		unix.IPC_SET, unix.IPC_SET | 0x100, unix.IPC_RMID, unix.IPC_STAT,
		0o600, 0o666, 0o604, unix.IPC_CREAT | 0o600, unix.IPC_CREAT | 0o644,
		unix.O_CREAT | unix.O_WRONLY, unix.O_TMPFILE | unix.O_RDWR, unix.O_DIRECTORY, unix.O_PATH,
		0o4755, 0o2755, 0o6755, 0o755, 0o1777, unix.S_IFREG | 0o4755,
		unix.CLONE_NEWUSER | sigchld, unix.CLONE_NEWNET, unix.CLONE_NEWTIME, uint64(unix.SIGCHLD),
		unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD,
		unix.PTRACE_TRACEME, unix.PTRACE_ATTACH,
		unix.F_NOTIFY, unix.F_SETSIG, unix.F_GETFL, uint64(unix.SIGSTOP), uint64(unix.SIGUSR1),
	}
	out := slices.Clone(low)
	for _, v := range low {
		out = append(out, v|0xffffffff00000000, v<<32)
	}
	return out
}()

// argVectors are the argument sets each call is tried with: every
// interesting value alone in each of the first four places, and random
// mixes of them (seeded, so a failure repeats).
func argVectors() [][6]uint64 {
	out := [][6]uint64{{}, {^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0)}}
	for i := range 4 {
		for _, v := range interestingArgs {
			var args [6]uint64
			args[i] = v
			out = append(out, args)
		}
	}
	r := rand.New(rand.NewPCG(16, 230))
	for range 400 {
		var args [6]uint64
		for i := range args {
			args[i] = interestingArgs[r.IntN(len(interestingArgs))]
		}
		out = append(out, args)
	}
	return out
}

// numbersToTry are every native number up to past the highest the rules
// name, each rule's neighbours, the x32 numbers, the ptrace skip, and the
// far ends of the 32-bit space.
func numbersToTry(rules []rule) []uint32 {
	highest := uint32(0)
	for _, r := range rules {
		highest = max(highest, r.nr)
	}
	var out []uint32
	for nr := uint32(0); nr <= highest+64; nr++ {
		out = append(out, nr, x32SyscallBit|nr)
	}
	return append(out, 0x3fffffff, 0x40000000, 0x7fffffff, 0x80000000, 0xbfffffff, 0xc0000000, 0xfffffffe, skippedSyscall)
}

// rawVM loads a program into the virtual machine.
func rawVM(t testing.TB, filter []unix.SockFilter) *bpf.VM {
	t.Helper()
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

// TestDispatchDecidesAsTheLinearList: for every option set, every system
// call number and ABI, and arguments that reach each side of every rule's
// checks, the dispatched program answers exactly what the linear list of
// rules answers (linearProgram, the program as it was built before).
func TestDispatchDecidesAsTheLinearList(t *testing.T) {
	vectors := argVectors()
	for _, o := range everyOptionSet() {
		tree, err := Program(o)
		if err != nil {
			t.Fatal(err)
		}
		linear, err := linearProgram(o)
		if err != nil {
			t.Fatal(err)
		}
		a := newAssembler()
		makeRules(a, o)
		withBody := map[uint32]bool{}
		for _, r := range a.rules {
			withBody[r.nr] = r.body != nil
		}
		newVM, oldVM := rawVM(t, tree), rawVM(t, linear)
		compare := func(c call) {
			got, err1 := newVM.Run(c.data())
			want, err2 := oldVM.Run(c.data())
			if err1 != nil || err2 != nil {
				t.Fatalf("%+v: %v, %v", o, err1, err2)
			}
			if got != want {
				t.Errorf("%+v: arch %#x nr %#x args %#x: %s, the linear list %s", o, c.arch, c.nr, c.args, actionName(uint32(got)), actionName(uint32(want)))
			}
		}
		for _, nr := range numbersToTry(a.rules) {
			tries := vectors[:2] // a call no rule reads the arguments of
			if withBody[nr] {
				tries = vectors
			}
			for _, args := range tries {
				compare(call{nr: nr, args: args})
			}
		}
		for _, arch := range []uint32{unix.AUDIT_ARCH_I386, unix.AUDIT_ARCH_X86_64, unix.AUDIT_ARCH_ARM, unix.AUDIT_ARCH_AARCH64, 0xffffffff} {
			for _, nr := range []uint32{0, unix.SYS_GETPID, unix.SYS_MOUNT, unix.SYS_SOCKET, skippedSyscall} {
				compare(call{arch: arch, nr: nr})
			}
		}
		if t.Failed() {
			return
		}
	}
}

// untilDecided walks filter as the kernel does when it attaches it
// (seccomp_is_const_allow): it knows the number and the architecture only,
// so it stops at the first load of an argument. It returns how many
// instructions it ran, and whether it ended in a return of ALLOW.
func untilDecided(filter []unix.SockFilter, arch, nr uint32) (steps int, allowed bool) {
	var acc uint32
	for pc := 0; pc < len(filter); pc++ {
		in := filter[pc]
		steps++
		switch in.Code {
		case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
			switch in.K {
			case offsetNr:
				acc = nr
			case offsetArch:
				acc = arch
			default:
				return steps, false // an argument: the filter must run for every call
			}
		case unix.BPF_RET | unix.BPF_K:
			return steps, in.K == actionAllow
		case unix.BPF_JMP | unix.BPF_JA:
			pc += int(in.K)
		case unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K,
			unix.BPF_JMP | unix.BPF_JGT | unix.BPF_K, unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K:
			var taken bool
			switch in.Code & 0xf0 {
			case unix.BPF_JEQ:
				taken = acc == in.K
			case unix.BPF_JGE:
				taken = acc >= in.K
			case unix.BPF_JGT:
				taken = acc > in.K
			case unix.BPF_JSET:
				taken = acc&in.K != 0
			}
			if taken {
				pc += int(in.Jt)
			} else {
				pc += int(in.Jf)
			}
		case unix.BPF_ALU | unix.BPF_AND | unix.BPF_K:
			acc &= in.K
		default:
			return steps, false // the kernel gives up on an instruction it does not emulate
		}
	}
	return steps, false
}

// maxDispatchSteps bounds the instructions before any call's rule is
// reached: five for the architecture and x32 checks, one comparison per
// level of a search over up to 256 runs of numbers, and the return.
const maxDispatchSteps = 5 + 8 + 1

// TestEveryCallReachesItsRuleQuickly: the kernel walks the filter for
// every number when it attaches it, and runs it on every call that has
// argument checks; no number takes more than maxDispatchSteps instructions
// to reach its rule (the linear list took up to one per rule before it).
// Every call the filter allows whatever its arguments is still one the
// kernel can see it allows without running it (its bitmap cache).
func TestEveryCallReachesItsRuleQuickly(t *testing.T) {
	for _, o := range everyOptionSet() {
		tree, err := Program(o)
		if err != nil {
			t.Fatal(err)
		}
		linear, err := linearProgram(o)
		if err != nil {
			t.Fatal(err)
		}
		a := newAssembler()
		makeRules(a, o)
		worst, worstLinear, total, totalLinear := 0, 0, 0, 0
		for _, nr := range numbersToTry(a.rules) {
			steps, allowed := untilDecided(tree, auditArchNative, nr)
			stepsLinear, allowedLinear := untilDecided(linear, auditArchNative, nr)
			if steps > maxDispatchSteps {
				t.Errorf("%+v: nr %#x takes %d instructions to decide, want at most %d", o, nr, steps, maxDispatchSteps)
			}
			if allowed != allowedLinear {
				t.Errorf("%+v: nr %#x: always allowed %v, in the linear list %v", o, nr, allowed, allowedLinear)
			}
			worst, worstLinear = max(worst, steps), max(worstLinear, stepsLinear)
			if nr < 512 {
				total, totalLinear = total+steps, totalLinear+stepsLinear
			}
		}
		if len(o.Weakened) == 0 {
			t.Logf("%+v: %d instructions; at most %d to decide a call (linear %d), %d for numbers 0-511 (linear %d)",
				o, len(tree), worst, worstLinear, total, totalLinear)
		}
	}
}

// A rule made but never dispatched would decide nothing: refused.
func TestAssemblerRefusesRulesNeverDispatched(t *testing.T) {
	a := newAssembler()
	checkArchitecture(a)
	a.denyCalls("mounts", actionEPERM, unix.SYS_MOUNT)
	a.ret(actionAllow)
	if _, err := a.assemble(); err == nil || err.Error() != "seccomp: 1 rules made but never dispatched" {
		t.Errorf("rules never dispatched: %v", err)
	}
}

// With no rule at all the dispatch is the one return of otherwise.
func TestDispatchWithoutRulesAnswersOtherwise(t *testing.T) {
	a := newAssembler()
	checkArchitecture(a)
	a.dispatch(actionEPERM)
	filter, err := a.assemble()
	if err != nil {
		t.Fatal(err)
	}
	m := rawVM(t, filter)
	for _, nr := range []uint32{0, unix.SYS_GETPID, skippedSyscall} {
		if got, _ := m.Run(call{nr: nr}.data()); uint32(got) != actionEPERM {
			t.Errorf("nr %#x: %s, want EPERM", nr, actionName(uint32(got)))
		}
	}
}
