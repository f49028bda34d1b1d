package broker

import (
	"errors"
	"fmt"
	"sync/atomic"

	"thermite/internal/cgroup"
	"thermite/internal/cpuset"
	"thermite/roles"
)

var holds atomic.Int64

// hold reserves a timed run's CPUs and cards while it runs, as its plan
// says (PlanRun's Hold), in the kernel: a held card's node is its timing
// user's alone and any other role's process that has it open is stopped
// (the lines say which); every other role's cpuset group is narrowed to
// leave the CPUs out (the kernel moves their tasks, those started before
// the hold too, and cuts any sched_setaffinity of theirs to what is left),
// and the timing user's group is exactly its CPUs, so the candidate cannot
// widen its own affinity. An advisory hold (no writable cpuset, the loss
// accepted in host.accept_lost) narrows no group.
func (b *Broker) hold(r roles.Role, h *Hold) (release func(), stopped []string, err error) {
	cpus, cards, advisory := h.CPUs, h.Cards, h.Advisory
	key := fmt.Sprintf("hold-%d", holds.Add(1))
	b.cpusetMu.Lock()
	defer b.cpusetMu.Unlock()
	b.mu.Lock()
	b.cpuHolds[key] = cpus
	b.cardHolds[key] = cards
	b.holdUIDs[key] = r.UID
	b.mu.Unlock()
	drop := func() {
		b.mu.Lock()
		delete(b.cpuHolds, key)
		delete(b.cardHolds, key)
		delete(b.holdUIDs, key)
		b.mu.Unlock()
	}
	if !advisory {
		if err := b.applyCPUSetsLocked(); err != nil {
			drop()
			if rerr := b.applyCPUSetsLocked(); rerr != nil {
				b.log.Error("judge CPUs: could not widen the role groups again after a refused hold", "err", rerr)
			}
			return nil, nil, fmt.Errorf("judge CPUs %s for %s: %w", cpus, r.Name, err)
		}
	}
	if len(cards) > 0 {
		// The held cards' nodes go to the timing user's group first, so
		// nothing opens them anew; then whatever had them open stops.
		b.refreshGPUs()
		stopped = b.stopCardHolders(r, cards)
	}
	return func() {
		b.cpusetMu.Lock()
		defer b.cpusetMu.Unlock()
		drop()
		if !advisory {
			if err := b.applyCPUSetsLocked(); err != nil {
				b.log.Error("judge CPUs: could not widen the role groups after a hold", "err", err)
			}
		}
		if len(cards) > 0 {
			b.refreshGPUs()
		}
	}, stopped, nil
}

// advisoryCPUs is true only in test builds: without role cgroups, or the
// breakage test's, where judge CPUs are held by request alone.
func advisoryCPUs() bool { return advisoryWeakened(weakenedNow()) }

// cpusetWhy says why judge CPUs cannot be held in the kernel here, "" when
// they can.
func (b *Broker) cpusetWhy() string {
	switch {
	case b.cg == nil:
		return b.cgWhy
	case !b.cg.HasCPUSet():
		return b.cg.CPUSetWhy()
	}
	return ""
}

// cpusetFor is the CPUs a role's processes may run on now, in the kernel,
// as planGroupCPUs decides from the holds.
func (b *Broker) cpusetFor(r roles.Role) cpuset.Set {
	b.mu.Lock()
	var held, own cpuset.Set
	for key, s := range b.cpuHolds {
		held = append(held, s...)
		if b.holdUIDs[key] == r.UID {
			own = append(own, s...)
		}
	}
	b.mu.Unlock()
	return planGroupCPUs(&b.cfg, r, b.online, b.judgeCPUs, held, own)
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
		if procs, err := g.Procs(); err == nil && len(procs) == 0 && b.cg.Version == 1 {
			return g.SetCPUs(nil)
		}
		return fmt.Errorf("cgroup %s: timed runs hold every CPU (%s) and %s still has processes; judge_cpus must leave other roles a CPU", g.Path(), b.online, r.Name)
	}
	if err := g.SetCPUs(s); err != nil {
		return fmt.Errorf("cpuset of %s: %w", r.Name, err)
	}
	return nil
}

// applyCPUSetsLocked puts every role group's CPUs where the holds say;
// the caller holds cpusetMu. Narrowing a group moves its tasks at once.
func (b *Broker) applyCPUSetsLocked() error {
	if b.cg == nil || !b.cg.HasCPUSet() {
		return nil
	}
	b.mu.Lock()
	groups := make(map[int]*cgroup.Group, len(b.cgGroups))
	for uid, g := range b.cgGroups {
		groups[uid] = g
	}
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
	return errors.Join(errs...)
}
