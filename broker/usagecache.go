package broker

import (
	"thermite/internal/procs"
	"thermite/internal/rpc"
)

// A disk measure of a role is reused only when nothing of the role can
// have changed what it holds since: no command of the role has started
// (every start, of any kind, moves the role's generation on), the folders
// handed to it are the same (a change moves every role's generation on),
// no process of the role runs but the broker's own helpers (a lane's file
// helper, whose changes the controller vouches for), and it was so at the
// measure too. An idle trial then costs no walk at all at its disk check.

// usageGen is what a reused measure must still match.
type usageGen struct{ run, hand uint64 }

type keptUsage struct {
	gen usageGen
	u   rpc.DiskUsage
}

// bumpRole moves a role's generation on: a command of it starts or stops.
func (b *Broker) bumpRole(uid int) {
	b.mu.Lock()
	b.runGen[uid]++
	delete(b.usage, uid)
	b.mu.Unlock()
}

// bumpAllLocked moves every role's generation on (b.mu held): the folders
// handed to roles changed.
func (b *Broker) bumpAllLocked() {
	b.handGen++
	clear(b.usage)
}

// roleGen is a role's generation: its own starts and the handed folders'.
func (b *Broker) roleGen(uid int) usageGen {
	b.mu.Lock()
	defer b.mu.Unlock()
	return usageGen{b.runGen[uid], b.handGen}
}

// roleIdle says whether no process of the role runs but the broker's own
// helpers (the thermite commands it started itself: a lane's file helper).
func (b *Broker) roleIdle(uid int) bool {
	// Every process of a role runs in its cgroup (placed before the
	// command exists, and no role can leave it): one read there instead of
	// a walk of /proc, where the role has a group.
	b.mu.Lock()
	g := b.cgGroups[uid]
	b.mu.Unlock()
	var pids []int
	var err error
	if g != nil {
		pids, err = g.Procs()
	} else {
		pids, err = procs.ByUID("/proc", uid)
	}
	if err != nil {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, pid := range pids {
		if !b.ownExec[pid] {
			return false
		}
	}
	return true
}

// reusableUsage is the role's last measure, when idle holds and its
// generation is the measure's.
func (b *Broker) reusableUsage(uid int, gen usageGen, idle bool) (*rpc.DiskUsage, bool) {
	if !idle {
		return nil, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	k, ok := b.usage[uid]
	if !ok || k.gen != gen {
		return nil, false
	}
	u := k.u
	u.Reused = true
	return &u, true
}

// keepUsage keeps a measure for reuse, or forgets the role's last one.
func (b *Broker) keepUsage(uid int, gen usageGen, u *rpc.DiskUsage, keep bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if keep {
		b.usage[uid] = keptUsage{gen: gen, u: *u}
	} else {
		delete(b.usage, uid)
	}
}
