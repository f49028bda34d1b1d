//go:build linux && amd64

package seccomp

import (
	"path/filepath"
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
	// A func value points at a closure whose first word is the code's address.
	closure := &struct{ pc uintptr }{uintptr(unsafe.Pointer(&mem[0]))}
	i386Call := *(*func())(unsafe.Pointer(&closure))
	i386Call()
	return "ok"
}

func TestI386ABIKilled(t *testing.T) {
	requireRoot(t)
	base := runChild(t, "i386-getpid", modeBaseline, Options{Network: NetworkOpen}, "")
	if base.result != "ok" {
		t.Skipf("this kernel does not run i386 calls at all (%s): nothing for the filter to stop", base.result)
	}
	got := runChild(t, "i386-getpid", modeFiltered, Options{Network: NetworkOpen}, "")
	if got.signaled != unix.SIGSYS {
		t.Errorf("an i386 call under the filter: %s, want killed by SIGSYS\n%s", got.result, got.output)
	}
	t.Logf("an i386 getpid: without the filter %s, with it %s", base.result, got.result)
}
