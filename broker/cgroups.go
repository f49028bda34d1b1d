package broker

import (
	"errors"
	"fmt"
	"strings"

	"thermite/internal/cgroup"
	"thermite/internal/hostpolicy"
	"thermite/internal/landlock"
	"thermite/roles"
)

// cgroupState is the cgroup tree and the groups made in it.
type cgroupState struct {
	tree   *cgroup.Tree          // nil where no writable tree exists
	why    string                // why there is none
	groups map[int]*cgroup.Group // each role's, by uid; under b.mu
	ctl    *cgroup.Group         // the controller daemon's own group, once made; under b.mu
}

// initCgroups finds a writable cgroup tree and makes the broker's parent
// group in it. Where there is none, commands run under their rlimits
// alone, and the status and the self-test say why.
func (b *Broker) initCgroups() {
	b.cgroups.groups = map[int]*cgroup.Group{}
	if !b.cfg.Cgroup.Enabled {
		b.cgroups.why = "cgroups are off in the configuration (cgroup.enabled = false)"
		b.note("no per-role cgroups: " + b.cgroups.why + "; rlimits are the floor")
		return
	}
	parent := "thermite"
	if p := strings.TrimSuffix(b.cfg.RolePrefix, "-"); p != "" {
		parent += "-" + p
	}
	t, err := cgroup.Detect("/sys/fs/cgroup", parent)
	if err != nil {
		b.cgroups.why = "no writable cgroup tree: " + err.Error()
		b.note("no per-role cgroups: " + b.cgroups.why + "; rlimits are the floor")
		return
	}
	b.cgroups.tree = t
	b.log.Info("cgroups", "tree", t.String())
}

// groupFor is the cgroup every command of a role runs in, as the policy
// plans it (planCgroup): nil when there is no writable tree.
func (b *Broker) groupFor(r roles.Role) (*cgroup.Group, error) {
	p := planCgroup(&b.cfg, r, b.cgroups.tree != nil, b.hasCPUWeights(), weakenedNow())
	if p == nil {
		return nil, nil
	}
	return b.makeGroup(r, p)
}

// makeGroup makes a role's planned cgroup, once, and keeps it.
func (b *Broker) makeGroup(r roles.Role, p *CgroupPlan) (*cgroup.Group, error) {
	// A new group gets the CPUs the holds leave its role before any task
	// joins it, and no hold changes while it is made.
	b.holds.order.Lock()
	defer b.holds.order.Unlock()
	b.mu.Lock()
	g := b.cgroups.groups[r.UID]
	b.mu.Unlock()
	if g != nil {
		return g, nil
	}
	g, err := b.cgroups.tree.Create(p.Name, p.Limits)
	if err != nil {
		return nil, fmt.Errorf("cgroup for %s: %w", r.Name, err)
	}
	if b.cgroups.tree.HasCPUSet() && !advisoryCPUs() {
		if err := b.setGroupCPUs(r, g); err != nil {
			g.Remove()
			return nil, err
		}
	}
	b.mu.Lock()
	b.cgroups.groups[r.UID] = g
	b.mu.Unlock()
	return g, nil
}

// hasCPUWeights says the tree's groups carry the cpu controller, so that
// the roles' CPU weights (CPUWeight) hold in the kernel.
func (b *Broker) hasCPUWeights() bool {
	return b.cgroups.tree != nil && b.cgroups.tree.HasCPU()
}

// oomKills is how many processes the OOM killer has ended in a group.
func oomKills(g *cgroup.Group) int64 {
	if g == nil {
		return -1
	}
	return g.OOMKillCount()
}

func (b *Broker) closeCgroups() {
	if b.cgroups.tree == nil {
		return
	}
	b.mu.Lock()
	for _, g := range b.cgroups.groups {
		g.Remove()
	}
	b.cgroups.groups = map[int]*cgroup.Group{}
	if b.cgroups.ctl != nil {
		b.cgroups.ctl.Remove()
		b.cgroups.ctl = nil
	}
	b.mu.Unlock()
	b.cgroups.tree.Close()
}

func (b *Broker) cgroupStatus() string {
	if b.cgroups.tree == nil {
		return "none: " + b.cgroups.why + " (rlimits only; timed runs refused: judge CPUs cannot be held in the kernel)"
	}
	judge := "judge CPUs held in the kernel (cpuset)"
	if why := b.cpusetWhy(); why != "" {
		judge = "judge CPUs cannot be held in the kernel, so timed runs are refused: " + why
	}
	return fmt.Sprintf("%s; per role: memory %d MiB (no swap), %d tasks; controller: memory %d MiB, %d tasks; %s",
		b.cgroups.tree.String(), b.cfg.Cgroup.MemoryMB, b.cfg.Cgroup.Pids, b.cfg.Cgroup.ControllerMemoryMB, b.cfg.Cgroup.ControllerPids, judge)
}

// cpuWeightsStatus says whether the roles' CPU weights hold in the
// kernel, and what they are, or why not: "off: <why>" then. It is for the
// status, the rig check and the self-test's verdict; the rig runs either
// way (fairness and timing, not access), but nothing says the weights
// hold where they do not.
func (b *Broker) cpuWeightsStatus() string {
	t := b.cgroups.tree
	switch {
	case t == nil:
		return "off: " + b.cgroups.why
	case !t.HasCPU():
		return "off: " + t.CPUWhy()
	}
	w, lanes := weakenedNow(), b.cfg.Lanes
	show := func(k roles.Kind) int64 {
		if t.Version == 1 {
			return cgroup.SharesOf(planCPUWeight(lanes, k, w))
		}
		return planCPUWeight(lanes, k, w)
	}
	return fmt.Sprintf("on: cgroup v%d %s %d for the controller daemon and each of the rig's own roles (builder, timing users, planner, model-check, supervisor), %d for each lane and agent (%d lanes)",
		t.Version, t.CPUWeightFile(), show(roles.Controller), show(roles.Lane), lanes)
}

// cpuWeights are the CPU weights the kernel holds for the groups made so
// far (each role's by its name, and the controller daemon's), on cgroup
// v2's scale, read back from cpu.weight or cpu.shares.
func (b *Broker) cpuWeights() (map[string]int64, error) {
	out := map[string]int64{}
	if !b.hasCPUWeights() {
		return out, nil
	}
	b.mu.Lock()
	gs := map[string]*cgroup.Group{}
	for uid, g := range b.cgroups.groups {
		if r, ok := b.table.ByUID(uid); ok {
			gs[r.Name] = g
		}
	}
	if b.cgroups.ctl != nil {
		gs[controllerGroup] = b.cgroups.ctl
	}
	b.mu.Unlock()
	var errs []error
	for name, g := range gs {
		w, _, err := g.CPUWeight()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out[name] = w
	}
	return out, errors.Join(errs...)
}

// decideKernelPolicy applies the kernel policy (internal/hostpolicy) to
// this kernel's Landlock ABI and this cgroup tree: a protection lost here
// and not named in host.accept_lost refuses the start.
func (b *Broker) decideKernelPolicy() error {
	b.kernel = hostpolicy.Host{ABI: landlockABI(), FenceABI: b.cfg.GPU.FenceMinABI, CgroupsOff: !b.cfg.Cgroup.Enabled}
	if b.cgroups.tree == nil {
		b.kernel.Cgroups = b.cgroups.why
	}
	b.kernel.CPUSet = b.cpusetWhy()
	b.kernel.ProcHidepid = b.procHidepid()
	if err := hostpolicy.Decide(b.kernel, b.cfg.Host.AcceptLost); err != nil {
		if strings.Contains(err.Error(), "landlock") || b.kernel.ABI == 0 {
			// internal/testrig matches these words to skip tests on such a kernel.
			return fmt.Errorf("broker: %w (in full, the policy every role command runs under needs Landlock ABI %d)", err, landlock.PolicyABI)
		}
		return fmt.Errorf("broker: %w", err)
	}
	for _, w := range b.Without() {
		b.log.Warn("running without a protection (host.accept_lost)", "protection", w)
	}
	return nil
}

// Without names the protections this rig runs without, accepted by the
// operator: for the status and the self-test's verdict.
func (b *Broker) Without() []string {
	return hostpolicy.Without(b.kernel, b.cfg.Host.AcceptLost)
}
