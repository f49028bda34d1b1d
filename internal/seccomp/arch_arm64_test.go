//go:build linux && arm64

package seccomp

// arm64 has no chmod, creat, mkdir, mknod or open: only their *at forms,
// which the common tests cover.
func legacyModeCalls() []modeCall {
	return nil
}

func legacyAttacks() []attack { return nil }
