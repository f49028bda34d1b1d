package roles

import (
	"slices"

	"thermite/internal/netpolicy"
)

// Policy is what a role's command may do beyond its files: the network
// it reaches and whether it may use perf_event_open. Where it may write
// is decided by the broker from the folders the role owns in scratch.
type Policy struct {
	Network   netpolicy.Network `json:"network"`
	AllowPerf bool              `json:"allow_perf"`
	// NoUnixSockets: the command makes no unix socket (socketpair aside)
	// and no socket file or FIFO, so it reaches no listener another role
	// opened to all and offers none (NoUnixSocketKinds).
	NoUnixSockets bool `json:"no_unix_sockets,omitempty"`
	// NoWatches: the command may not watch files with inotify, fanotify
	// or dnotify (NoWatchKinds).
	NoWatches bool `json:"no_watches,omitempty"`
}

// NoUnixSocketKinds are the kinds whose commands make no unix socket:
// the judge's users. The timing user runs a lane's candidate with the
// kit's hidden inputs, and the builder runs a lane's build; either could
// connect to a socket a lane listens on in a folder it opened to every
// role, and hand the lane what only the judge may see. Landlock bounds a
// socket's bind but not a connect by path, so the filter refuses the
// socket itself.
var NoUnixSocketKinds = []Kind{Builder, Timing}

// NoWatchKinds are the kinds whose commands may not watch files. Every
// role reads /usr, /etc and the run's research folders: a watch there
// shows a lane when another lane opens its area, or when the timing
// user's candidate opens and reads a file, a side channel on the judge's
// timing and a covert channel from a candidate to a lane. The agent
// programs run with it refused (their e2e tests).
var NoWatchKinds = []Kind{Builder, Timing, Lane, Agent}

// EgressFor decides whether a role's command runs in egress mode
// (netpolicy.Egress): only where the rig lists providers in agent.egress
// and the role's network is "api"; for an agent, every command (the
// agent's own programs are what reach a model provider); for a lane, only
// the lane harness's run of an agent program (asked), never its other
// commands.
func EgressFor(r Role, p Policy, egress []string, asked bool) bool {
	if len(egress) == 0 || p.Network != netpolicy.API {
		return false
	}
	return r.Kind == Agent || (r.Kind == Lane && asked)
}

// DefaultNetwork is each kind's network unless the configuration says
// otherwise: the lanes and the agents reach the harness API only, the
// judge's users nothing, the planner and the model check the open network.
var DefaultNetwork = map[Kind]netpolicy.Network{
	Controller: netpolicy.Open,
	Builder:    netpolicy.None,
	Timing:     netpolicy.None,
	Planner:    netpolicy.Open,
	ModelCheck: netpolicy.Open,
	Lane:       netpolicy.API,
	Agent:      netpolicy.API,
	Supervisor: netpolicy.None,
}

// Kinds lists every kind of role, in the table's order.
var Kinds = []Kind{Controller, Builder, Timing, Planner, ModelCheck, Lane, Agent, Supervisor}

// PolicyFor is a role's policy: its kind's default network, overridden by
// network (kind name -> policy), perf_event_open for the kinds in perf,
// and no unix sockets or file watches for the kinds listed above.
func PolicyFor(r Role, network map[string]netpolicy.Network, perf []string) (Policy, error) {
	p := Policy{Network: DefaultNetwork[r.Kind]}
	if n, ok := network[string(r.Kind)]; ok {
		p.Network = n
	}
	if err := p.Network.Check("network." + string(r.Kind)); err != nil {
		return p, err
	}
	for _, k := range perf {
		if k == string(r.Kind) {
			p.AllowPerf = true
		}
	}
	p.NoUnixSockets = slices.Contains(NoUnixSocketKinds, r.Kind)
	p.NoWatches = slices.Contains(NoWatchKinds, r.Kind)
	return p, nil
}
