//go:build thermite_weaken

package weaken

import (
	"os"
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
