package selftest

import (
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"thermite/roles"
)

// OpStopChild starts a child of the probe's own (a canary) and sends it
// SIGSTOP, SIGTSTP, SIGTTIN and SIGTTOU in turn by the path Path (one of
// StopPaths: kill, pidfd, setsig, sigqueue, tgkill), then SIGTERM. Got is
// "EPERM" when each stop was refused with EPERM, the child was never seen
// stopped and SIGTERM ended it; otherwise what went otherwise. Detail says
// what each signal came to.
const OpStopChild = "stop-child"

// stopSignals are the signals whose default action stops a process.
var stopSignals = []unix.Signal{unix.SIGSTOP, unix.SIGTSTP, unix.SIGTTIN, unix.SIGTTOU}

// stopPaths are the ways a process names the signal another process of its
// user gets: each sends sig to pid, a child of the caller.
var stopPaths = map[string]func(pid int, sig unix.Signal) error{
	"kill": func(pid int, sig unix.Signal) error { return unix.Kill(pid, sig) },
	"tgkill": func(pid int, sig unix.Signal) error {
		return unix.Tgkill(pid, pid, sig)
	},
	"pidfd": func(pid int, sig unix.Signal) error {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			return fmt.Errorf("pidfd_open: %w", err)
		}
		defer unix.Close(fd)
		return unix.PidfdSendSignal(fd, sig, nil, 0)
	},
	"sigqueue": func(pid int, sig unix.Signal) error {
		// siginfo_t as sigqueue(3) fills it: the kernel takes only a
		// negative si_code (SI_QUEUE) from a process for another.
		var info [128]byte
		*(*int32)(unsafe.Pointer(&info[0])) = int32(sig)
		*(*int32)(unsafe.Pointer(&info[8])) = -1
		_, _, e := unix.Syscall(unix.SYS_RT_SIGQUEUEINFO, uintptr(pid), uintptr(sig), uintptr(unsafe.Pointer(&info[0])))
		if e != 0 {
			return e
		}
		return nil
	},
	// F_SETSIG picks the signal the owner (F_SETOWN) of a descriptor with
	// O_ASYNC gets for I/O on it: a write into the pipe raises it.
	"setsig": func(pid int, sig unix.Signal) error {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
			return fmt.Errorf("pipe: %w", err)
		}
		defer unix.Close(p[0])
		defer unix.Close(p[1])
		if _, err := unix.FcntlInt(uintptr(p[0]), unix.F_SETSIG, int(sig)); err != nil {
			return err
		}
		if _, err := unix.FcntlInt(uintptr(p[0]), unix.F_SETOWN, pid); err != nil {
			return fmt.Errorf("F_SETOWN: %w", err)
		}
		if _, err := unix.FcntlInt(uintptr(p[0]), unix.F_SETFL, unix.O_ASYNC|unix.O_NONBLOCK); err != nil {
			return fmt.Errorf("O_ASYNC: %w", err)
		}
		// Closing the write end would raise the signal once more.
		defer unix.FcntlInt(uintptr(p[0]), unix.F_SETFL, unix.O_NONBLOCK)
		_, err := unix.Write(p[1], []byte{1})
		return err
	},
}

// StopPaths are the paths OpStopChild knows, sorted.
func StopPaths() []string {
	out := make([]string, 0, len(stopPaths))
	for p := range stopPaths {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// stopOwnChild is the attack at its root: a process of the role stopping
// another of its user. Its own child stands for the broker's starting
// child and stop helper, which run as the same user.
func stopOwnChild(a Attempt) Outcome {
	send, ok := stopPaths[a.Path]
	if !ok {
		return Outcome{ID: a.ID, Got: "error: unknown path " + a.Path}
	}
	exe, err := os.Executable()
	if err != nil {
		return Outcome{ID: a.ID, Got: "error: " + err.Error()}
	}
	child := exec.Command(exe, ProbeArg, "canary")
	// A process group of its own, whose parent (this probe) is in another
	// group of the same session: not orphaned, so the kernel acts on
	// SIGTSTP, SIGTTIN and SIGTTOU too, not only on SIGSTOP.
	child.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := child.StdinPipe()
	if err != nil {
		return Outcome{ID: a.ID, Got: "error: " + err.Error()}
	}
	if err := child.Start(); err != nil {
		return Outcome{ID: a.ID, Got: "error: starting a child: " + err.Error()}
	}
	ended := false
	defer func() {
		if !ended {
			child.Process.Kill()
			stdin.Close()
			child.Wait()
		}
	}()
	pid := child.Process.Pid
	got, stopped := "EPERM", ""
	var detail []string
	for _, sig := range stopSignals {
		err := send(pid, sig)
		r := "ok"
		if err != nil {
			r = errName(err)
		}
		// A signal sent is acted on when the child next runs. Once one
		// stop has landed the row fails anyway: the rest wait less.
		wait := time.Duration(0)
		switch {
		case err == nil && stopped == "":
			wait = time.Second
		case err == nil:
			wait = 50 * time.Millisecond
		}
		if stateStopped(pid, wait) {
			r += ", child stopped"
			if stopped == "" {
				stopped = unix.SignalName(sig)
			}
			unix.Kill(pid, unix.SIGCONT)
		}
		detail = append(detail, unix.SignalName(sig)+": "+r)
		if r != "EPERM" && got == "EPERM" {
			got = r
		}
	}
	if stopped != "" {
		got = "stopped its child with " + stopped + " through " + a.Path
	}
	// What a role still does to its own processes: end them.
	if err := unix.Kill(pid, unix.SIGTERM); err != nil {
		return Outcome{ID: a.ID, Got: "error: SIGTERM to its child: " + errName(err), Detail: strings.Join(detail, "; ")}
	}
	ended = true
	done := make(chan error, 1)
	go func() { done <- child.Wait() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		child.Process.Kill()
		<-done
		return Outcome{ID: a.ID, Got: "error: its child did not end in 5 s after SIGTERM", Detail: strings.Join(detail, "; ")}
	}
	stdin.Close()
	if ws, ok := child.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != unix.SIGTERM {
		return Outcome{ID: a.ID, Got: "error: its child ended as " + child.ProcessState.String() + ", not by SIGTERM", Detail: strings.Join(detail, "; ")}
	}
	return Outcome{ID: a.ID, Got: got, Detail: strings.Join(detail, "; ")}
}

// stateStopped says whether pid is, or within wait becomes, stopped
// (state T).
func stateStopped(pid int, wait time.Duration) bool {
	for until := time.Now().Add(wait); ; time.Sleep(2 * time.Millisecond) {
		if processStopped(pid) {
			return true
		}
		if time.Now().After(until) {
			return false
		}
	}
}

// stopChildAttempts are lane-1's attempts to stop a child of its own, one
// per path.
func stopChildAttempts(_ *Context, r roles.Role) []Attempt {
	if r.Index != 1 {
		return nil
	}
	var out []Attempt
	for _, p := range StopPaths() {
		out = append(out, Attempt{Op: OpStopChild, Path: p})
	}
	return out
}
