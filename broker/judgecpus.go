package broker

import (
	"errors"
	"fmt"
	"sort"
	"sync/atomic"

	"thermite/internal/cgroup"
	"thermite/internal/cpuset"
	"thermite/internal/hostpolicy"
	"thermite/internal/weaken"
	"thermite/roles"
)

var holds atomic.Int64

// hold reserves a timed run's CPUs and cards while it runs, in the kernel:
// a held card's node is its timing user's alone and any other role's
// process that has it open is stopped (the lines say which);
// every other role's cpuset group is narrowed to leave the CPUs out (the
// kernel moves their tasks, those started before the hold too, and cuts
// any sched_setaffinity of theirs to what is left), and the timing user's
// group is exactly its CPUs, so the candidate cannot widen its own
// affinity. Where no writable cpuset exists, the timed run is refused,
// unless host.accept_lost names judge-cpuset.
func (b *Broker) hold(r roles.Role, cpus cpuset.Set, cards []int) (release func(), stopped []string, err error) {
	advisory := advisoryCPUs()
	if !advisory {
		var err error
		// Where no writable cpuset exists, the operator's accept_lost
		// decides: refused, or held by affinity alone and named.
		if advisory, err = hostpolicy.TimedRunDecision(b.kernel, b.cfg.Host.AcceptLost); err != nil {
			return nil, nil, fmt.Errorf("judge CPUs %s: %w", cpus, err)
		}
	}
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
func advisoryCPUs() bool {
	return weaken.Enabled && (weaken.Has(weaken.AdvisoryCPUs) || weaken.Has("fence-only") || weaken.Has("no-landlock"))
}

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

// cpusetFor decides which CPUs a role's processes may run on now, in the
// kernel: a timing user holding CPUs gets exactly those; a timing user
// without a hold its card's share of the judge CPUs; every other role
// every CPU the broker has but those a timed run holds.
func (b *Broker) cpusetFor(r roles.Role) cpuset.Set {
	b.mu.Lock()
	defer b.mu.Unlock()
	var held, own cpuset.Set
	for key, s := range b.cpuHolds {
		held = append(held, s...)
		if b.holdUIDs[key] == r.UID {
			own = append(own, s...)
		}
	}
	if r.Kind == roles.Timing {
		if len(own) > 0 {
			sort.Ints(own)
			return own
		}
		share, err := b.cfg.JudgeCPUsOf(r.Index - 1)
		if err != nil {
			return nil
		}
		return share
	}
	return b.online.Minus(held)
}

// setGroupCPUs gives a role's group the CPUs cpusetFor decides. A timing
// user with no judge CPU of its own keeps its group's CPUs as they are: it
// runs nothing (CPUsFor refuses it).
func (b *Broker) setGroupCPUs(r roles.Role, g *cgroup.Group) error {
	s := b.cpusetFor(r)
	if r.Kind == roles.Timing && len(s) == 0 {
		return nil
	}
	if len(s) == 0 {
		// cgroup v1 takes an empty cpuset for a group with no tasks (its
		// commands are refused meanwhile: CPUsFor finds no CPU free).
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
