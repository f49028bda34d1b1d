//go:build !thermite_weaken

// Package weaken lets a test build of thermite (build tag thermite_weaken)
// switch off one protection at a time, so the self-test's tests can prove
// that the self-test catches each. In every other build it is constant
// false and the compiler drops what it guards.
package weaken

// Enabled says whether this build can be weakened at all.
const Enabled = false

// Has reports whether the named protection is switched off.
func Has(string) bool { return false }

// LandlockABI is the Landlock ABI a test build pretends the kernel has;
// -1 in every other build: the kernel's own.
func LandlockABI() int { return -1 }
