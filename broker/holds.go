package broker

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"thermite/internal/cpuset"
	"thermite/roles"
)

// holdSet is what timed runs hold while they run: their judge CPUs and
// cards, by hold, and the timing user of each. Its lock guards the maps
// alone; order (the broker's cpuset lock) orders holds, their release and
// new role groups, so each group's CPUs are always those cpusetFor gives
// it.
type holdSet struct {
	mu    sync.Mutex
	cpus  map[string]cpuset.Set // judge CPUs held by timed runs
	cards map[string][]int      // cards held by timed runs
	uids  map[string]int        // the timing user of each hold
	order sync.Mutex
}

func newHoldSet() holdSet {
	return holdSet{cpus: map[string]cpuset.Set{}, cards: map[string][]int{}, uids: map[string]int{}}
}

// add records a hold of cpus and cards by the user uid under key.
func (h *holdSet) add(key string, uid int, cpus cpuset.Set, cards []int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cpus[key] = cpus
	h.cards[key] = cards
	h.uids[key] = uid
}

// drop forgets the hold under key.
func (h *holdSet) drop(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.cpus, key)
	delete(h.cards, key)
	delete(h.uids, key)
}

// heldCards is the cards a timed run holds now.
func (h *holdSet) heldCards() map[int]bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[int]bool{}
	for _, cs := range h.cards {
		for _, c := range cs {
			out[c] = true
		}
	}
	return out
}

// heldCPUs is the judge CPUs a timed run holds now, in order.
func (h *holdSet) heldCPUs() cpuset.Set {
	held, _ := h.cpusOf(-1)
	return held
}

// cpusOf is every held judge CPU and those the user uid holds, each in
// order.
func (h *holdSet) cpusOf(uid int) (held, own cpuset.Set) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for key, s := range h.cpus {
		held = append(held, s...)
		if h.uids[key] == uid {
			own = append(own, s...)
		}
	}
	sort.Ints(held)
	sort.Ints(own)
	return held, own
}

// cardHolders is the uid of the user holding each held card.
func (h *holdSet) cardHolders() map[int]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[int]int{}
	for key, cards := range h.cards {
		for _, c := range cards {
			out[c] = h.uids[key]
		}
	}
	return out
}

// holdSeq numbers the holds.
var holdSeq atomic.Int64

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
	key := fmt.Sprintf("hold-%d", holdSeq.Add(1))
	b.holds.order.Lock()
	defer b.holds.order.Unlock()
	b.holds.add(key, r.UID, cpus, cards)
	drop := func() { b.holds.drop(key) }
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
		b.holds.order.Lock()
		defer b.holds.order.Unlock()
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
