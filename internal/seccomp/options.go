package seccomp

import (
	"fmt"

	"thermite/internal/netpolicy"
	"thermite/internal/weaken"
)

// The network policies a role command can get.
const (
	// NetworkNone allows local sockets only: socket and socketpair for
	// AF_UNIX; every other family fails with EPERM.
	NetworkNone = netpolicy.None
	// NetworkAPI is NetworkNone for the filter: the harness API is
	// reached through its unix socket, and no TCP socket can be made.
	NetworkAPI = netpolicy.API
	// NetworkOpen filters no socket call.
	NetworkOpen = netpolicy.Open
	// NetworkEgress is NetworkAPI plus AF_INET and AF_INET6 TCP stream
	// sockets, for a command in a network namespace whose only listener
	// is its egress proxy (Landlock pins the proxy's port).
	NetworkEgress = netpolicy.Egress
	// networkAPITCP is api as it was before issue 13 (TCP allowed, the
	// port left to Landlock), for the WeakenAPITCP test build only.
	networkAPITCP netpolicy.Network = "api-tcp"
)

// Options select the variable parts of a role command's filter; everything
// else is denied for every role.
type Options struct {
	Network   netpolicy.Network
	AllowPerf bool // perf_event_open allowed
	// FileHelper keeps openat2 for the lane's file helper (`thermite
	// __lanefs`), which needs its RESOLVE_BENEATH and checks every mode it
	// is asked for itself. Every other command gets ENOSYS.
	FileHelper bool `json:"file_helper,omitempty"`
	// NoUnixSockets refuses socket(AF_UNIX) whatever the network policy:
	// the judge's users, whose command runs a lane's code with the kit's
	// hidden inputs, reach no other role's listener and listen for none.
	// socketpair stays: the pair it makes has no name another role reaches.
	NoUnixSockets bool `json:"no_unix_sockets,omitempty"`
	// NoWatches refuses inotify, fanotify and dnotify (fcntl F_NOTIFY):
	// watching a folder every role reads tells one role when another
	// opens or reads a file there.
	NoWatches bool `json:"no_watches,omitempty"`
	// Controller selects the controller daemon's filter (ControllerOptions)
	// instead of a role command's: its own sockets (restrictControllerSockets),
	// no ptrace at all, and openat2 kept for the kit loader's
	// RESOLVE_BENEATH. Network must then be empty.
	Controller bool `json:"controller,omitempty"`
	// Weakened names rules to leave out; only a thermite_weaken test build
	// honours it.
	Weakened []string `json:"weakened,omitempty"`
}

// weakened says whether a thermite_weaken test build was asked to leave
// out the rule named name.
func (o Options) weakened(name string) bool {
	if !weaken.Enabled {
		return false
	}
	for _, w := range o.Weakened {
		if w == name {
			return true
		}
	}
	return false
}

// Validate refuses options the filter cannot honour, naming the bad value.
func (o Options) Validate() error {
	if o.Controller {
		if o.Network != "" || o.AllowPerf || o.FileHelper || o.NoUnixSockets || o.NoWatches {
			return fmt.Errorf("seccomp: the controller's filter takes no network policy, perf, file helper, unix socket or watch rule (got %q, %v, %v, %v, %v)", o.Network, o.AllowPerf, o.FileHelper, o.NoUnixSockets, o.NoWatches)
		}
		return nil
	}
	return o.Network.Check("seccomp: network policy")
}

// The rules a thermite_weaken test build can leave out (Options.Weakened).
const (
	WeakenSysVIPC      = weaken.SysVIPC     // denySharedSysVIPC
	WeakenSetIDOpenat2 = weaken.SetID       // denyOpenat2
	WeakenAPITCP       = weaken.APITCP      // restrictSockets: TCP for api roles
	WeakenAIO          = weaken.AIO         // denyAIO
	WeakenStopSignals  = weaken.StopSignals // denyStopSignals
	WeakenPOSIXQueues  = weaken.POSIXQueues // denyPOSIXQueues
)

// ControllerOptions are the controller daemon's filter: everything a role
// command is refused, ptrace of any kind, and every socket but the ones it
// serves and fetches with.
func ControllerOptions() Options { return Options{Controller: true} }
