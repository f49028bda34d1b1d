// Package spawn starts a role's commands. Start is the spawn boundary for
// every command: one raw child between clone and execve takes on the
// command's credentials, limits, affinity, Landlock domain, descriptors
// and seccomp filter with system calls alone, and reports a stamp (or the
// stage it failed at) in binary on a pipe. No second runtime runs as the
// role before the command.
//
// The Go helper (Main, `thermite __spawn`) remains for the one job that
// runs Go code as the role's user: stop mode ends every process of the
// user. (What its processes keep in unlinked files the broker measures
// itself, on one thread as the user: threadcred.)
package spawn

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/caps"
	"thermite/internal/procs"
	"thermite/internal/sysvipc"
	"thermite/internal/weaken"
)

// Arg is the hidden subcommand that runs the Go helper.
const Arg = "__spawn"

// The descriptors the helper is started with (Command.Slots), after stdin,
// stdout and stderr; declared here once, for the broker that hands them
// and for Main that reads them.
const (
	FDSpec   = 7 // the spec, JSON, on a pipe the broker closes after writing
	FDReport = 8 // the helper writes its answer or why it failed here
)

// Rlimit is one resource limit to set.
type Rlimit struct {
	Resource int    `json:"r"`
	Cur      uint64 `json:"cur"`
	Max      uint64 `json:"max"`
}

// ModeStop, the helper's mode, ends every process of the user and removes
// its SysV IPC objects, and reports "ok N".
const ModeStop = "stop"

// Spec is what the helper does.
type Spec struct {
	Mode string `json:"mode"`
	// StopTimeoutMS bounds the stop loop.
	StopTimeoutMS int64 `json:"stop_timeout_ms,omitempty"`
	// KeepIPC leaves the stopped user's SysV IPC objects; only a
	// thermite_weaken test build honours it.
	KeepIPC bool `json:"keep_ipc,omitempty"`
}

// Main is the helper. It never returns: it reports on FDReport and exits,
// 0 when it did its job, 127 when it could not.
func Main() {
	// The helper is not dumpable, so that no other process of the role
	// can ptrace it or read its memory.
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	// Capabilities are per thread (ClearInheritable in a cgo build): the
	// stop runs on the thread that cleared them.
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
	default:
		fail("spec", fmt.Errorf("unknown mode %q", s.Mode))
	}
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
