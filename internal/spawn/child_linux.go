package spawn

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The runtime's fork hooks, as package syscall uses them: BeforeFork
// blocks signals on this thread and makes any stack growth fatal,
// AfterFork undoes that in the parent, AfterForkInChild resets the
// child's signal handlers and mask.
//
//go:linkname runtimeBeforeFork syscall.runtime_BeforeFork
func runtimeBeforeFork()

//go:linkname runtimeAfterFork syscall.runtime_AfterFork
func runtimeAfterFork()

//go:linkname runtimeAfterForkInChild syscall.runtime_AfterForkInChild
func runtimeAfterForkInChild()

// The runtime's system call hooks: entersyscall lets this goroutine's P
// go for as long as the clone below waits (so the scheduler and the
// collector go on without this thread), exitsyscall takes one back.
//
//go:linkname runtimeEntersyscall runtime.entersyscall
func runtimeEntersyscall()

//go:linkname runtimeExitsyscall runtime.exitsyscall
func runtimeExitsyscall()

// rawVfork is clone or clone3 for a child that shares this stack until
// it execs (vfork_*.s).
func rawVfork(trap, a1, a2, a3 uintptr) (r1 uintptr, errno syscall.Errno)

// rt_sigprocmask's how, the same on every Linux architecture this builds for.
const (
	sigBlock   = 0
	sigSetmask = 2
)

// zeroPID is what the child writes to cgroup.procs: "0" moves the writer.
var zeroPID = [1]byte{'0'}

// forkExec clones the child and, in it, carries out p up to execve.
// The child shares this goroutine's stack and memory (CLONE_VM|CLONE_VFORK)
// until it execs or exits, so after the clone it must not allocate, grow
// the stack, return from this frame, or write anything but its own locals
// and p's working copies (from, capData), which the parent never reads
// again: every variable is declared before the clone and every call after
// it is a raw system call or a nosplit function. The parent is suspended until
// the child execs or exits, and returns at once.
//
//go:noinline
//go:norace
//go:nocheckptr
func forkExec(p *prepared, pidfd *int32) (pid uintptr, errno syscall.Errno) {
	var (
		i, fd, to, j  int
		report, spare int
		err1          syscall.Errno
		sawEACCES     bool
		rec           record
		ts            unix.Timespec
		ru            unix.Rusage
		oldClone      bool
		timerID       int32
		killID        int32
	)

	// The mask BeforeFork saves and the child must restore: all threads
	// of the runtime run with the same one.
	syscall.RawSyscall6(unix.SYS_RT_SIGPROCMASK, sigBlock, 0, uintptr(unsafe.Pointer(&p.sigmask)), 8, 0, 0)
	runtimeBeforeFork()
	// The parent waits in the clone until the child execs or exits; a
	// child stopped there (SIGSTOP from its user, where no Landlock signal
	// scope keeps it out) would otherwise hold this P, and with it every
	// stop-the-world of the collector, keepGoing included, for as long as
	// it stays stopped. In the system call state the runtime never moves
	// this stack and scans it from this frame up, where the only live
	// pointers are p and pidfd (go build -gcflags=-live), which the child
	// never writes; the child's calls run below.
	runtimeEntersyscall()
	pid, errno = rawVfork(unix.SYS_CLONE3, uintptr(unsafe.Pointer(p.clone3)), unsafe.Sizeof(*p.clone3), 0)
	if errno == unix.ENOSYS && p.clone3.flags&unix.CLONE_INTO_CGROUP == 0 {
		oldClone = true
		pid, errno = rawVfork(unix.SYS_CLONE, p.cloneFlg|uintptr(unix.SIGCHLD), 0, uintptr(unsafe.Pointer(pidfd)))
	}
	if errno != 0 || pid != 0 {
		// The parent: the child has exec'd or exited by now. It says so
		// at once, before it may wait for a P: keepGoing stops sending
		// SIGCONT to a command that may stop itself. A plain aligned
		// store (keepGoing loads it atomically): under the race detector
		// sync/atomic calls into the race runtime, which this goroutine,
		// without a P here, may not (it crashed the tests).
		// The fork's lock on this M goes next: taking a P back may park
		// this goroutine, which the scheduler refuses while it is held.
		p.back = 1
		runtimeAfterFork()
		runtimeExitsyscall()
		return
	}

	// The child.
	if oldClone {
		runtimeAfterForkInChild()
	} else if _, _, err1 = syscall.RawSyscall6(unix.SYS_RT_SIGPROCMASK, sigSetmask, uintptr(unsafe.Pointer(&p.sigmask)), 0, 8, 0, 0); err1 != 0 {
		// The handlers are the defaults already (CLONE_CLEAR_SIGHAND):
		// only the mask is the runtime's, every signal blocked.
		childFail(report, StageSignalMask, err1, 0)
	}
	report = p.report
	spare = p.spare

	// The child watches itself as keepGoing does: from its uid switch on,
	// any process of the user may stop it, and keepGoing is a goroutine,
	// which a loaded broker may not run in time. Timers of its own send it
	// SIGCONT from stuckAfter on, every stuckEvery, and SIGKILL at
	// giveUpAfter, whatever the broker does meanwhile; SIGCONT left at its
	// default interrupts nothing, and execve deletes both timers, so none
	// reaches the command.
	if !p.unguarded {
		if _, _, err1 = syscall.RawSyscall(unix.SYS_TIMER_CREATE, unix.CLOCK_MONOTONIC, uintptr(unsafe.Pointer(&p.contEvent)), uintptr(unsafe.Pointer(&timerID))); err1 != 0 {
			childFail(report, StageContinue, err1, 0)
		}
		if _, _, err1 = syscall.RawSyscall6(unix.SYS_TIMER_SETTIME, uintptr(timerID), 0, uintptr(unsafe.Pointer(&p.contEvery)), 0, 0, 0); err1 != 0 {
			childFail(report, StageContinue, err1, 1)
		}
		if _, _, err1 = syscall.RawSyscall(unix.SYS_TIMER_CREATE, unix.CLOCK_MONOTONIC, uintptr(unsafe.Pointer(&p.killEvent)), uintptr(unsafe.Pointer(&killID))); err1 != 0 {
			childFail(report, StageContinue, err1, 2)
		}
		if _, _, err1 = syscall.RawSyscall6(unix.SYS_TIMER_SETTIME, uintptr(killID), 0, uintptr(unsafe.Pointer(&p.killAt)), 0, 0, 0); err1 != 0 {
			childFail(report, StageContinue, err1, 3)
		}
	}

	// Its own session: the broker signals the command's process group,
	// and no terminal of the broker's reaches it.
	if _, _, err1 = syscall.RawSyscall(unix.SYS_SETSID, 0, 0, 0); err1 != 0 {
		childFail(report, StageSetsid, err1, 0)
	}
	// cgroup v1: in its group before the command exists, written as root.
	for i = 0; i < len(p.cgroupProcs); i++ {
		if _, _, err1 = syscall.RawSyscall(unix.SYS_WRITE, uintptr(p.cgroupProcs[i]), uintptr(unsafe.Pointer(&zeroPID[0])), 1); err1 != 0 {
			childFail(report, StageCgroup, err1, i)
		}
	}
	// setns needs CAP_SYS_ADMIN, so it comes while the child is root.
	if p.netns >= 0 {
		if _, _, err1 = syscall.RawSyscall(unix.SYS_SETNS, uintptr(p.netns), unix.CLONE_NEWNET, 0); err1 != 0 {
			childFail(report, StageNetNS, err1, 0)
		}
	}
	if len(p.cpuMask) > 0 {
		if _, _, err1 = syscall.RawSyscall(unix.SYS_SCHED_SETAFFINITY, 0, uintptr(len(p.cpuMask)*8), uintptr(unsafe.Pointer(&p.cpuMask[0]))); err1 != 0 {
			childFail(report, StageAffinity, err1, 0)
		}
	}
	// no_new_privs before Landlock and seccomp, which require it of a
	// task without CAP_SYS_ADMIN, and so that no set-id exec sheds them.
	if _, _, err1 = syscall.RawSyscall6(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0, 0); err1 != 0 {
		childFail(report, StageNoNewPrivs, err1, 0)
	}
	if p.landlock >= 0 {
		if _, _, err1 = syscall.RawSyscall(unix.SYS_LANDLOCK_RESTRICT_SELF, uintptr(p.landlock), 0, 0); err1 != 0 {
			childFail(report, StageLandlock, err1, 0)
		}
	}
	// A weakened test build keeps its permitted set through setresuid, to
	// raise an ambient capability from it.
	if p.ambient != 0 {
		if _, _, err1 = syscall.RawSyscall6(unix.SYS_PRCTL, unix.PR_SET_KEEPCAPS, 1, 0, 0, 0, 0); err1 != 0 {
			childFail(report, StageCapabilities, err1, 0)
		}
	}
	// Credentials, groups first: after setresuid the child may not.
	if len(p.groups) > 0 {
		_, _, err1 = syscall.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(p.groups)), uintptr(unsafe.Pointer(&p.groups[0])), 0)
	} else {
		_, _, err1 = syscall.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0)
	}
	if err1 != 0 {
		childFail(report, StageGroups, err1, 0)
	}
	if _, _, err1 = syscall.RawSyscall(unix.SYS_SETRESGID, p.gid, p.gid, p.gid); err1 != 0 {
		childFail(report, StageGID, err1, 0)
	}
	if _, _, err1 = syscall.RawSyscall(unix.SYS_SETRESUID, p.uid, p.uid, p.uid); err1 != 0 {
		childFail(report, StageUID, err1, 0)
	}
	// A stop's first blow, the very next system call as the user (never
	// root: prepare refuses uid 0): every other process of the user,
	// which from now on could kill this child before it stops them.
	if p.killUser {
		syscall.RawSyscall(unix.SYS_KILL, ^uintptr(0), uintptr(unix.SIGKILL), 0)
	}
	// Not dumpable: no other process of the user may ptrace this child,
	// which shares the broker's memory until its execve.
	if _, _, err1 = syscall.RawSyscall6(unix.SYS_PRCTL, unix.PR_SET_DUMPABLE, 0, 0, 0, 0, 0); err1 != 0 {
		childFail(report, StageDumpable, err1, 0)
	}
	// setresuid emptied the permitted and effective sets; inheritable is
	// emptied here, and with it the ambient set.
	if p.ambient == 0 {
		if _, _, err1 = syscall.RawSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&p.capHdr)), uintptr(unsafe.Pointer(&p.capData[0])), 0); err1 != 0 {
			childFail(report, StageCapabilities, err1, 0)
		}
	} else {
		raiseAmbient(p, report)
	}
	// The working folder as the user, who must be able to enter it.
	if p.cwd >= 0 {
		if _, _, err1 = syscall.RawSyscall(unix.SYS_FCHDIR, uintptr(p.cwd), 0, 0); err1 != 0 {
			childFail(report, StageCwd, err1, 0)
		}
	}
	// The broker works with umask 077; a command gets the usual 022.
	syscall.RawSyscall(unix.SYS_UMASK, 0o022, 0, 0)

	// Descriptors, before RLIMIT_NOFILE could refuse a high number. First
	// the report pipe and every source that a slot would overwrite move
	// above every number in play; then each source goes into its slot.
	// p.from is the parent's copy of the sources, the child's to change.
	if isSlot(p, report) {
		if _, _, err1 = syscall.RawSyscall(unix.SYS_DUP3, uintptr(report), uintptr(spare), unix.O_CLOEXEC); err1 != 0 {
			childFail(report, StageDescriptors, err1, report)
		}
		report = spare
		spare++
	}
	for i = 0; i < len(p.from); i++ {
		fd = p.from[i]
		if fd == p.slotTo[i] || !isSlot(p, fd) {
			continue
		}
		if _, _, err1 = syscall.RawSyscall(unix.SYS_DUP3, uintptr(fd), uintptr(spare), unix.O_CLOEXEC); err1 != 0 {
			childFail(report, StageDescriptors, err1, fd)
		}
		// Every later slot with this source reads it from its new place.
		for j = i; j < len(p.from); j++ {
			if p.from[j] == fd {
				p.from[j] = spare
			}
		}
		spare++
	}
	// Nothing else survives the exec, whatever the broker had open, with
	// or without close-on-exec: everything above stderr is marked
	// close-on-exec here, and each slot is cleared of it below as it is
	// filled, so the slots may be any numbers, with gaps between them.
	if _, _, err1 = syscall.RawSyscall(unix.SYS_CLOSE_RANGE, 3, ^uintptr(0), unix.CLOSE_RANGE_CLOEXEC); err1 != 0 {
		childFail(report, StageDescriptors, err1, 0)
	}
	for i = 0; i < len(p.from); i++ {
		fd = p.from[i]
		to = p.slotTo[i]
		if fd == to {
			// dup3 onto itself is refused; clear close-on-exec instead.
			_, _, err1 = syscall.RawSyscall(unix.SYS_FCNTL, uintptr(fd), unix.F_SETFD, 0)
		} else {
			_, _, err1 = syscall.RawSyscall(unix.SYS_DUP3, uintptr(fd), uintptr(to), 0)
		}
		if err1 != 0 {
			childFail(report, StageDescriptors, err1, to)
		}
	}

	for i = 0; i < len(p.rlimits); i++ {
		if _, _, err1 = syscall.RawSyscall6(unix.SYS_PRLIMIT64, 0, p.rlimRes[i], uintptr(unsafe.Pointer(&p.rlimits[i])), 0, 0, 0); err1 != 0 {
			childFail(report, StageRlimit, err1, i)
		}
	}
	// The filter last: nothing above runs under it, execve keeps it.
	if p.seccomp != nil {
		if _, _, err1 = syscall.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(p.seccomp))); err1 != 0 {
			childFail(report, StageSeccomp, err1, 0)
		}
	}

	if p.slow {
		slowStart()
	}
	// The clock's start, then the exec; the report pipe closes with it.
	syscall.RawSyscall(unix.SYS_CLOCK_GETTIME, unix.CLOCK_MONOTONIC, uintptr(unsafe.Pointer(&ts)), 0)
	syscall.RawSyscall(unix.SYS_GETRUSAGE, unix.RUSAGE_SELF, uintptr(unsafe.Pointer(&ru)), 0)
	rec.Kind = recordStamp
	rec.MonoNS = ts.Sec*1e9 + ts.Nsec
	rec.UserNS = ru.Utime.Sec*1e9 + ru.Utime.Usec*1e3
	rec.SysNS = ru.Stime.Sec*1e9 + ru.Stime.Usec*1e3
	syscall.RawSyscall(unix.SYS_WRITE, uintptr(report), uintptr(unsafe.Pointer(&rec)), uintptr(recordSize))
	// As execvp does: a missing or refused candidate passes to the next;
	// any other error ends the search.
	err1 = unix.ENOENT
	for i = 0; i < len(p.paths); i++ {
		_, _, err1 = syscall.RawSyscall(unix.SYS_EXECVE, uintptr(unsafe.Pointer(p.paths[i])), uintptr(unsafe.Pointer(&p.argv[0])), uintptr(unsafe.Pointer(&p.envv[0])))
		if err1 == unix.EACCES {
			sawEACCES = true
			continue
		}
		if err1 != unix.ENOENT && err1 != unix.ENOTDIR {
			break
		}
	}
	if sawEACCES && (err1 == unix.ENOENT || err1 == unix.ENOTDIR || err1 == unix.EACCES) {
		err1 = unix.EACCES
	}
	childFail(report, StageExec, err1, 0)
	return
}

// isSlot says whether fd is one of the numbers the slots fill.
//
//go:nosplit
//go:norace
func isSlot(p *prepared, fd int) bool {
	for k := 0; k < len(p.slotTo); k++ {
		if p.slotTo[k] == fd {
			return true
		}
	}
	return false
}

// childFail reports a failed stage on the report pipe and ends the child
// with status 127, as a shell does for a command it could not run.
//
//go:nosplit
//go:norace
func childFail(report int, stage Stage, errno syscall.Errno, index int) {
	var rec record
	rec.Kind = recordFailure
	rec.Stage = uint32(stage)
	rec.Errno = uint32(errno)
	rec.Index = uint32(index)
	syscall.RawSyscall(unix.SYS_WRITE, uintptr(report), uintptr(unsafe.Pointer(&rec)), uintptr(recordSize))
	for {
		syscall.RawSyscall(unix.SYS_EXIT_GROUP, 127, 0, 0)
	}
}

// raiseAmbient is a weakened test build's: the capabilities in p.ambient
// go into the inheritable and ambient sets, from the permitted set that
// PR_SET_KEEPCAPS kept.
//
//go:nosplit
//go:norace
func raiseAmbient(p *prepared, report int) {
	var (
		err1 syscall.Errno
		c    uintptr
	)
	if _, _, err1 = syscall.RawSyscall(unix.SYS_CAPGET, uintptr(unsafe.Pointer(&p.capHdr)), uintptr(unsafe.Pointer(&p.capData[0])), 0); err1 != 0 {
		childFail(report, StageCapabilities, err1, 0)
	}
	p.capData[0].Inheritable |= p.ambient
	p.capData[0].Effective = 0
	if _, _, err1 = syscall.RawSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&p.capHdr)), uintptr(unsafe.Pointer(&p.capData[0])), 0); err1 != 0 {
		childFail(report, StageCapabilities, err1, 0)
	}
	for c = 0; c < 32; c++ {
		if p.ambient&(1<<c) == 0 {
			continue
		}
		if _, _, err1 = syscall.RawSyscall6(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE, c, 0, 0, 0); err1 != 0 {
			childFail(report, StageCapabilities, err1, int(c))
		}
	}
}

// slowStart is a weakened test build's: about 150 ms of CPU time, then
// 450 ms asleep. The CPU stays under what the disk measure lets a process
// whose descriptors it cannot read run before it counts as hiding its
// files (procs' refusedCPU, 200 ms): a measure that falls in the start
// must not end the run.
//
//go:nosplit
//go:norace
func slowStart() {
	var start, now, pause unix.Timespec
	syscall.RawSyscall(unix.SYS_CLOCK_GETTIME, unix.CLOCK_PROCESS_CPUTIME_ID, uintptr(unsafe.Pointer(&start)), 0)
	for {
		syscall.RawSyscall(unix.SYS_CLOCK_GETTIME, unix.CLOCK_PROCESS_CPUTIME_ID, uintptr(unsafe.Pointer(&now)), 0)
		if (now.Sec-start.Sec)*1e9+(now.Nsec-start.Nsec) >= 150e6 {
			break
		}
	}
	pause.Nsec = 450e6
	syscall.RawSyscall(unix.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&pause)), 0, 0)
}
