package roles

import "thermite/internal/netpolicy"

// Policy is what a role's command may do beyond its files: the network
// it reaches and whether it may use perf_event_open. Where it may write
// is decided by the broker from the folders the role owns in scratch.
type Policy struct {
	Network   netpolicy.Network `json:"network"`
	AllowPerf bool              `json:"allow_perf"`
}

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
// network (kind name -> policy), and perf_event_open for the kinds in perf.
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
	return p, nil
}
