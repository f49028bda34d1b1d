//go:build linux && amd64

package seccomp

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// legacyModeCalls are the calls with a mode that only the x86_64 ABI has,
// for the virtual-machine tests.
func legacyModeCalls() []modeCall {
	return []modeCall{
		{"chmod", func(mode uint64) call { return sys(unix.SYS_CHMOD, 0, mode) }},
		{"creat", func(mode uint64) call { return sys(unix.SYS_CREAT, 0, mode) }},
		{"mkdir", func(mode uint64) call { return sys(unix.SYS_MKDIR, 0, mode) }},
		{"mknod", func(mode uint64) call { return sys(unix.SYS_MKNOD, 0, unix.S_IFREG|mode, 0) }},
		{"open-creat", func(mode uint64) call { return sys(unix.SYS_OPEN, 0, unix.O_CREAT|unix.O_WRONLY, mode) }},
		{"open-tmpfile", func(mode uint64) call { return sys(unix.SYS_OPEN, 0, unix.O_TMPFILE|unix.O_RDWR, mode) }},
	}
}

// legacyAttacks are the x86_64-only calls that take a mode, run for real.
func legacyAttacks() []attack {
	const create = unix.O_CREAT | unix.O_WRONLY | unix.O_CLOEXEC
	return []attack{
		{"chmod-4755", pathCall(unix.SYS_CHMOD, "target", 0o4755), "EPERM"},
		{"chmod-2755", pathCall(unix.SYS_CHMOD, "target", 0o2755), "EPERM"},
		{"chmod-6755", pathCall(unix.SYS_CHMOD, "target", 0o6755), "EPERM"},
		{"chmod-0755", pathCall(unix.SYS_CHMOD, "target", 0o755), "ok"},
		{"chmod-0644", pathCall(unix.SYS_CHMOD, "target", 0o644), "ok"},
		{"open-creat-4755", pathOpen(unix.SYS_OPEN, "new", create, 0o4755), "EPERM"},
		{"open-creat-0644", pathOpen(unix.SYS_OPEN, "new", create, 0o644), "ok"},
		{"open-tmpfile-4755", pathOpen(unix.SYS_OPEN, ".", unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o4755), "EPERM"},
		{"creat-4755", pathOpen(unix.SYS_CREAT, "new", 0o4755), "EPERM"},
		{"creat-0644", pathOpen(unix.SYS_CREAT, "new", 0o644), "ok"},
		{"mkdir-2755", pathCall(unix.SYS_MKDIR, "newdir", 0o2755), "EPERM"},
		{"mkdir-0755", pathCall(unix.SYS_MKDIR, "newdir", 0o755), "ok"},
		{"mknod-4755", pathCall(unix.SYS_MKNOD, "node", unix.S_IFREG|0o4755, 0), "EPERM"},
		{"mknod-0644", pathCall(unix.SYS_MKNOD, "node", unix.S_IFREG|0o644, 0), "ok"},
	}
}

// pathCall is nr(dir/name, args...).
func pathCall(nr uintptr, name string, args ...uintptr) scenario {
	return func(dir string) string {
		return raw(nr, append([]uintptr{cstr(filepath.Join(dir, name))}, args...)...)
	}
}

// pathOpen is pathCall for a call that returns a descriptor, which it closes.
func pathOpen(nr uintptr, name string, args ...uintptr) scenario {
	return func(dir string) string {
		return rawFD(nr, append([]uintptr{cstr(filepath.Join(dir, name))}, args...)...)
	}
}

func init() {
	scenarios["i386-getpid"] = i386Getpid
}

// i386Marker is printed just before the int 0x80, so the parent can tell
// a kill there from one by an earlier call.
const i386Marker = "STAGE: entering int 0x80"

// i386Getpid enters the kernel through the i386 ABI (int 0x80) from this
// 64-bit process, the way to reach system calls by their 32-bit numbers.
// It runs a few bytes of machine code through a Go func value.
func i386Getpid(string) string {
	code := []byte{
		0xb8, 0x14, 0x00, 0x00, 0x00, // mov eax, 20: getpid in the i386 table
		0xcd, 0x80, // int 0x80
		0xc3, // ret
	}
	mem, err := unix.Mmap(-1, 0, unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return "mmap: " + err.Error()
	}
	copy(mem, code)
	if err := unix.Mprotect(mem, unix.PROT_READ|unix.PROT_EXEC); err != nil {
		return "mprotect: " + err.Error()
	}
	// Where the kernel runs no i386 calls, int 0x80 is a general
	// protection fault. Go's handler would turn that into exit status 2,
	// which looks like any other crash; with SIGSEGV at its default action
	// the kernel kills the child by SIGSEGV, which the parent can name.
	var dfl [4]uint64 // struct sigaction, all zero: SIG_DFL, no flags, empty mask.
	if _, _, errno := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(unix.SIGSEGV), uintptr(unsafe.Pointer(&dfl)), 0, 8, 0, 0); errno != 0 {
		return "rt_sigaction: " + unix.ErrnoName(errno)
	}
	fmt.Println(i386Marker)
	// A func value points at a closure whose first word is the code's address.
	closure := &struct{ pc uintptr }{uintptr(unsafe.Pointer(&mem[0]))}
	i386Call := *(*func())(unsafe.Pointer(&closure))
	i386Call()
	return "ok"
}

func TestI386ABIKilled(t *testing.T) {
	requireRoot(t)
	base := runChild(t, "i386-getpid", modeBaseline, Options{Network: NetworkOpen}, "")
	switch {
	case base.result == "ok":
	case base.signaled == unix.SIGSEGV && strings.Contains(base.output, i386Marker):
		t.Skip("this kernel does not run i386 system calls from a 64-bit process (int 0x80 faults): nothing for the filter to stop")
	default:
		t.Fatalf("an i386 getpid without the filter: %s, want ok, or killed by SIGSEGV where the kernel runs no i386 calls\n%s", base.result, base.output)
	}
	got := runChild(t, "i386-getpid", modeFiltered, Options{Network: NetworkOpen}, "")
	if got.signaled != unix.SIGSYS || !strings.Contains(got.output, i386Marker) {
		t.Errorf("an i386 call under the filter: %s, want killed by SIGSYS at the int 0x80\n%s", got.result, got.output)
	}
	t.Logf("an i386 getpid: without the filter %s, with it %s", base.result, got.result)
}
