//go:build linux && (amd64 || arm64)

// Package seccomp builds and installs the system-call filter that every
// role command runs under. The spawn path's child loads it (Build, once
// per option set) after no_new_privs and just before execve; the kernel
// keeps a filter across execve and copies it into every child and thread
// the task creates, so the role's whole process tree runs under it.
//
// The filter is a deny list on top of the role's Unix user, Landlock and
// rlimits: it closes the kernel interfaces an unprivileged user still
// reaches (namespaces, io_uring, bpf, keyrings, userfaultfd, terminal
// injection, set-id files, the network per policy) and those a role would
// need a capability for, in case one ever leaks. Each decision is one
// function below, named for what it denies.
//
// The program is classic BPF, written with golang.org/x/net/bpf through a
// small label assembler, so that every argument check compares exactly the
// bits the kernel reads. Each rule decides one system-call number; after
// the architecture check, a binary search on the number reaches its rule
// (dispatch), so no call walks the rules of the others.
package seccomp

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The filter's answers.
const (
	actionAllow = unix.SECCOMP_RET_ALLOW
	// KILL_PROCESS ends every thread at once with SIGSYS; the role cannot
	// catch it (KILL_THREAD would leave the other threads running).
	actionKill   = unix.SECCOMP_RET_KILL_PROCESS
	actionEPERM  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)&unix.SECCOMP_RET_DATA
	actionENOSYS = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)&unix.SECCOMP_RET_DATA
)

// noSyscall stands for a system call the native ABI does not have.
const noSyscall = -1

// skippedSyscall is nr -1: what a ptracer writes into a stopped call to
// skip it. seccomp runs after the ptrace stop and sees it; the kernel
// answers ENOSYS, so the filter lets it pass rather than kill the tracee.
const skippedSyscall = 0xFFFFFFFF

// Program builds the filter (for tests and inspection): the architecture
// check, then one search over the system-call numbers to the rule for the
// call (dispatch), and ALLOW for a call no rule decides.
func Program(o Options) ([]unix.SockFilter, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	a := newAssembler()
	checkArchitecture(a) // first: every later check assumes native numbers
	makeRules(a, o)
	a.dispatch(actionAllow)
	return a.assemble()
}

// makeRules makes the rule of every system call the filter decides for o;
// each decision is one function below, named for what it denies.
func makeRules(a *assembler, o Options) {
	denyMounts(a)
	denyNamespaces(a)
	denyBPF(a)
	denyPerf(a, o.AllowPerf)
	denyKeyrings(a)
	if !o.weakened(WeakenPOSIXQueues) {
		denyPOSIXQueues(a)
	}
	denyKernelReplacement(a)
	denyReboot(a)
	denySwap(a)
	denyClockSetting(a)
	denyUserfaultfd(a)
	denyIOUring(a)
	if !o.weakened(WeakenAIO) {
		denyAIO(a)
	}
	denyTerminalInjection(a)
	refuseStops := !o.weakened(WeakenStopSignals)
	if refuseStops {
		denyStopSignals(a)
	}
	restrictFcntl(a, refuseStops, o.NoWatches)
	if o.NoWatches {
		denyWatches(a)
	}
	denySetIDModes(a)
	if !o.weakened(WeakenSetIDOpenat2) {
		denyOpenat2(a, o.FileHelper || o.Controller)
	}
	if !o.weakened(WeakenSysVIPC) {
		denySharedSysVIPC(a)
	}
	if o.Controller {
		denyPtrace(a)
		restrictControllerSockets(a)
	} else {
		denyTraceMe(a)
		restrictSockets(a, o)
	}
}

// Install loads the filter on the calling OS thread only (no TSYNC), for a
// Go process that execs right after on that thread (the tests); execve keeps
// it. A role's command gets its filter from spawn.Start's child instead,
// the raw system call on Build's program, as its last stage before execve.
// It requires no_new_privs to be set already and fails closed (an error) otherwise.
//
// The caller must hold its OS thread (runtime.LockOSThread) from before
// no_new_privs until execve; both are per thread.
func Install(o Options) error {
	filter, err := Program(o)
	if err != nil {
		return err
	}
	// As root the kernel would accept the filter without no_new_privs
	// (CAP_SYS_ADMIN suffices); the caller's contract is that it is set, and
	// a filter on a thread without it could be shed through a set-id exec.
	nnp, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
	if err != nil {
		return fmt.Errorf("seccomp: reading no_new_privs: %w", err)
	}
	if nnp != 1 {
		return errors.New("seccomp: no_new_privs is not set on this thread; refusing to install the filter")
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	// Flags 0: this thread only. TSYNC would also filter the caller's
	// other runtime threads, which never exec a role's command.
	if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&prog))); errno != 0 {
		return fmt.Errorf("seccomp: installing the filter (%d instructions): %w", len(filter), errno)
	}
	runtime.KeepAlive(filter)
	return nil
}

// checkArchitecture kills a call made through any ABI but the native one.
// The numbers in the rest of the filter are native numbers: through
// another ABI they name other calls, and a deny list would not hold.
func checkArchitecture(a *assembler) {
	kill, checked := a.newLabel(), a.newLabel()
	a.loadArch()
	a.jumpIf(bpf.JumpEqual, auditArchNative, next, kill)
	a.loadNr()
	if hasX32 {
		a.jumpIf(bpf.JumpEqual, skippedSyscall, checked, next)
		a.jumpIf(bpf.JumpBitsSet, x32SyscallBit, kill, checked)
	} else {
		a.jump(checked)
	}
	a.place(kill)
	a.ret(actionKill)
	a.place(checked)
	// From here on the accumulator holds the native system-call number.
}

// denyMounts keeps the file system as the rig built it: no mount or
// unmount through the old or the new mount API, no pivot_root, no chroot.
// An unprivileged user may mount inside its own user namespace; the
// namespaces are denied too, but this does not rely on that.
func denyMounts(a *assembler) {
	a.denyCalls("mounts", actionEPERM,
		unix.SYS_MOUNT, unix.SYS_UMOUNT2,
		unix.SYS_FSOPEN, unix.SYS_FSCONFIG, unix.SYS_FSMOUNT, unix.SYS_FSPICK,
		unix.SYS_MOVE_MOUNT, unix.SYS_OPEN_TREE, unix.SYS_OPEN_TREE_ATTR,
		unix.SYS_MOUNT_SETATTR,
		unix.SYS_PIVOT_ROOT, unix.SYS_CHROOT)
}

// namespaceCloneFlags are the clone flags that create a namespace.
// CLONE_NEWTIME (0x80) shares its bit with clone's exit-signal byte; the
// kernel rejects exit signals above 64, so denying the bit costs nothing.
const namespaceCloneFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET |
	unix.CLONE_NEWTIME

// denyNamespaces keeps a role in the rig's namespaces. A user namespace
// hands an unprivileged user every capability over its own copies of the
// kernel's objects, the door to most privilege-escalation bugs; the other
// namespaces would let a role hide processes, mounts or network from the
// broker. fork and threads (clone without these flags) keep working.
func denyNamespaces(a *assembler) {
	a.denyCalls("namespaces", actionEPERM, unix.SYS_UNSHARE, unix.SYS_SETNS)
	a.syscallBlock("namespaces", unix.SYS_CLONE, func() {
		// The flags are clone's first argument on amd64 and arm64, and the
		// kernel reads only their low 32 bits (lower_32_bits(clone_flags)).
		a.loadArgLow(0)
		a.decide(bpf.JumpBitsSet, namespaceCloneFlags, actionEPERM, actionAllow)
	})
	// clone3 takes its flags in a struct in memory, which a filter cannot
	// read. ENOSYS, not EPERM: glibc and Go then fall back to clone,
	// whose flags are checked above.
	a.denyCalls("namespaces", actionENOSYS, unix.SYS_CLONE3)
}

// denyBPF closes the eBPF verifier and JIT, a large attack surface, and
// the program types that observe other users' processes.
func denyBPF(a *assembler) {
	a.denyCalls("bpf", actionEPERM, unix.SYS_BPF)
}

// denyPerf closes perf_event_open unless the role's options allow it:
// profilers need it, and it reads hardware counters and kernel events
// (perf_event_paranoid decides how much).
func denyPerf(a *assembler, allowPerf bool) {
	if allowPerf {
		return
	}
	a.denyCalls("perf", actionEPERM, unix.SYS_PERF_EVENT_OPEN)
}

// denyKeyrings closes the kernel keyrings: they are not namespaced, and
// the user keyring is shared by every process of a uid, across sessions.
func denyKeyrings(a *assembler) {
	a.denyCalls("keyrings", actionEPERM, unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY)
}

// denyPOSIXQueues closes POSIX message queues. Their names live in one
// mqueue file system per IPC namespace, which every role shares, and
// Landlock refuses a queue only at its open: mq_open(O_CREAT) makes the
// queue first (the mqueue root is 1777) and then answers EACCES, leaving
// the name behind, owned by the role, past its stop. Another role's
// mq_open of that name then gets EACCES where a name never made gets
// ENOENT: a channel of names between any two roles (and a fill of
// fs.mqueue.queues_max for the whole host). Refused here, no queue is
// ever made. (The mq_notify signal reaches only the caller, but with no
// queue to open there is nothing to notify of.)
func denyPOSIXQueues(a *assembler) {
	a.denyCalls("posix message queues", actionEPERM,
		unix.SYS_MQ_OPEN, unix.SYS_MQ_UNLINK, unix.SYS_MQ_TIMEDSEND, unix.SYS_MQ_TIMEDRECEIVE,
		unix.SYS_MQ_NOTIFY, unix.SYS_MQ_GETSETATTR)
}

// denyKernelReplacement closes loading a new kernel or kernel modules
// (these need capabilities a role never has; the filter holds if one
// leaks).
func denyKernelReplacement(a *assembler) {
	a.denyCalls("kernel replacement", actionEPERM,
		unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD,
		unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE)
}

// denyReboot closes reboot (CAP_SYS_BOOT; the filter holds if it leaks).
func denyReboot(a *assembler) {
	a.denyCalls("reboot", actionEPERM, unix.SYS_REBOOT)
}

// denySwap closes swapon and swapoff (CAP_SYS_ADMIN; likewise).
func denySwap(a *assembler) {
	a.denyCalls("swap", actionEPERM, unix.SYS_SWAPON, unix.SYS_SWAPOFF)
}

// denyClockSetting keeps the clock the judge times with: no setting or
// slewing it. adjtimex and clock_adjtime are denied even for a read-only
// query (modes 0), as systemd's ProtectClock does.
func denyClockSetting(a *assembler) {
	a.denyCalls("clock", actionEPERM,
		unix.SYS_SETTIMEOFDAY, unix.SYS_CLOCK_SETTIME, unix.SYS_CLOCK_ADJTIME, unix.SYS_ADJTIMEX)
}

// denyUserfaultfd closes userfaultfd: it lets a process stall the kernel
// in the middle of a copy from user memory, the usual way to win a race
// in a kernel bug.
func denyUserfaultfd(a *assembler) {
	a.denyCalls("userfaultfd", actionEPERM, unix.SYS_USERFAULTFD)
}

// denyIOUring closes io_uring: its operations (open, socket, connect...)
// run in the kernel without a system call, so this filter never sees
// them, and it has been a steady source of kernel bugs.
func denyIOUring(a *assembler) {
	a.denyCalls("io_uring", actionEPERM,
		unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER)
}

// denyAIO closes Linux AIO: a write submitted through io_submit reaches
// the file without the fsnotify event every other write path raises, so
// the incremental disk measure, which re-stats what inotify names, would
// not see a file grow (measured on 6.18: 1 MiB written, no event).
func denyAIO(a *assembler) {
	a.denyCalls("aio", actionEPERM,
		unix.SYS_IO_SETUP, unix.SYS_IO_SUBMIT, unix.SYS_IO_CANCEL, unix.SYS_IO_GETEVENTS,
		unix.SYS_IO_PGETEVENTS, unix.SYS_IO_DESTROY)
}

// denyTerminalInjection closes the two ioctls that write into a terminal's
// input: TIOCSTI types commands into whatever shell reads the terminal (an
// operator's, if a role ever holds one), TIOCLINUX pastes a console's
// selection. Every other ioctl passes.
func denyTerminalInjection(a *assembler) {
	a.syscallBlock("terminal injection", unix.SYS_IOCTL, func() {
		// The request is declared unsigned int in the kernel's ioctl: only
		// its low 32 bits count, so only they are compared.
		a.loadArgLow(1)
		injection := a.newLabel()
		a.jumpIf(bpf.JumpEqual, unix.TIOCSTI, injection, next)
		a.decide(bpf.JumpEqual, unix.TIOCLINUX, actionEPERM, actionAllow)
		a.place(injection)
		a.ret(actionEPERM)
	})
}

// stopSignals are the signals whose default action stops a process.
var stopSignals = []uint32{uint32(unix.SIGSTOP), uint32(unix.SIGTSTP), uint32(unix.SIGTTIN), uint32(unix.SIGTTOU)}

// denyStopSignals refuses every role the power to stop a process: no role
// command has a terminal, so none needs job control, and a stop sent to
// its own user's processes reaches, where Landlock cannot scope signals,
// the broker's new command between its uid switch and execve and the
// broker's stop helper, holding the broker's starts. Each call that names
// a signal for another process is refused when that signal is a stop
// signal, as is F_SETSIG, which picks the signal an F_SETOWN target gets
// for I/O, dnotify and lease breaks. Signal 0, SIGCONT, SIGTERM, SIGKILL
// and the rest pass. The kernel reads every one of these arguments as an
// int (F_SETSIG's too: do_fcntl's argi), so only the low 32 bits count.
//
// What else sets a signal reaches only the caller, so is left open: a
// clone's exit signal goes to the new child's parent, the caller (with
// CLONE_PARENT the kernel gives the child the caller's own exit signal,
// and a reparented child's becomes SIGCHLD); PR_SET_PDEATHSIG, timer_create
// (SIGEV_THREAD_ID must name a thread of the caller's group) and mq_notify
// (closed with every queue call, denyPOSIXQueues) signal the caller itself; a pseudo-terminal's job-control signals reach
// only its own session, one the role made. ptrace's attach stop reaches
// only a process the caller may trace: Landlock keeps ptrace within the
// caller's domain, and the start's child is not dumpable from its uid
// switch on. Other ABIs are killed (checkArchitecture), io_uring is
// closed (denyIOUring).
func denyStopSignals(a *assembler) {
	signalArgument := []struct {
		nr, sig int
	}{
		{unix.SYS_KILL, 1}, {unix.SYS_TKILL, 1}, {unix.SYS_TGKILL, 2},
		{unix.SYS_RT_SIGQUEUEINFO, 1}, {unix.SYS_RT_TGSIGQUEUEINFO, 2},
		{unix.SYS_PIDFD_SEND_SIGNAL, 1},
	}
	for _, c := range signalArgument {
		a.syscallBlock("stop signals", uint32(c.nr), func() {
			a.loadArgLow(c.sig)
			refuseStopSignal(a)
		})
	}
}

// restrictFcntl decides fcntl, which two rules share: F_SETSIG is refused
// a stop signal (setSig, denyStopSignals' rule), and F_NOTIFY, dnotify,
// is refused outright (notify, denyWatches' rule). Every other command
// passes. The command is an unsigned int in the kernel's fcntl.
func restrictFcntl(a *assembler, setSig, notify bool) {
	if !setSig && !notify {
		return
	}
	a.syscallBlock("fcntl", unix.SYS_FCNTL, func() {
		a.loadArgLow(1)
		if !setSig {
			a.decide(bpf.JumpEqual, unix.F_NOTIFY, actionEPERM, actionAllow)
			return
		}
		allow, deny := a.exitLabel(actionAllow), a.exitLabel(actionEPERM)
		if notify {
			a.jumpIf(bpf.JumpEqual, unix.F_NOTIFY, deny, next)
		}
		a.jumpIf(bpf.JumpEqual, unix.F_SETSIG, next, allow)
		a.loadArgLow(2)
		refuseStopSignal(a)
		a.placeExit(allow, actionAllow)
		a.placeExit(deny, actionEPERM)
	})
}

// denyWatches refuses the calls that watch files: inotify, fanotify (an
// unprivileged user may watch with FAN_REPORT_FID) and, in restrictFcntl,
// dnotify. Every role reads /usr, /etc and the run's research folders, so
// a watch there tells a lane when another lane opens its area and when
// the timing user's candidate opens and reads a file: a side channel on
// the judge's timing, and a covert one from a candidate that modulates
// its opens. The add and mark calls are refused too, in case a watch
// descriptor reaches the role from elsewhere.
func denyWatches(a *assembler) {
	var nrs []uint32
	for _, nr := range []int{sysInotifyInit, unix.SYS_INOTIFY_INIT1, unix.SYS_INOTIFY_ADD_WATCH, unix.SYS_FANOTIFY_INIT, unix.SYS_FANOTIFY_MARK} {
		if nr != noSyscall {
			nrs = append(nrs, uint32(nr))
		}
	}
	a.denyCalls("watches", actionEPERM, nrs...)
}

// refuseStopSignal ends a block: EPERM when the accumulator holds a stop
// signal, ALLOW otherwise. The four are one run of numbers (19 to 22 on
// every architecture this package builds for; TestStopSignalsAreOneRun),
// so two comparisons decide it: the kernel compiles every instruction of
// the filter each time a command's is attached.
func refuseStopSignal(a *assembler) {
	allow := a.exitLabel(actionAllow)
	first, last := stopSignals[0], stopSignals[len(stopSignals)-1]
	a.jumpIf(bpf.JumpGreaterOrEqual, first, next, allow)
	a.decide(bpf.JumpGreaterThan, last, actionAllow, actionEPERM)
	a.placeExit(allow, actionAllow)
}

// setIDBits are the mode bits that make an executable run as its owner or
// group.
const setIDBits = unix.S_ISUID | unix.S_ISGID

// createFlags are the open flags under which the kernel uses the mode
// argument: O_CREAT, and O_TMPFILE's own bit (O_TMPFILE includes
// O_DIRECTORY, which alone creates nothing).
const createFlags = unix.O_CREAT | (unix.O_TMPFILE &^ unix.O_DIRECTORY)

// denySetIDModes keeps a role from making a set-user-ID or set-group-ID
// file or folder at all, as systemd's RestrictSUIDSGID does: a set-id
// program the role leaves behind would run with the role's uid for anyone
// who starts it outside no_new_privs. Every call that takes a mode is
// checked (the set-id bits sit in the low 16 bits, which the kernel's
// umode_t keeps); a plain chmod 0644 still works.
func denySetIDModes(a *assembler) {
	modeArgument := []struct {
		nr   int
		mode int // which argument holds the mode
	}{
		{sysChmod, 1}, {unix.SYS_FCHMOD, 1}, {unix.SYS_FCHMODAT, 2}, {unix.SYS_FCHMODAT2, 2},
		{sysCreat, 1},
		{sysMkdir, 1}, {unix.SYS_MKDIRAT, 2},
		{sysMknod, 1}, {unix.SYS_MKNODAT, 2},
	}
	for _, c := range modeArgument {
		if c.nr == noSyscall {
			continue
		}
		a.syscallBlock("set-id modes", uint32(c.nr), func() {
			a.loadArgLow(c.mode)
			a.decide(bpf.JumpBitsSet, setIDBits, actionEPERM, actionAllow)
		})
	}
	// open and openat use the mode only when they create.
	flagsThenMode := []struct {
		nr, flags, mode int
	}{
		{sysOpen, 1, 2}, {unix.SYS_OPENAT, 2, 3},
	}
	for _, c := range flagsThenMode {
		if c.nr == noSyscall {
			continue
		}
		a.syscallBlock("set-id modes", uint32(c.nr), func() {
			creates := a.newLabel()
			a.loadArgLow(c.flags)
			a.jumpIf(bpf.JumpBitsSet, createFlags, creates, next)
			a.ret(actionAllow)
			a.place(creates)
			a.loadArgLow(c.mode)
			a.decide(bpf.JumpBitsSet, setIDBits, actionEPERM, actionAllow)
		})
	}
}

// denyTraceMe refuses PTRACE_TRACEME: it makes the caller's parent its
// tracer, and the parent of a role's command (and of every orphan, the
// broker being the child subreaper) is the root broker, whose wait would
// then see the role's stops. Tracing its own children stays allowed.
// request is a long the kernel compares whole, so both halves must be 0.
func denyTraceMe(a *assembler) {
	a.syscallBlock("ptrace traceme", unix.SYS_PTRACE, func() {
		allow := a.newLabel()
		a.loadArgLow(0)
		a.jumpIf(bpf.JumpEqual, unix.PTRACE_TRACEME, next, allow)
		a.loadArgHigh(0)
		a.decide(bpf.JumpEqual, 0, actionEPERM, actionAllow)
		a.place(allow)
		a.ret(actionAllow)
	})
}

// denyPtrace closes ptrace and the cross-process memory calls for the
// controller daemon: it never debugs anything, and a flaw in its parsing
// must not reach into the processes of its own user (a kit's check) or,
// through PTRACE_TRACEME, hand the broker a tracee.
func denyPtrace(a *assembler) {
	a.denyCalls("ptrace", actionEPERM, unix.SYS_PTRACE, unix.SYS_PROCESS_VM_READV, unix.SYS_PROCESS_VM_WRITEV)
}

// denyOpenat2 answers openat2 with ENOSYS: its flags and mode sit in a
// struct in memory, which a filter cannot read, so a role could make a
// set-id file through it. glibc and Go fall back to openat on ENOSYS, whose
// mode denySetIDModes checks. The lane's file helper keeps openat2
// (fileHelper): it needs RESOLVE_BENEATH, and it refuses any mode beyond
// 0777 before it creates anything.
func denyOpenat2(a *assembler, fileHelper bool) {
	if fileHelper {
		return
	}
	a.denyCalls("openat2", actionENOSYS, unix.SYS_OPENAT2)
}

// sysvOthersBits are the group and other permission bits of a SysV IPC
// object's mode.
const sysvOthersBits = 0o077

// sysvCmdMask keeps the command of a *ctl call without IPC_64 (0x100),
// which callers may or in; the kernel takes the rest as the command.
const sysvCmdMask = 0xff

// denySharedSysVIPC keeps SysV shared memory, message queues and semaphores
// private to the user that made them, as no other channel between roles
// may exist: a *get whose flags grant any group or other permission is
// refused (those bits are the new object's mode, or the access asked of an
// existing one), and so is IPC_SET, which could open an object up later or
// hand it to another uid. An object of mode 0600 still works within one
// command, and the stop helper removes every object of a user it stops.
// POSIX message queues are denyPOSIXQueues'.
func denySharedSysVIPC(a *assembler) {
	gets := []struct{ nr, flags int }{
		{unix.SYS_SHMGET, 2}, {unix.SYS_MSGGET, 1}, {unix.SYS_SEMGET, 2},
	}
	for _, c := range gets {
		a.syscallBlock("sysv ipc", uint32(c.nr), func() {
			// The flags are an int: only the low 32 bits count.
			a.loadArgLow(c.flags)
			a.decide(bpf.JumpBitsSet, sysvOthersBits, actionEPERM, actionAllow)
		})
	}
	ctls := []struct{ nr, cmd int }{
		{unix.SYS_SHMCTL, 1}, {unix.SYS_MSGCTL, 1}, {unix.SYS_SEMCTL, 2},
	}
	for _, c := range ctls {
		a.syscallBlock("sysv ipc", uint32(c.nr), func() {
			a.loadArgLow(c.cmd)
			a.and(sysvCmdMask)
			a.decide(bpf.JumpEqual, unix.IPC_SET, actionEPERM, actionAllow)
		})
	}
}

// restrictSockets applies the role's network policy to socket and
// socketpair, the only calls that create a socket (x86_64 and arm64 have
// no socketcall; io_uring's socket operation is closed by denyIOUring).
//
//   - none and api: AF_UNIX only. An api role reaches the harness API
//     through its unix socket; Landlock pins TCP ports, not addresses, so
//     any TCP would reach every address on the API's port.
//   - egress: AF_UNIX, and AF_INET or AF_INET6 TCP stream sockets: the
//     command runs in a network namespace of its own whose one listener
//     is its egress proxy, and Landlock lets it connect to that port only.
//   - open: no check.
//
// NoUnixSockets refuses socket(AF_UNIX) under every policy: a unix socket
// is how a command reaches a listener another role made in a folder it
// opened to all, or listens for one, and Landlock bounds only the bind.
// socketpair stays AF_UNIX only: its pair has no name to reach.
//
// Everything refused gets EPERM. socketpair is AF_UNIX only under none and
// api (no other family implements it).
func restrictSockets(a *assembler, o Options) {
	policy := o.Network
	if policy == NetworkAPI && o.weakened(WeakenAPITCP) {
		policy = networkAPITCP
	}
	switch policy {
	case NetworkOpen:
		if o.NoUnixSockets {
			a.syscallBlock("network", unix.SYS_SOCKET, func() {
				a.loadArgLow(0) // domain, an int
				a.decide(bpf.JumpEqual, unix.AF_UNIX, actionEPERM, actionAllow)
			})
		}
		return
	case NetworkNone, NetworkAPI:
		if o.NoUnixSockets {
			// No socket at all: AF_UNIX is refused, and the policy
			// refuses every other family.
			a.denyCalls("network", actionEPERM, unix.SYS_SOCKET)
			break
		}
		a.syscallBlock("network", unix.SYS_SOCKET, func() {
			a.loadArgLow(0) // domain, an int
			a.decide(bpf.JumpEqual, unix.AF_UNIX, actionAllow, actionEPERM)
		})
	case networkAPITCP, NetworkEgress:
		// egress; or, in a thermite_weaken test build only, api as it was
		// before issue 13: TCP over AF_INET and AF_INET6 beside AF_UNIX.
		a.syscallBlock("network", unix.SYS_SOCKET, func() {
			inet, deny := a.newLabel(), a.newLabel()
			a.loadArgLow(0) // domain, an int
			a.jumpIf(bpf.JumpEqual, unix.AF_UNIX, next, inet)
			if o.NoUnixSockets {
				a.ret(actionEPERM)
			} else {
				a.ret(actionAllow)
			}
			a.place(inet)
			ipFamily := a.newLabel()
			a.jumpIf(bpf.JumpEqual, unix.AF_INET, ipFamily, next)
			a.jumpIf(bpf.JumpEqual, unix.AF_INET6, ipFamily, deny)
			a.place(ipFamily)
			a.loadArgLow(1) // type, an int: the socket type plus creation flags
			a.and(^uint32(unix.SOCK_NONBLOCK | unix.SOCK_CLOEXEC))
			a.jumpIf(bpf.JumpEqual, unix.SOCK_STREAM, next, deny)
			a.loadArgLow(2) // protocol, an int; 0 picks TCP for a stream
			tcp := a.newLabel()
			a.jumpIf(bpf.JumpEqual, 0, tcp, next)
			a.jumpIf(bpf.JumpEqual, unix.IPPROTO_TCP, tcp, deny)
			a.place(tcp)
			a.ret(actionAllow)
			a.place(deny)
			a.ret(actionEPERM)
		})
	default:
		a.fail(fmt.Errorf("seccomp: no socket rules for network policy %q", policy))
		return
	}
	unixSocketPairsOnly(a)
}

// unixSocketPairsOnly lets socketpair make AF_UNIX pairs alone, for roles
// and the controller alike.
func unixSocketPairsOnly(a *assembler) {
	a.syscallBlock("network", unix.SYS_SOCKETPAIR, func() {
		a.loadArgLow(0) // domain, an int
		a.decide(bpf.JumpEqual, unix.AF_UNIX, actionAllow, actionEPERM)
	})
}

// restrictControllerSockets is the controller daemon's network: AF_UNIX
// (its sockets, the broker's); TCP and UDP over IPv4 and IPv6 (the API's
// TCP listener, fetch and its DNS lookups); and AF_NETLINK for
// NETLINK_ROUTE alone, which Go's net package uses to list the host's
// addresses. Raw and packet sockets, other IP protocols (ICMP, SCTP,
// MPTCP) and every other netlink family (audit, uevents, netfilter...)
// get EPERM; socketpair is AF_UNIX only.
func restrictControllerSockets(a *assembler) {
	a.syscallBlock("network", unix.SYS_SOCKET, func() {
		notUnix, ipFamily, notIP, stream, dgram, allow, deny := a.newLabel(), a.newLabel(), a.newLabel(), a.newLabel(), a.newLabel(), a.newLabel(), a.newLabel()
		a.loadArgLow(0) // domain, an int
		a.jumpIf(bpf.JumpEqual, unix.AF_UNIX, allow, notUnix)
		a.place(notUnix)
		a.jumpIf(bpf.JumpEqual, unix.AF_INET, ipFamily, next)
		a.jumpIf(bpf.JumpEqual, unix.AF_INET6, ipFamily, notIP)
		a.place(ipFamily)
		a.loadArgLow(1) // type, an int: the socket type plus creation flags
		a.and(^uint32(unix.SOCK_NONBLOCK | unix.SOCK_CLOEXEC))
		a.jumpIf(bpf.JumpEqual, unix.SOCK_STREAM, stream, next)
		a.jumpIf(bpf.JumpEqual, unix.SOCK_DGRAM, dgram, deny)
		a.place(stream)
		a.loadArgLow(2) // protocol, an int; 0 picks TCP for a stream
		a.jumpIf(bpf.JumpEqual, 0, allow, next)
		a.jumpIf(bpf.JumpEqual, unix.IPPROTO_TCP, allow, deny)
		a.place(dgram)
		a.loadArgLow(2) // 0 picks UDP for a datagram socket
		a.jumpIf(bpf.JumpEqual, 0, allow, next)
		a.jumpIf(bpf.JumpEqual, unix.IPPROTO_UDP, allow, deny)
		a.place(notIP)
		a.jumpIf(bpf.JumpEqual, unix.AF_NETLINK, next, deny)
		a.loadArgLow(2) // the netlink family
		a.jumpIf(bpf.JumpEqual, unix.NETLINK_ROUTE, allow, deny)
		a.place(allow)
		a.ret(actionAllow)
		a.place(deny)
		a.ret(actionEPERM)
	})
	unixSocketPairsOnly(a)
}
