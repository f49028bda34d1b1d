package broker

import (
	"fmt"
	"os"
	"sort"

	"thermite/fence"
	"thermite/internal/lanefs"
	"thermite/internal/seccomp"
	"thermite/internal/weaken"
	"thermite/roles"
)

// confinement is everything that keeps one command in its place, beyond
// its user: the rule set, the filter, the groups and variables for GPUs.
type confinement struct {
	ruleSet *os.File
	release func() // lets go of ruleSet; nil without one
	seccomp *seccomp.Options
	groups  []int
	env     []string
}

// ConfineFor decides a role command's confinement. Its Landlock rule set
// lets it read everything but the GPU device files it may not open, write
// only its own places (HOME, TMPDIR, the folders handed to its user) and
// the safe devices, reach TCP only where its network policy is open, and
// scopes abstract unix sockets and signals to its own domain. Its seccomp
// filter refuses mounts, namespaces, set-id modes and the rest, and
// sockets its network policy forbids. Where the kernel cannot do all of
// it, the command is refused, saying why: never a weaker sandbox.
//
// egressPort, where not 0, puts the command in egress mode (netns.go): TCP
// connect to that port alone.
func (b *Broker) ConfineFor(r roles.Role, argv []string, requested []int, home string, egressPort int) (*confinement, error) {
	l, cards, groups, env, err := b.gpuFor(r, requested)
	if err != nil {
		return nil, err
	}
	pol, err := roles.PolicyFor(r, b.cfg.Network, b.cfg.Perf)
	if err != nil {
		return nil, err
	}
	if egressPort > 0 {
		pol.Network = egressNetwork()
	}
	c := &confinement{groups: groups, env: env, seccomp: &seccomp.Options{
		Network: pol.Network, AllowPerf: pol.AllowPerf, FileHelper: fileHelper(r, argv),
	}}
	if weaken.Enabled {
		for _, w := range []string{seccomp.WeakenSysVIPC, seccomp.WeakenSetIDOpenat2, seccomp.WeakenAPITCP} {
			if weaken.Has(w) {
				c.seccomp.Weakened = append(c.seccomp.Weakened, w)
			}
		}
	}
	if weaken.Enabled && weaken.Has("no-landlock") {
		c.seccomp = nil
		return c, nil
	}
	var gpu []string
	if len(cards) > 0 {
		for _, i := range cards {
			card, _ := l.Card(i)
			gpu = append(gpu, card.Path)
		}
		gpu = append(gpu, l.Control...)
	}
	spec := fence.RoleSpec{
		DenyGPU: l.Deny(cards), GPU: gpu, Writable: b.writableFor(r, home),
		DevRoot: b.cfg.GPU.DevRoot, Network: pol.Network, EgressPort: egressPort,
	}
	if weaken.Enabled && weaken.Has(weaken.APITCP) {
		spec.APIPort = b.apiPort
	}
	if weaken.Enabled && weaken.Has("fence-only") {
		spec = fence.RoleSpec{DenyGPU: l.Deny(cards), DevRoot: b.cfg.GPU.DevRoot, FenceOnly: true}
		c.seccomp = nil
	}
	if c.ruleSet, c.release, err = b.ruleSet(spec); err != nil {
		return nil, fmt.Errorf("%w: no command of %s can be confined", err, r.Name)
	}
	return c, nil
}

// fileHelper decides which command keeps openat2, which every other role
// command is refused (it could make a set-id file, its mode out of the
// filter's sight): the lane's file helper, `thermite __lanefs`, started by
// the controller as a lane's command. /proc/self/exe in the shim is this
// very binary, and the helper refuses any mode beyond 0777 itself. Only the
// controller asks for commands, so no lane can dress its own up as one.
func fileHelper(r roles.Role, argv []string) bool {
	return r.Kind == roles.Lane && len(argv) >= 2 && argv[0] == "/proc/self/exe" && argv[1] == lanefs.Arg
}

// writableFor is where a role's command may write: its HOME, its TMPDIR and
// every folder handed to its user.
func (b *Broker) writableFor(r roles.Role, home string) []string {
	set := map[string]bool{b.homeOf(r): true, b.tmpOf(r): true, home: true}
	b.mu.Lock()
	for p := range b.handed[r.UID] {
		set[p] = true
	}
	b.mu.Unlock()
	var out []string
	for p := range set {
		if p == "" {
			continue
		}
		if _, err := os.Lstat(p); err == nil {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}
