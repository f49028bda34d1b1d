package fairshare

import (
	"fmt"
	"testing"
)

// TestHoldersAtTheirCapLeaveTheNextItsFloor: holders that take all they
// may, one unit at a time, leave every other holder its floor; what one
// holder is refused is of its own cap once it reaches it, and of the
// others' holdings before; every release gives back what was taken.
func TestHoldersAtTheirCapLeaveTheNextItsFloor(t *testing.T) {
	for _, c := range []struct {
		name                     string
		all, perHolder, unit     int64
		holders, greedy          int
		wantFloor, wantPool      int64
		wantGreedyHeld, wantLast int64
	}{
		// 16 lanes, each may hold a quarter: floors of a sixteenth each.
		{"15 lanes at their cap, the 16th", 1600, 400, 1, 16, 15, 100, 0, 100, 100},
		// Floors under the largest draw: half the budget is floors.
		{"large draws: half in floors, half a pool", 1600, 400, 400, 16, 15, 50, 800, 400, 50},
		// One holder alone: the whole budget is its floor.
		{"one holder", 100, 100, 1, 1, 0, 100, 0, 0, 100},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := New(c.all, c.perHolder, c.unit, c.holders)
			if f.Floor() != c.wantFloor || f.Pool() != c.wantPool {
				t.Fatalf("floor %d pool %d, want %d and %d", f.Floor(), f.Pool(), c.wantFloor, c.wantPool)
			}
			for h := range c.greedy {
				who := fmt.Sprint("lane-", h)
				for {
					ok, own := f.Admit(who, 1)
					if ok {
						continue
					}
					if own != (f.Held(who) == c.perHolder) {
						t.Fatalf("%s refused at %d: own cap %v", who, f.Held(who), own)
					}
					break
				}
			}
			if c.greedy > 0 && f.Held("lane-0") != c.wantGreedyHeld {
				t.Errorf("the first greedy holder holds %d, want %d", f.Held("lane-0"), c.wantGreedyHeld)
			}
			for i := range c.wantLast {
				if ok, _ := f.Admit("last", 1); !ok {
					t.Fatalf("the last holder's unit %d of its floor %d refused behind %d greedy holders (%d of %d held)", i+1, c.wantLast, c.greedy, f.Sum(), f.Max())
				}
			}
			if f.Sum() > f.Max() {
				t.Fatalf("%d held, over the budget's %d", f.Sum(), f.Max())
			}
			f.Release("last", c.wantLast)
			for h := range c.greedy {
				who := fmt.Sprint("lane-", h)
				f.Release(who, f.Held(who))
			}
			if f.Sum() != 0 || f.Borrowed() != 0 || f.Holders() != 0 {
				t.Fatalf("all released: %d held, %d borrowed, %d holders", f.Sum(), f.Borrowed(), f.Holders())
			}
		})
	}
}
