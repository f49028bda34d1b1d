package broker

import (
	"strings"
	"testing"

	"thermite/internal/hostpolicy"
	"thermite/internal/weaken"
)

// A role measured incrementally could grow a measured file through a hard
// link made outside its measured folders if nothing kept its links within
// them: without Landlock's file rules, every check walks.
func TestDiskCheckWalksWholeWithoutLandlockFileRules(t *testing.T) {
	for _, c := range []struct {
		name     string
		kernel   hostpolicy.Host
		weakened map[string]bool
		want     bool
		why      string
	}{
		{"landlock ABI 7", hostpolicy.Host{ABI: 7}, nil, true, ""},
		{"landlock ABI 1 (links across folders refused)", hostpolicy.Host{ABI: 1}, nil, true, ""},
		{"no landlock, loss accepted", hostpolicy.Host{ABI: 0}, nil, false, "landlock-fs lost: no Landlock"},
		{"weakened build without rule sets", hostpolicy.Host{ABI: 7}, map[string]bool{weaken.NoLandlock: true}, false, "no-landlock"},
		{"weakened build with the GPU fence alone", hostpolicy.Host{ABI: 7}, map[string]bool{weaken.FenceOnly: true}, false, "fence-only"},
	} {
		ok, why := incrementalUsage(c.kernel, c.weakened)
		if ok != c.want || !strings.Contains(why, c.why) {
			t.Errorf("%s: incremental %t (%q), want %t (%q)", c.name, ok, why, c.want, c.why)
		}
	}
}
