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
