package spawn

import (
	"os"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sigStatus is the signal lines of a child's /proc/self/status, read by
// a program with no signal handling of its own (grep), so what it shows
// is what the start gave it.
func sigStatus(t *testing.T, r *rig) string {
	t.Helper()
	c := r.command("")
	c.Argv = []string{"/bin/grep", "^Sig", "/proc/self/status"}
	out, err := r.start(c)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCommandStartsWithNoSignalBlocked: the runtime blocks every signal
// while it forks; a command must not start that way (it could then not be
// stopped by SIGTERM or SIGINT, and would hand the mask on), nor with a
// signal ignored that its starter did not ignore.
func TestCommandStartsWithNoSignalBlocked(t *testing.T) {
	r := newRig(t)
	own, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	st := sigStatus(t, r)
	if got := field(st, "SigBlk"); got != "0000000000000000" {
		t.Errorf("SigBlk %s, want no signal blocked:\n%s", got, st)
	}
	if got, want := field(st, "SigIgn"), field(string(own), "SigIgn"); got != want {
		t.Errorf("SigIgn %s, want the starter's own %s", got, want)
	}
}

// TestStartWhereClone3IsRefused: where a container's filter refuses
// clone3 with ENOSYS (and so CLONE_CLEAR_SIGHAND), Start falls back to
// clone and the runtime's own handler reset, and the command starts the
// same, with no signal blocked.
func TestStartWhereClone3IsRefused(t *testing.T) {
	r := newRig(t)
	type result struct {
		st  string
		err error
	}
	done := make(chan result)
	go func() {
		// The filter stays on this thread, which is never unlocked: it
		// ends with this goroutine.
		runtime.LockOSThread()
		filter := []unix.SockFilter{
			{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // seccomp_data.nr
			{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: unix.SYS_CLONE3, Jt: 0, Jf: 1},
			{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
			{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
		}
		prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
		if _, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&prog))); errno != 0 {
			done <- result{err: errno}
			return
		}
		runtime.KeepAlive(filter)
		// The filter holds: clone3 is refused on this thread.
		if _, _, errno := unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0); errno != unix.ENOSYS {
			done <- result{st: "clone3 gave " + errno.Error() + ", want ENOSYS under the test's filter"}
			return
		}
		c := r.command("")
		c.Argv = []string{"/bin/grep", "^Sig", "/proc/self/status"}
		st, err := r.start(c)
		done <- result{st, err}
	}()
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	if !strings.Contains(res.st, "SigBlk:") {
		t.Fatalf("the command did not run: %s", res.st)
	}
	if got := field(res.st, "SigBlk"); got != "0000000000000000" {
		t.Errorf("SigBlk %s, want no signal blocked:\n%s", got, res.st)
	}
}
