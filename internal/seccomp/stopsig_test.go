//go:build linux && (amd64 || arm64)

package seccomp

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The stop signals, written out here rather than taken from the package.
var testStopSignals = []unix.Signal{unix.SIGSTOP, unix.SIGTSTP, unix.SIGTTIN, unix.SIGTTOU}

// signalCall is a call that names a signal, and the argument it names it in.
type signalCall struct {
	name   string
	nr     int
	sigArg int
}

var signalCalls = []signalCall{
	{"kill", unix.SYS_KILL, 1}, {"tkill", unix.SYS_TKILL, 1}, {"tgkill", unix.SYS_TGKILL, 2},
	{"rt_sigqueueinfo", unix.SYS_RT_SIGQUEUEINFO, 1}, {"rt_tgsigqueueinfo", unix.SYS_RT_TGSIGQUEUEINFO, 2},
	{"pidfd_send_signal", unix.SYS_PIDFD_SEND_SIGNAL, 1},
}

// withSignal is c with sig in its signal argument (and 1s elsewhere).
func (c signalCall) withSignal(sig uint64) call {
	args := []uint64{1, 1, 1, 0}
	args[c.sigArg] = sig
	return sys(c.nr, args...)
}

// Every call that names a signal refuses the four stop signals, whatever
// the high half holds (the kernel reads an int), and passes every other
// signal, for role commands and the controller alike.
func TestProgramStopSignals(t *testing.T) {
	for _, o := range append(allOptions, ControllerOptions()) {
		m := vm(t, o)
		for _, c := range signalCalls {
			for _, sig := range testStopSignals {
				for _, v := range []uint64{uint64(sig), 0xffffffff00000000 | uint64(sig)} {
					if got := verdict(t, m, c.withSignal(v)); got != "EPERM" {
						t.Errorf("%+v: %s(%#x): %s, want EPERM", o, c.name, v, got)
					}
				}
				// Only in the high half: the kernel sees signal 0.
				if got := verdict(t, m, c.withSignal(uint64(sig)<<32)); got != "allow" {
					t.Errorf("%+v: %s(%s<<32): %s, want allow", o, c.name, unix.SignalName(sig), got)
				}
			}
			for _, sig := range []unix.Signal{0, unix.SIGCONT, unix.SIGTERM, unix.SIGKILL, unix.SIGINT, unix.SIGUSR1, unix.SIGCHLD, 34} { // 34: SIGRTMIN
				if got := verdict(t, m, c.withSignal(uint64(sig))); got != "allow" {
					t.Errorf("%+v: %s(%d): %s, want allow", o, c.name, sig, got)
				}
			}
		}
		for _, tc := range []struct {
			cmd, arg uint64
			want     string
		}{
			{unix.F_SETSIG, uint64(unix.SIGSTOP), "EPERM"},
			{unix.F_SETSIG, uint64(unix.SIGTSTP), "EPERM"},
			{unix.F_SETSIG, uint64(unix.SIGTTIN), "EPERM"},
			{unix.F_SETSIG, uint64(unix.SIGTTOU), "EPERM"},
			{unix.F_SETSIG, 0xdead00000000 | uint64(unix.SIGSTOP), "EPERM"},     // do_fcntl reads (int)arg
			{0xffffffff00000000 | unix.F_SETSIG, uint64(unix.SIGSTOP), "EPERM"}, // cmd is an unsigned int
			{unix.F_SETSIG, 0, "allow"},
			{unix.F_SETSIG, uint64(unix.SIGIO), "allow"},
			{unix.F_SETSIG, uint64(unix.SIGUSR1), "allow"},
			{unix.F_SETSIG, uint64(unix.SIGSTOP) << 32, "allow"},
			// Other commands whose argument happens to be 19 to 22.
			{unix.F_SETFL, uint64(unix.SIGSTOP), "allow"},
			{unix.F_SETOWN, uint64(unix.SIGTSTP), "allow"},
			{unix.F_DUPFD_CLOEXEC, uint64(unix.SIGTTOU), "allow"},
			{unix.F_GETSIG, 0, "allow"},
		} {
			if got := verdict(t, m, sys(unix.SYS_FCNTL, 3, tc.cmd, tc.arg)); got != tc.want {
				t.Errorf("%+v: fcntl(3, %#x, %#x): %s, want %s", o, tc.cmd, tc.arg, got, tc.want)
			}
		}
	}
}

// The rule is left out only by a thermite_weaken build.
func TestProgramStopSignalsWeakenedOnlyInTestBuilds(t *testing.T) {
	o := Options{Network: NetworkNone, Weakened: []string{WeakenStopSignals}}
	want := "EPERM"
	if o.weakened(WeakenStopSignals) {
		want = "allow"
	}
	m := vm(t, o)
	if got := verdict(t, m, sys(unix.SYS_KILL, 1, uint64(unix.SIGSTOP))); got != want {
		t.Errorf("kill(SIGSTOP) with the rule weakened: %s, want %s", got, want)
	}
	if got := verdict(t, m, sys(unix.SYS_FCNTL, 3, unix.F_SETSIG, uint64(unix.SIGSTOP))); got != want {
		t.Errorf("fcntl(F_SETSIG, SIGSTOP) with the rule weakened: %s, want %s", got, want)
	}
}

// stopSender sends sig to the process pid (a child of the caller) by one
// path, on the calling thread.
type stopSender func(pid int, sig unix.Signal) unix.Errno

// stopPaths are the ways a process may send a signal of its choice to
// another process of its user.
var stopPaths = map[string]stopSender{
	"kill": func(pid int, sig unix.Signal) unix.Errno {
		_, _, e := unix.Syscall(unix.SYS_KILL, uintptr(pid), uintptr(sig), 0)
		return e
	},
	"kill-group": func(pid int, sig unix.Signal) unix.Errno {
		// The child leads a process group of its own (stopTarget).
		_, _, e := unix.Syscall(unix.SYS_KILL, uintptr(-pid), uintptr(sig), 0)
		return e
	},
	"kill-high-garbage": func(pid int, sig unix.Signal) unix.Errno {
		// The kernel reads the signal as an int: the high half is dropped.
		_, _, e := unix.Syscall(unix.SYS_KILL, uintptr(pid), 0xffffffff00000000|uintptr(sig), 0)
		return e
	},
	"tkill": func(pid int, sig unix.Signal) unix.Errno {
		_, _, e := unix.Syscall(unix.SYS_TKILL, uintptr(pid), uintptr(sig), 0)
		return e
	},
	"tgkill": func(pid int, sig unix.Signal) unix.Errno {
		_, _, e := unix.Syscall(unix.SYS_TGKILL, uintptr(pid), uintptr(pid), uintptr(sig))
		return e
	},
	"rt_sigqueueinfo": func(pid int, sig unix.Signal) unix.Errno {
		info := queuedInfo(sig)
		_, _, e := unix.Syscall(unix.SYS_RT_SIGQUEUEINFO, uintptr(pid), uintptr(sig), uintptr(unsafe.Pointer(&info[0])))
		return e
	},
	"rt_tgsigqueueinfo": func(pid int, sig unix.Signal) unix.Errno {
		info := queuedInfo(sig)
		_, _, e := unix.Syscall6(unix.SYS_RT_TGSIGQUEUEINFO, uintptr(pid), uintptr(pid), uintptr(sig), uintptr(unsafe.Pointer(&info[0])), 0, 0)
		return e
	},
	"pidfd_send_signal": func(pid int, sig unix.Signal) unix.Errno {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			return err.(unix.Errno)
		}
		defer unix.Close(fd)
		_, _, e := unix.Syscall6(unix.SYS_PIDFD_SEND_SIGNAL, uintptr(fd), uintptr(sig), 0, 0, 0, 0)
		return e
	},
	"fcntl-F_SETSIG": func(pid int, sig unix.Signal) unix.Errno {
		// The child owns a pipe's read end with O_ASYNC: a write raises
		// the F_SETSIG signal at it.
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
			return err.(unix.Errno)
		}
		defer unix.Close(p[0])
		defer unix.Close(p[1])
		if _, _, e := unix.Syscall(unix.SYS_FCNTL, uintptr(p[0]), unix.F_SETSIG, uintptr(sig)); e != 0 {
			return e
		}
		if _, err := unix.FcntlInt(uintptr(p[0]), unix.F_SETOWN, pid); err != nil {
			return err.(unix.Errno)
		}
		if _, err := unix.FcntlInt(uintptr(p[0]), unix.F_SETFL, unix.O_ASYNC|unix.O_NONBLOCK); err != nil {
			return err.(unix.Errno)
		}
		// Closing the write end would raise the signal once more.
		defer unix.FcntlInt(uintptr(p[0]), unix.F_SETFL, unix.O_NONBLOCK)
		if _, err := unix.Write(p[1], []byte{1}); err != nil {
			return err.(unix.Errno)
		}
		return 0
	},
}

// queuedInfo is a siginfo_t as sigqueue(3) fills it: si_signo, si_errno,
// si_code SI_QUEUE (the kernel refuses any other code for another process).
func queuedInfo(sig unix.Signal) [128]byte {
	var info [128]byte
	*(*int32)(unsafe.Pointer(&info[0])) = int32(sig)
	*(*int32)(unsafe.Pointer(&info[8])) = -1 // SI_QUEUE
	return info
}

// stopTarget starts a child of this process, the target of the attempts,
// in a process group of its own.
func stopTarget() (*exec.Cmd, error) {
	c := exec.Command("/bin/sleep", "60")
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return c, c.Start()
}

// stateOf is the state letter of process pid in /proc/PID/stat.
func stateOf(pid int) byte {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return '?'
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return '?'
	}
	return s[i+2]
}

// seenStopped says whether pid is, or within a moment becomes, stopped
// (state T): a signal sent is acted on when the child next runs.
func seenStopped(pid int, wait time.Duration) bool {
	for until := time.Now().Add(wait); ; time.Sleep(2 * time.Millisecond) {
		if stateOf(pid) == 'T' {
			return true
		}
		if time.Now().After(until) {
			return false
		}
	}
}

// stopScenario tries each stop signal by path on a child of its own and
// answers "EPERM" when each was refused so and the child never stopped,
// otherwise what each came to.
func stopScenario(path string) scenario {
	send := stopPaths[path]
	return func(string) string {
		c, err := stopTarget()
		if err != nil {
			return "start the target: " + err.Error()
		}
		defer func() { c.Process.Kill(); c.Wait() }()
		pid := c.Process.Pid
		var got []string
		allEPERM := true
		for _, sig := range testStopSignals {
			e := send(pid, sig)
			r := errnoName(e)
			wait := time.Duration(0)
			if e == 0 {
				wait = 2 * time.Second
			}
			if seenStopped(pid, wait) {
				r += " (stopped)"
				unix.Kill(pid, unix.SIGCONT)
			}
			if r != "EPERM" {
				allEPERM = false
			}
			got = append(got, unix.SignalName(sig)+" "+r)
		}
		if allEPERM {
			return "EPERM"
		}
		return strings.Join(got, ", ")
	}
}

func init() {
	for path := range stopPaths {
		scenarios["stop-"+path] = stopScenario(path)
	}
	scenarios["stop-self"] = func(string) string {
		// kill(getpid()) and raise: refused too; no role needs to stop
		// itself either. (Without the filter this stops the child for
		// good, so it runs with the filter only.)
		if r := raw(unix.SYS_KILL, uintptr(os.Getpid()), uintptr(unix.SIGSTOP)); r != "EPERM" {
			return "kill(self): " + r
		}
		return raw(unix.SYS_TGKILL, uintptr(os.Getpid()), uintptr(unix.Gettid()), uintptr(unix.SIGTSTP))
	}
	scenarios["signal-own-child"] = func(string) string {
		// What a role still does to its own processes: probe with 0,
		// continue, interrupt and end them, choose SIGUSR1 with F_SETSIG.
		c, err := stopTarget()
		if err != nil {
			return "start the target: " + err.Error()
		}
		pid := c.Process.Pid
		for _, sig := range []unix.Signal{0, unix.SIGCONT} {
			for _, path := range []string{"kill", "tgkill", "pidfd_send_signal", "rt_sigqueueinfo"} {
				if e := stopPaths[path](pid, sig); e != 0 {
					c.Process.Kill()
					c.Wait()
					return fmt.Sprintf("%s(%d): %s", path, sig, errnoName(e))
				}
			}
		}
		if _, _, e := unix.Syscall(unix.SYS_FCNTL, 0, unix.F_SETSIG, uintptr(unix.SIGUSR1)); e != 0 {
			c.Process.Kill()
			c.Wait()
			return "fcntl(F_SETSIG, SIGUSR1): " + errnoName(e)
		}
		if e := stopPaths["kill"](pid, unix.SIGTERM); e != 0 {
			c.Process.Kill()
			c.Wait()
			return "kill(SIGTERM): " + errnoName(e)
		}
		c.Wait()
		if ws := c.ProcessState.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != unix.SIGTERM {
			return "the child ended as " + c.ProcessState.String() + ", not by SIGTERM"
		}
		return "ok"
	}
}

// TestStopSignalsToOwnChildRefused: a process under the filter sends each
// stop signal to a child of its own by every path that names a signal;
// each is refused with EPERM and the child is never seen stopped. Without
// the filter each stops it, so the filter is what refused.
func TestStopSignalsToOwnChildRefused(t *testing.T) {
	requireRoot(t)
	if _, err := os.Stat("/bin/sleep"); err != nil {
		t.Skipf("needs /bin/sleep as the target child: %v", err)
	}
	for path := range stopPaths {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			o := Options{Network: NetworkNone}
			if got := runChild(t, "stop-"+path, modeFiltered, o, ""); got.result != "EPERM" {
				t.Errorf("with the filter: %s, want EPERM for each stop signal and the child never stopped\n%s", got.result, got.output)
			}
			base := runChild(t, "stop-"+path, modeBaseline, o, "")
			if !strings.Contains(base.result, "ok (stopped)") {
				t.Errorf("without the filter: %s, want the child stopped\n%s", base.result, base.output)
			}
			t.Logf("without the filter: %s", base.result)
		})
	}
}

// TestStopSignalsToItselfRefused: a role command cannot stop itself
// either (kill of its own pid, raise).
func TestStopSignalsToItselfRefused(t *testing.T) {
	requireRoot(t)
	for _, o := range []Options{{Network: NetworkNone}, ControllerOptions()} {
		if got := runChild(t, "stop-self", modeFiltered, o, ""); got.result != "EPERM" {
			t.Errorf("%+v: %s, want EPERM\n%s", o, got.result, got.output)
		}
	}
}

// TestOtherSignalsToOwnChildStillDelivered: under the filter, signal 0
// and SIGCONT by every path, F_SETSIG with SIGUSR1, and SIGTERM, which
// ends the child, all still work.
func TestOtherSignalsToOwnChildStillDelivered(t *testing.T) {
	requireRoot(t)
	if _, err := os.Stat("/bin/sleep"); err != nil {
		t.Skipf("needs /bin/sleep as the target child: %v", err)
	}
	for _, o := range []Options{{Network: NetworkNone}, ControllerOptions()} {
		if got := runChild(t, "signal-own-child", modeFiltered, o, ""); got.result != "ok" {
			t.Errorf("%+v: %s\n%s", o, got.result, got.output)
		}
	}
}

// The filter leaves open the other calls that set a signal, as each
// reaches only the caller. These scenarios check the kernel's side of
// that under the filter.
func init() {
	scenarios["clone-parent-stop"] = func(string) string {
		// A child (the caller) clones with CLONE_PARENT and exit signal
		// SIGSTOP: the new process is this process's child, and the
		// kernel gives it the caller's own exit signal (copy_process), so
		// its end cannot stop this process.
		r, err := inheritedResult("clone-parent-caller")
		if err != nil {
			return "the caller: " + err.Error()
		}
		var gpid int
		if _, err := fmt.Sscanf(r, "clone %d", &gpid); err != nil {
			return "the caller: " + r
		}
		if gpid <= 0 {
			return "the caller: no pid in " + r
		}
		defer func() {
			unix.Kill(gpid, unix.SIGKILL)
			var ws unix.WaitStatus
			unix.Wait4(gpid, &ws, 0, nil)
		}()
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", gpid))
		if err != nil {
			return err.Error()
		}
		s := string(data)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		// f[0] is field 3 (state): ppid is field 4, exit_signal field 38.
		if len(f) < 36 {
			return "short stat: " + s
		}
		return fmt.Sprintf("ppid self %v, exit signal %s", f[1] == fmt.Sprint(os.Getpid()), f[35])
	}
	scenarios["clone-parent-caller"] = func(string) string {
		// Fork semantics (no CLONE_VM): the new process runs on a copy of
		// this stack and only blocks until it is killed.
		pid, _, e := unix.RawSyscall6(unix.SYS_CLONE, unix.CLONE_PARENT|uintptr(unix.SIGSTOP), 0, 0, 0, 0, 0)
		if e != 0 {
			return "clone " + errnoName(e)
		}
		if pid == 0 {
			// Let go of the caller's output pipe, which its reader waits on.
			unix.RawSyscall(unix.SYS_CLOSE_RANGE, 0, ^uintptr(0), 0)
			for {
				unix.RawSyscall6(unix.SYS_PPOLL, 0, 0, 0, 0, 0, 0)
			}
		}
		return fmt.Sprintf("clone %d", pid)
	}
	scenarios["timer-other-thread"] = func(string) string {
		// SIGEV_THREAD_ID must name a thread of the caller's own group
		// (good_sigevent): another process's is EINVAL.
		c, err := stopTarget()
		if err != nil {
			return "start the target: " + err.Error()
		}
		defer func() { c.Process.Kill(); c.Wait() }()
		var ev [64]byte // struct sigevent: value, signo, notify, then the tid
		*(*int32)(unsafe.Pointer(&ev[8])) = int32(unix.SIGSTOP)
		*(*int32)(unsafe.Pointer(&ev[12])) = 4 // SIGEV_THREAD_ID
		*(*int32)(unsafe.Pointer(&ev[16])) = int32(c.Process.Pid)
		var id int32
		_, _, e := unix.Syscall(unix.SYS_TIMER_CREATE, unix.CLOCK_MONOTONIC, uintptr(unsafe.Pointer(&ev[0])), uintptr(unsafe.Pointer(&id)))
		return errnoName(e)
	}
}

// TestOtherSignalSettersReachOnlyTheCaller: what the filter leaves open
// cannot stop another process. A CLONE_PARENT child made with exit signal
// SIGSTOP gets the caller's own exit signal (SIGCHLD, 17) from the kernel;
// a timer's SIGEV_THREAD_ID cannot name another process's thread.
// (PR_SET_PDEATHSIG and mq_notify signal the caller by their definition.)
func TestOtherSignalSettersReachOnlyTheCaller(t *testing.T) {
	requireRoot(t)
	o := Options{Network: NetworkNone}
	if got := runChild(t, "clone-parent-stop", modeFiltered, o, ""); got.result != "ppid self true, exit signal 17" {
		t.Errorf("CLONE_PARENT with exit signal SIGSTOP: %s, want this process its parent and exit signal 17 (SIGCHLD)\n%s", got.result, got.output)
	}
	if _, err := os.Stat("/bin/sleep"); err != nil {
		t.Skipf("needs /bin/sleep as the target child: %v", err)
	}
	if got := runChild(t, "timer-other-thread", modeFiltered, o, ""); got.result != "EINVAL" {
		t.Errorf("timer_create(SIGEV_THREAD_ID, another process): %s, want EINVAL\n%s", got.result, got.output)
	}
}

// TestStopSignalsAreOneRun: refuseStopSignal decides them as one run of
// numbers, which they must be.
func TestStopSignalsAreOneRun(t *testing.T) {
	for i := 1; i < len(stopSignals); i++ {
		if stopSignals[i] != stopSignals[i-1]+1 {
			t.Fatalf("stop signals %v are not one run of numbers", stopSignals)
		}
	}
}
