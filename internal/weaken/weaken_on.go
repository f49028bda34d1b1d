//go:build thermite_weaken

package weaken

import (
	"os"
	"strconv"
	"strings"
)

// Enabled says whether this build can be weakened at all.
const Enabled = true

// Has reports whether the named protection is switched off: the broker's
// THERMITE_WEAKEN lists them, comma-separated.
func Has(name string) bool {
	for _, w := range strings.Split(os.Getenv("THERMITE_WEAKEN"), ",") {
		if w == name {
			return true
		}
	}
	return false
}

// LandlockABI is the Landlock ABI the broker pretends the kernel has, from
// a switch landlock-abi-N in THERMITE_WEAKEN (N from 0), or -1 for none:
// the kernel policy's tests run an older kernel's rule sets on this one.
func LandlockABI() int {
	for _, w := range strings.Split(os.Getenv("THERMITE_WEAKEN"), ",") {
		if n, ok := strings.CutPrefix(w, LandlockABIPrefix); ok {
			if v, err := strconv.Atoi(n); err == nil && v >= 0 {
				return v
			}
		}
	}
	return -1
}
