package selftest

import (
	"fmt"
	"net"
	"strconv"

	"thermite/internal/netpolicy"
	"thermite/internal/rpc"
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
func networkOf(c *Context, r roles.Role, pol roles.Policy) netpolicy.Network {
	if roles.EgressFor(r, pol, c.Cfg.Agent.Egress, false) {
		return netpolicy.Egress
	}
	return pol.Network
}

// inEgress says whether a role's probe runs in egress mode.
func inEgress(c *Context, r roles.Role) bool { return c.Network[r.Name] == netpolicy.Egress }

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

// EgressProber is a Host that can run a probe in a role's egress mode.
type EgressProber interface {
	RunEgressProbe(role roles.Role, gpus []int, stdin []byte) (stdout, stderr []byte, res *rpc.RunResult, err error)
}

// egressHost is a Host whose probes run in egress mode.
type egressHost struct {
	Host
	ep EgressProber
}

func (e egressHost) RunProbe(r roles.Role, gpus []int, stdin []byte) ([]byte, []byte, *rpc.RunResult, error) {
	return e.ep.RunEgressProbe(r, gpus, stdin)
}

// egressPhase probes every lane once more as the lane harness runs an
// agent program: the lane's user in egress mode. Every lane row applies
// to it as to the lane (the lane's access and none of the judge's), with
// the network rows of egress mode: so the self-test proves what a lane
// harness's agent may reach, not only what the lane's other commands may.
func egressPhase(h Host, c *Context, record func([]rpc.Probe), fail func(role, attempt, expect, got string)) {
	if len(c.Cfg.Agent.Egress) == 0 {
		return
	}
	ep, ok := h.(EgressProber)
	if !ok {
		fail("rig", "probe the lane harness in egress mode", "probed", "this host runs no probe in egress mode")
		return
	}
	canary, _ := c.Table.Role("planner")
	pid, stop, err := h.StartCanary(canary, nil)
	if err != nil {
		fail("rig", "start a canary process as planner", "started", err.Error())
		return
	}
	defer stop()
	if c.LinkedSetID == nil {
		c.LinkedSetID = map[int]string{}
	}
	// Every lane's entries are switched first and put back once all have
	// run, so that the probes, side by side, read them unchanged.
	type kept struct {
		network netpolicy.Network
		other   int
		linked  string
	}
	was := map[string]kept{}
	var lanes []roles.Role
	for _, r := range c.Table.Roles {
		pol, err := roles.PolicyFor(r, c.Cfg.Network, c.Cfg.Perf)
		if err != nil || r.Kind != roles.Lane || !roles.EgressFor(r, pol, c.Cfg.Agent.Egress, true) {
			continue
		}
		// The set-id file the stop left behind was the first probe's to
		// try, and is gone since: that row is not run twice.
		was[r.Name] = kept{c.Network[r.Name], c.OtherPID[r.Name], c.LinkedSetID[r.Index]}
		c.Network[r.Name], c.OtherPID[r.Name], c.LinkedSetID[r.Index] = netpolicy.Egress, pid, ""
		lanes = append(lanes, r)
	}
	sideBySide(lanes, func(r roles.Role) {
		record(probeRows(c, r, r.Name+" as the lane harness", Policy, func(plan []Attempt) ([]Outcome, string) {
			return runProbe(egressHost{Host: h, ep: ep}, c, r, plan)
		}, func() { stopRole(h, r) }))
	})
	for _, r := range lanes {
		k := was[r.Name]
		c.Network[r.Name], c.OtherPID[r.Name], c.LinkedSetID[r.Index] = k.network, k.other, k.linked
	}
}
