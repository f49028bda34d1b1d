package roles

import (
	"testing"

	"thermite/internal/netpolicy"
)

// The judge's users make no unix socket; they, the lanes and the agents
// watch no files; the controller, the planner, the model check and the
// supervisor keep both. An operator's network override changes neither.
func TestPolicyForChannels(t *testing.T) {
	tab, err := New(Spec{Prefix: "p-", Base: 40000, Lanes: 1, TimingUsers: 2})
	if err != nil {
		t.Fatal(err)
	}
	noSockets := map[Kind]bool{Builder: true, Timing: true}
	noWatches := map[Kind]bool{Builder: true, Timing: true, Lane: true, Agent: true}
	for _, network := range []map[string]netpolicy.Network{nil, {"timing": netpolicy.Open, "builder": netpolicy.Open, "lane": netpolicy.Open}} {
		for _, r := range tab.Roles {
			p, err := PolicyFor(r, network, nil)
			if err != nil {
				t.Fatalf("%s: %v", r.Name, err)
			}
			if p.NoUnixSockets != noSockets[r.Kind] || p.NoWatches != noWatches[r.Kind] {
				t.Errorf("%s (%s, network %v): no unix sockets %v, no watches %v; want %v, %v", r.Name, r.Kind, network, p.NoUnixSockets, p.NoWatches, noSockets[r.Kind], noWatches[r.Kind])
			}
		}
	}
}
