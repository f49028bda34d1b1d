package roles

import "fmt"

// Policy is what a role's command may do beyond its files: the network
// it reaches and whether it may use perf_event_open. Where it may write
// is decided by the broker from the folders the role owns in scratch.
type Policy struct {
	// Network is "none" (no AF_INET or AF_INET6 socket at all), "api" (the
	// same for the kernel: the harness API through its unix socket, no TCP)
	// or "open".
	Network   string `json:"network"`
	AllowPerf bool   `json:"allow_perf"`
}

// NetworkEgress is the network of a command that the rig gives egress
// (agent.egress): "api", plus TCP connect to its egress proxy alone, in a
// network namespace of its own whose only listener is that proxy. It is
// never configured: EgressFor decides it.
const NetworkEgress = "egress"

// EgressFor decides whether a role's command runs in egress mode: only
// where the rig lists providers in agent.egress and the role's network is
// "api"; for an agent, every command (the agent's own programs are what
// reach a model provider); for a lane, only the lane harness's run of an
// agent program (asked), never its other commands.
func EgressFor(r Role, p Policy, egress []string, asked bool) bool {
	if len(egress) == 0 || p.Network != "api" {
		return false
	}
	return r.Kind == Agent || (r.Kind == Lane && asked)
}

// Networks lists the network policies.
var Networks = []string{"none", "api", "open"}

// DefaultNetwork is each kind's network unless the configuration says
// otherwise: the lanes and the agents reach the harness API only, the
// judge's users nothing, the planner and the model check the open network.
var DefaultNetwork = map[Kind]string{
	Controller: "open",
	Builder:    "none",
	Timing:     "none",
	Planner:    "open",
	ModelCheck: "open",
	Lane:       "api",
	Agent:      "api",
	Supervisor: "none",
}

// Kinds lists every kind of role, in the table's order.
var Kinds = []Kind{Controller, Builder, Timing, Planner, ModelCheck, Lane, Agent, Supervisor}

// PolicyFor is a role's policy: its kind's default network, overridden by
// network (kind name -> policy), and perf_event_open for the kinds in perf.
func PolicyFor(r Role, network map[string]string, perf []string) (Policy, error) {
	p := Policy{Network: DefaultNetwork[r.Kind]}
	if n, ok := network[string(r.Kind)]; ok {
		p.Network = n
	}
	switch p.Network {
	case "none", "api", "open":
	default:
		return p, fmt.Errorf("network.%s: %q is not one of none, api, open", r.Kind, p.Network)
	}
	for _, k := range perf {
		if k == string(r.Kind) {
			p.AllowPerf = true
		}
	}
	return p, nil
}
