package seccomp

import "fmt"

// The network policies a role command can get.
const (
	// NetworkNone allows local sockets only: socket and socketpair for
	// AF_UNIX; every other family fails with EPERM.
	NetworkNone = "none"
	// NetworkAPI adds TCP over IPv4 and IPv6 to NetworkNone. Which ports
	// a role may reach is Landlock's rule set, not this filter's.
	NetworkAPI = "api"
	// NetworkOpen filters no socket call.
	NetworkOpen = "open"
)

// Options select the variable parts of a role command's filter; everything
// else is denied for every role.
type Options struct {
	Network   string // "none", "api" or "open"
	AllowPerf bool   // perf_event_open allowed
}

// Validate refuses options the filter cannot honour, naming the bad value.
func (o Options) Validate() error {
	switch o.Network {
	case NetworkNone, NetworkAPI, NetworkOpen:
		return nil
	}
	return fmt.Errorf("seccomp: network policy %q is not one of %s, %s, %s",
		o.Network, NetworkNone, NetworkAPI, NetworkOpen)
}
