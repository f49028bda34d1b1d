// Package spawn is the shim between the broker's fork and a role's command.
// The broker starts `/proc/self/exe __spawn` already as the role's user
// (fork with credentials); the shim reads its spec from an inherited pipe,
// locks itself down, and execs the command. The same shim, in stop mode,
// is the helper that ends every process of a role's user.
package spawn

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"

	"thermite/internal/caps"
	"thermite/internal/procs"
	"thermite/internal/seccomp"
	"thermite/internal/sysvipc"
	"thermite/internal/weaken"
)

// Arg is the hidden subcommand that runs the shim.
const Arg = "__spawn"

// The descriptors the shim inherits, after stdin, stdout and stderr.
const (
	FDSpec     = 3 // the spec, JSON, on a pipe the broker closes after writing
	FDReport   = 4 // the shim writes a failure here; exec closes it on success
	FDCwd      = 5 // the working folder, opened by the broker beneath scratch
	FDLandlock = 6 // the role's Landlock rule set, when there is one
	// FDInherit is the first descriptor a command may be handed to keep
	// (Spec.Inherit): the controller's bootstrap and API listener.
	FDInherit = 7
)

// Rlimit is one resource limit to set.
type Rlimit struct {
	Resource int    `json:"r"`
	Cur      uint64 `json:"cur"`
	Max      uint64 `json:"max"`
}

// Modes of the shim.
const (
	ModeExec = "exec"
	ModeStop = "stop"
	// ModeHeld measures what the user's processes keep in unlinked files
	// (procs.HeldUnlinked) and reports "ok BYTES FILES".
	ModeHeld = "held"
)

// Spec is everything the shim does, in order.
type Spec struct {
	Mode     string   `json:"mode"`
	Argv     []string `json:"argv,omitempty"`
	Env      []string `json:"env,omitempty"`
	CPUs     []int    `json:"cpus,omitempty"`
	Rlimits  []Rlimit `json:"rlimits,omitempty"`
	Landlock bool     `json:"landlock,omitempty"`
	// StopTimeoutMS bounds the stop loop.
	StopTimeoutMS int64 `json:"stop_timeout_ms,omitempty"`
	// Seccomp is the command's system-call filter, installed last.
	Seccomp *seccomp.Options `json:"seccomp,omitempty"`
	// Inherit lists descriptors, each FDInherit or above, that the command
	// keeps across the exec: the controller's bootstrap pipe and listener.
	Inherit []int `json:"inherit,omitempty"`
	// KeepFDs leaves a descriptor open across the exec; only a
	// thermite_weaken test build honours it.
	KeepFDs bool `json:"keep_fds,omitempty"`
	// KeepIPC leaves the stopped user's SysV IPC objects; only a
	// thermite_weaken test build honours it.
	KeepIPC bool `json:"keep_ipc,omitempty"`
	// SkipPIDs are processes the held mode passes over: the broker's own
	// thermite commands (procs.HeldUnlinked).
	SkipPIDs []int `json:"skip_pids,omitempty"`
	// SkipDev is a file system the held mode passes over (st_dev): one
	// whose user quota already counts its unlinked files.
	SkipDev uint64 `json:"skip_dev,omitempty"`
	// KeepCaps leaves the inheritable (and so the ambient) set as the
	// broker's fork left it; only a thermite_weaken build honours it.
	KeepCaps bool `json:"keep_caps,omitempty"`
	// SlowStart makes the shim spend CPU time and wall time before its
	// exec; only a thermite_weaken build honours it (the clock's test).
	SlowStart bool `json:"slow_start,omitempty"`
}

// StampPrefix starts the line the shim writes on FDReport just before it
// execs: "stamp MONO_NS USER_NS SYS_NS", the CLOCK_MONOTONIC time and the
// shim's own CPU time until then. A reason it could not exec may follow.
const StampPrefix = "stamp "

// stamp writes the clock's start on the report pipe.
func stamp(report *os.File) {
	var ts unix.Timespec
	var ru unix.Rusage
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	fmt.Fprintf(report, "%s%d %d %d\n", StampPrefix, ts.Nano(), ru.Utime.Nano(), ru.Stime.Nano())
}

// ParseStamp splits what a shim wrote on FDReport into its stamp (ok
// false when there is none) and the rest, a reason it could not exec.
func ParseStamp(msg string) (monoNS, userNS, sysNS int64, rest string, ok bool) {
	line, after, found := strings.Cut(msg, "\n")
	if !found || !strings.HasPrefix(line, StampPrefix) {
		return 0, 0, 0, msg, false
	}
	if _, err := fmt.Sscanf(line[len(StampPrefix):], "%d %d %d", &monoNS, &userNS, &sysNS); err != nil {
		return 0, 0, 0, msg, false
	}
	return monoNS, userNS, sysNS, after, true
}

// slowStart spends about 300 ms of CPU time and 300 ms asleep: a start
// that a clock counting the shim would see.
func slowStart() {
	end := time.Now().Add(300 * time.Millisecond)
	for n := 0; time.Now().Before(end); n++ {
		_ = n * n
	}
	time.Sleep(300 * time.Millisecond)
}

// Main is the shim. It never returns: it execs the command, or reports on
// FDReport and exits 127.
func Main() {
	// A shim is not dumpable, so that no other process of the role can
	// ptrace it or read its memory while it holds the spec.
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	// Affinity, no_new_privs and the Landlock domain are per thread, and
	// execve keeps those of the thread that calls it: all on this one.
	runtime.LockOSThread()
	report := os.NewFile(FDReport, "report")
	fail := func(stage string, err error) {
		fmt.Fprintf(report, "%s: %v", stage, err)
		os.Exit(127)
	}
	data, err := io.ReadAll(io.LimitReader(os.NewFile(FDSpec, "spec"), 1<<20))
	if err != nil {
		fail("spec", err)
	}
	var s Spec
	if err := json.Unmarshal(data, &s); err != nil {
		fail("spec", err)
	}
	switch s.Mode {
	case ModeStop:
		// Whatever the broker left inheritable is not the helper's to keep.
		if err := caps.ClearInheritable(); err != nil {
			fail("stop", err)
		}
		if err := unprivileged(); err != nil {
			fail("stop", err)
		}
		limit := time.Duration(s.StopTimeoutMS) * time.Millisecond
		n, err := stopAll(limit)
		if err != nil {
			fail("stop", err)
		}
		if !(weaken.Enabled && s.KeepIPC) {
			if err := removeIPC(limit); err != nil {
				fail("stop", err)
			}
		}
		fmt.Fprintf(report, "ok %d", n)
		os.Exit(0)
	case ModeHeld:
		if err := caps.ClearInheritable(); err != nil {
			fail("held", err)
		}
		if err := pinCPUs(s.CPUs); err != nil {
			fail("affinity", err)
		}
		if err := unprivileged(); err != nil {
			fail("held", err)
		}
		skip := map[int]bool{}
		for _, p := range s.SkipPIDs {
			skip[p] = true
		}
		h, err := procs.HeldUnlinkedExcept("/proc", os.Getuid(), skip, s.SkipDev)
		if err != nil {
			fail("held", err)
		}
		fmt.Fprintf(report, "ok %d %d", h.Bytes, h.Files)
		os.Exit(0)
	case ModeExec:
	default:
		fail("spec", fmt.Errorf("unknown mode %q", s.Mode))
	}
	if len(s.Argv) == 0 {
		fail("spec", fmt.Errorf("empty argv"))
	}
	if err := pinCPUs(s.CPUs); err != nil {
		fail("affinity", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fail("no_new_privs", err)
	}
	// The broker clears it on its threads; this is the exec'ing thread's
	// own, for a build where it could not. Lowering inheritable also
	// lowers the ambient set.
	if !(weaken.Enabled && s.KeepCaps) {
		if err := caps.ClearInheritable(); err != nil {
			fail("capabilities", err)
		}
	}
	if s.Landlock {
		if err := llsys.LandlockRestrictSelf(FDLandlock, 0); err != nil {
			fail("landlock", err)
		}
	}
	if err := unix.Fchdir(FDCwd); err != nil {
		fail("cwd", err)
	}
	// The broker works with umask 077; a role's command gets the usual 022
	// (its own folders are 0700 whatever it makes in them).
	unix.Umask(0o022)
	path, err := lookPath(s.Argv[0], s.Env)
	if err != nil {
		fail("exec", err)
	}
	// The process limit goes last: it counts every task of the user, and
	// the shim's own runtime threads must exist before it bites.
	var nproc *Rlimit
	for i := range s.Rlimits {
		r := &s.Rlimits[i]
		if r.Resource == unix.RLIMIT_NPROC {
			nproc = r
			continue
		}
		if err := unix.Setrlimit(r.Resource, &unix.Rlimit{Cur: r.Cur, Max: r.Max}); err != nil {
			fail(fmt.Sprintf("rlimit %d", r.Resource), err)
		}
	}
	if nproc != nil {
		if err := unix.Setrlimit(nproc.Resource, &unix.Rlimit{Cur: nproc.Cur, Max: nproc.Max}); err != nil {
			fail("rlimit nproc", err)
		}
	}
	// Nothing but stdio survives the exec, whatever the runtime opened.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		fail("close_range", err)
	}
	for _, fd := range s.Inherit {
		if fd < FDInherit {
			fail("inherit", fmt.Errorf("descriptor %d is the shim's own", fd))
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
			fail("inherit", fmt.Errorf("descriptor %d: %w", fd, err))
		}
	}
	if weaken.Enabled && s.KeepFDs {
		// The test build's leak: the working folder's descriptor.
		unix.FcntlInt(FDCwd, unix.F_SETFD, 0)
	}
	// The filter goes last: nothing the shim does after it is filtered,
	// and execve keeps it on this thread.
	if s.Seccomp != nil {
		if err := seccomp.Install(*s.Seccomp); err != nil {
			fail("seccomp", err)
		}
	}
	if weaken.Enabled && s.SlowStart {
		slowStart()
	}
	// The clock's start: the moment before execve, and the CPU time the
	// shim spent so far, so the broker counts the command alone.
	stamp(report)
	err = unix.Exec(path, s.Argv, s.Env)
	fail("exec", fmt.Errorf("%s: %w", s.Argv[0], err))
}

// lookPath finds argv[0] the way a shell would, in the command's own PATH.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			os.Setenv("PATH", v)
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s: not found in PATH", name)
	}
	return p, nil
}

// unprivileged checks that this process is a plain user with no
// capability at all: kill(-1) by anything more would reach every process
// on the machine, not one role's.
func unprivileged() error {
	if os.Getuid() == 0 || os.Geteuid() == 0 {
		return fmt.Errorf("refusing kill(-1) as root")
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	for _, d := range data {
		if d.Effective != 0 || d.Permitted != 0 || d.Inheritable != 0 {
			return fmt.Errorf("refusing kill(-1) with capabilities (effective %#x, permitted %#x)", data[0].Effective, data[0].Permitted)
		}
	}
	amb, err := unix.PrctlRetInt(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_IS_SET, unix.CAP_KILL, 0, 0)
	if err == nil && amb != 0 {
		return fmt.Errorf("refusing kill(-1) with an ambient CAP_KILL")
	}
	return nil
}

// removeIPC removes every SysV IPC object this user owns or made, once
// stopAll has ended its processes: nothing a command, a repeat or a trial
// left in shared memory, a queue or a semaphore reaches the next one. Only
// the owner or creator may remove an object without CAP_IPC_OWNER, which
// is why the helper, running as the role, does it.
func removeIPC(limit time.Duration) error {
	if limit <= 0 {
		limit = 10 * time.Second
	}
	_, err := sysvipc.RemoveUserObjects("/proc", os.Getuid(), limit)
	return err
}

// stopAll ends every process of this user but itself. kill(-1, SIGKILL)
// signals every process the caller may signal, which for a role's user is
// every process of that user; it holds the task list while it does, so a
// fork either finished before (and the child is signalled too) or sees the
// parent's fatal signal and is aborted. After one pass nothing of the user
// can start again, so the set only shrinks: the loop repeats the kill and
// watches /proc until the last one (zombies included, until the broker
// reaps them) is gone. kill(-1) itself cannot tell: it returns 0 whenever
// any other process exists, signalled or not. It returns how many of the
// user's processes there were when it began.
func stopAll(limit time.Duration) (int, error) {
	if limit <= 0 {
		limit = 10 * time.Second
	}
	deadline := time.Now().Add(limit)
	uid := os.Getuid()
	before, err := procs.ByUID("/proc", uid)
	if err != nil {
		return 0, err
	}
	pause := 50 * time.Microsecond
	for {
		if err := unix.Kill(-1, unix.SIGKILL); err != nil && err != unix.ESRCH {
			return 0, fmt.Errorf("kill(-1): %w", err)
		}
		pids, err := procs.ByUID("/proc", uid)
		if err != nil {
			return 0, err
		}
		if len(pids) == 0 {
			return len(before), nil
		}
		if time.Now().After(deadline) {
			return len(before), fmt.Errorf("%d processes of uid %d still exist after %s: %v", len(pids), uid, limit, pids)
		}
		time.Sleep(pause)
		if pause < 2*time.Millisecond {
			pause *= 2
		}
	}
}

// pinCPUs keeps this thread, and what it execs, on cpus; none leaves the
// affinity as it is.
func pinCPUs(cpus []int) error {
	if len(cpus) == 0 {
		return nil
	}
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	return unix.SchedSetaffinity(0, &set)
}
