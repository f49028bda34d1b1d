package selftest

import (
	"fmt"
	"net"
	"strconv"

	"thermite/roles"
)

// Agent egress (broker/netns.go): a command in egress mode runs in a
// network namespace of its own, only lo up, whose one listener is its
// egress proxy on 127.0.0.1:agent.egress_port, and may connect over TCP to
// that port alone (Landlock). The rows below prove the namespace itself:
// they aim at the proxy's own port, which Landlock lets through, on an
// address that is not the proxy's.

// networkOf is a role's network as its probe gets it: egress mode where
// roles.EgressFor gives it to every command of the role (the agents),
// else its policy's.
func networkOf(c *Context, r roles.Role, pol roles.Policy) string {
	if roles.EgressFor(r, pol, c.Cfg.Agent.Egress, false) {
		return roles.NetworkEgress
	}
	return pol.Network
}

// inEgress says whether a role's probe runs in egress mode.
func inEgress(c *Context, r roles.Role) bool { return c.Network[r.Name] == roles.NetworkEgress }

// listenEgressCanary listens, in the broker's own namespace, on another
// loopback address at the egress proxy's port: a command of egress mode
// that reached it would be out of its namespace (or in one that is not
// its own). Several rigs on one host each take a free address.
func listenEgressCanary(c *Context, undo *[]func()) error {
	if len(c.Cfg.Agent.Egress) == 0 {
		return nil
	}
	apiHost, _, _ := net.SplitHostPort(c.Cfg.API.TCP)
	var last error
	for i := 2; i < 64; i++ {
		addr := fmt.Sprintf("127.0.0.%d", i)
		if addr == apiHost {
			continue
		}
		l, err := net.Listen("tcp4", net.JoinHostPort(addr, strconv.Itoa(c.Cfg.Agent.EgressPort)))
		if err != nil {
			last = err
			continue
		}
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				conn.Close()
			}
		}()
		c.EgressOther = l.Addr().String()
		*undo = append(*undo, func() { l.Close() })
		return nil
	}
	return fmt.Errorf("a canary at the egress proxy's port (agent.egress_port %d) on another loopback address: %w", c.Cfg.Agent.EgressPort, last)
}

// egressOther is the probe's attempt at the canary: the proxy's port, an
// address that is not the proxy's.
func egressOther(c *Context, r roles.Role) []Attempt {
	if !inEgress(c, r) || c.EgressOther == "" {
		return nil
	}
	return []Attempt{{Op: OpTCP, Arg: c.EgressOther}}
}

// egressBeyond is an address beyond the host at the proxy's port.
func egressBeyond(c *Context, r roles.Role) []Attempt {
	if !inEgress(c, r) {
		return nil
	}
	return []Attempt{{Op: OpTCP, Arg: net.JoinHostPort(BeyondHost, strconv.Itoa(c.Cfg.Agent.EgressPort))}}
}

// abstractFromEgress is the connect to the broker's abstract socket from
// egress mode: abstract names are the network namespace's own, so the
// broker's is not found there (ECONNREFUSED) before Landlock's scope,
// which refuses it elsewhere (EPERM), is asked.
func abstractFromEgress(c *Context, r roles.Role) []Attempt {
	if !inEgress(c, r) {
		return nil
	}
	return []Attempt{{Op: OpAbstract, Arg: c.Abstract}}
}
