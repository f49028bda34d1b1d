//go:build linux && arm64

package seccomp

import "golang.org/x/sys/unix"

// auditArchNative is the only system-call ABI a role command may use; a
// 32-bit ARM process (AUDIT_ARCH_ARM) numbers its calls differently.
const auditArchNative = unix.AUDIT_ARCH_AARCH64

// arm64 has no x32-style numbering inside the native ABI.
const (
	x32SyscallBit = 0
	hasX32        = false
)

// argLowWord is where the low 32 bits of an argument sit in its 8 bytes.
const argLowWord = 0 // little-endian

// argHighWord is where the high 32 bits sit.
const argHighWord = 4

// arm64 has only the *at forms of these calls.
const (
	sysOpen  = noSyscall
	sysCreat = noSyscall
	sysChmod = noSyscall
	sysMkdir = noSyscall
	sysMknod = noSyscall

	sysInotifyInit = noSyscall
)
