//go:build linux && amd64

package seccomp

import "golang.org/x/sys/unix"

// auditArchNative is the only system-call ABI a role command may use.
// A 64-bit process can still enter the kernel through the i386 ABI (int
// 0x80), and seccomp then reports AUDIT_ARCH_I386 with i386 numbers, which
// this filter's numbers do not describe.
const auditArchNative = unix.AUDIT_ARCH_X86_64

// x32SyscallBit marks an x32 ABI call. The kernel reports x32 calls with
// arch AUDIT_ARCH_X86_64 and this bit in nr, so the arch check alone lets
// them through: 0x40000000|SYS_MOUNT would be x32's mount.
const (
	x32SyscallBit = 0x40000000
	hasX32        = true
)

// argLowWord is where the low 32 bits of an argument sit in its 8 bytes.
const argLowWord = 0 // little-endian

// argHighWord is where the high 32 bits sit.
const argHighWord = 4

// System calls only the older ABIs have; noSyscall where the ABI lacks one.
const (
	sysOpen  = unix.SYS_OPEN
	sysCreat = unix.SYS_CREAT
	sysChmod = unix.SYS_CHMOD
	sysMkdir = unix.SYS_MKDIR
	sysMknod = unix.SYS_MKNOD

	sysInotifyInit = unix.SYS_INOTIFY_INIT
)
