// Package netpolicy is a role's network policy, none, api or open: the one
// type and the one parser that the configuration, the role table, the
// broker's Landlock and seccomp policy and the self-test share.
package netpolicy

import "fmt"

// Network is what network a role's command reaches.
type Network string

const (
	// None: no AF_INET or AF_INET6 socket at all, no TCP bind or connect.
	None Network = "none"
	// API: the same for the kernel; the harness API is reached through
	// its unix socket.
	API Network = "api"
	// Open: any socket, any TCP port.
	Open Network = "open"
	// Egress is API plus TCP connect to the egress proxy alone, for a
	// command in a network namespace of its own whose only listener is
	// that proxy. It is never configured: the broker decides it
	// (roles.EgressFor), so ParseNetwork refuses it and Check accepts it.
	Egress Network = "egress"
)

// All lists the policies, in the order messages name them.
var All = []Network{None, API, Open}

// ParseNetwork reads a policy. key names where value came from (a
// configuration key such as network.lane) and leads the error, which is
// one line naming the accepted values.
func ParseNetwork(key, value string) (Network, error) {
	switch n := Network(value); n {
	case None, API, Open:
		return n, nil
	}
	return "", fmt.Errorf("%s: %q is not one of none, api, open", key, value)
}

// Check refuses a value that is not a policy (one set in code or read from
// JSON without ParseNetwork), naming key.
func (n Network) Check(key string) error {
	if n == Egress {
		return nil
	}
	if _, err := ParseNetwork(key, string(n)); err != nil {
		return fmt.Errorf("%s: %q is not one of none, api, egress, open", key, string(n))
	}
	return nil
}

// AllowsInet says whether the command may make AF_INET and AF_INET6
// sockets and bind or connect TCP on any port: only under open. Landlock
// pins ports, not addresses, so api gets no TCP at all.
func (n Network) AllowsInet() bool { return n == Open }

// ReachesAPI says whether the command is meant to reach the harness API
// (through its unix socket).
func (n Network) ReachesAPI() bool { return n == API }

func (n Network) String() string { return string(n) }
