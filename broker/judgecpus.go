package broker

import (
	"errors"
	"fmt"

	"thermite/internal/cgroup"
	"thermite/internal/cpuset"
	"thermite/roles"
)

// advisoryCPUs is true only in test builds: without role cgroups, or the
// breakage test's, where judge CPUs are held by request alone.
func advisoryCPUs() bool { return advisoryWeakened(weakenedNow()) }

// cpusetWhy says why judge CPUs cannot be held in the kernel here, "" when
// they can.
func (b *Broker) cpusetWhy() string {
	switch {
	case b.cgroups.tree == nil:
		return b.cgroups.why
	case !b.cgroups.tree.HasCPUSet():
		return b.cgroups.tree.CPUSetWhy()
	}
	return ""
}

// cpusetFor is the CPUs a role's processes may run on now, in the kernel,
// as planGroupCPUs decides from the holds.
func (b *Broker) cpusetFor(r roles.Role) cpuset.Set {
	held, own := b.holds.cpusOf(r.UID)
	return planGroupCPUs(&b.cfg, r, b.cpus.online, b.cpus.judge, held, own)
}

// setGroupCPUs gives a role's group the CPUs cpusetFor decides. A timing
// user with no judge CPU of its own keeps its group's CPUs as they are: it
// runs nothing (planCPUs refuses it).
func (b *Broker) setGroupCPUs(r roles.Role, g *cgroup.Group) error {
	s := b.cpusetFor(r)
	if r.Kind == roles.Timing && len(s) == 0 {
		return nil
	}
	if len(s) == 0 {
		// cgroup v1 takes an empty cpuset for a group with no tasks (its
		// commands are refused meanwhile: planCPUs finds no CPU free).
		if procs, err := g.Procs(); err == nil && len(procs) == 0 && b.cgroups.tree.Version == 1 {
			return g.SetCPUs(nil)
		}
		return fmt.Errorf("cgroup %s: timed runs hold every CPU (%s) and %s still has processes; judge_cpus must leave other roles a CPU", g.Path(), b.cpus.online, r.Name)
	}
	if err := g.SetCPUs(s); err != nil {
		return fmt.Errorf("cpuset of %s: %w", r.Name, err)
	}
	return nil
}

// applyCPUSetsLocked puts every role group's CPUs where the holds say;
// the caller holds b.holds.order. Narrowing a group moves its tasks at once.
func (b *Broker) applyCPUSetsLocked() error {
	if b.cgroups.tree == nil || !b.cgroups.tree.HasCPUSet() {
		return nil
	}
	b.mu.Lock()
	groups := make(map[int]*cgroup.Group, len(b.cgroups.groups))
	for uid, g := range b.cgroups.groups {
		groups[uid] = g
	}
	ctl := b.cgroups.ctl
	b.mu.Unlock()
	var errs []error
	for uid, g := range groups {
		r, ok := b.table.ByUID(uid)
		if !ok {
			continue
		}
		if err := b.setGroupCPUs(r, g); err != nil {
			errs = append(errs, err)
		}
	}
	if ctl != nil {
		// The controller daemon (and a kit's check it runs) is narrowed as
		// a role is: busy with lanes' calls, it would otherwise run on the
		// CPUs a timed repeat holds, and move the judge's clock.
		if s := b.cpus.online.Minus(b.holds.heldCPUs()); len(s) > 0 {
			if err := ctl.SetCPUs(s); err != nil {
				errs = append(errs, fmt.Errorf("cpuset of the controller: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

// cpuLayout is the CPUs the broker may use (online) and the judge's among
// them (judge_cpus), read once at the start.
type cpuLayout struct {
	online cpuset.Set
	judge  cpuset.Set
}
