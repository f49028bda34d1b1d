package broker

import (
	"strings"
	"testing"

	"thermite/internal/config"
	"thermite/internal/hostpolicy"
	"thermite/internal/weaken"
	"thermite/roles"
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

// The broker's watches are a fair share among every role of the table:
// each role, the 16th lane and the judge's builder among them, is
// guaranteed a floor that lanes making folders cannot take, and all the
// floors fit in the budget.
func TestEveryRoleHasAFloorOfTheBrokersWatches(t *testing.T) {
	table, err := roles.FromConfig(config.Default())
	if err != nil {
		t.Fatal(err)
	}
	b := &Broker{table: table}
	s := b.watchState()
	total, perRole := watchBudget()
	floor := s.budget.Guaranteed()
	if floor < 1 || floor > perRole || floor*len(table.Roles) > total {
		t.Fatalf("%d roles, %d watches (at most %d a role): each guaranteed %d", len(table.Roles), total, perRole, floor)
	}
	if s.budget.Left() != total {
		t.Fatalf("a fresh budget has %d of its %d left", s.budget.Left(), total)
	}
}
