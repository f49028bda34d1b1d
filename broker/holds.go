package broker

import (
	"sort"

	"thermite/internal/cpuset"
)

// heldCards is the cards a timed run holds now.
func (b *Broker) heldCards() map[int]bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[int]bool{}
	for _, cs := range b.cardHolds {
		for _, c := range cs {
			out[c] = true
		}
	}
	return out
}

// heldCPUs is the judge CPUs a timed run holds now.
func (b *Broker) heldCPUs() cpuset.Set {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out cpuset.Set
	for _, s := range b.cpuHolds {
		out = append(out, s...)
	}
	sort.Ints(out)
	return out
}
