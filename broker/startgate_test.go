package broker

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"thermite/roles"
)

// TestNextStart: the order the broker's starts take, decided alone.
func TestNextStart(t *testing.T) {
	lane := func(uid int, seq uint64) startKey { return startKey{uid: uid, seq: seq} }
	judge := func(uid int, seq uint64) startKey { return startKey{uid: uid, judge: true, seq: seq} }
	for _, c := range []struct {
		name    string
		waiting []startKey
		last    int
		want    int
	}{
		{"a lane's exec storm queued first: the judge's timed run goes before it",
			[]startKey{lane(101, 1), lane(101, 2), lane(101, 3), judge(2, 4)}, 101, 3},
		{"lanes of every uid queued: the judge's build still first",
			[]startKey{lane(102, 1), lane(103, 2), judge(1, 3), lane(101, 4)}, 100, 2},
		{"two of the judge's starts: the first to come",
			[]startKey{judge(2, 5), lane(101, 1), judge(1, 3)}, 101, 2},
		{"a storming lane that went last waits for the next lane in turn",
			[]startKey{lane(101, 1), lane(101, 2), lane(102, 3)}, 101, 2},
		{"the turn wraps round to the lowest uid",
			[]startKey{lane(103, 1), lane(101, 2), lane(102, 3)}, 103, 1},
		{"after the last uid, the next above it, not the first to come",
			[]startKey{lane(101, 1), lane(104, 2), lane(103, 3)}, 102, 2},
		{"one role's own starts in the order they came",
			[]startKey{lane(101, 3), lane(101, 1), lane(101, 2)}, 101, 1},
	} {
		if got := nextStart(c.waiting, c.last); got != c.want {
			t.Errorf("%s: %d (%+v), want %d (%+v)", c.name, got, c.waiting[got], c.want, c.waiting[c.want])
		}
	}
}

// TestLaneStartStormLeavesTheJudgeFirstAndOtherLanesInTurn: while one
// start is under way, lane-1 queues 20 starts, lane-2 queues 2 and the
// judge's timing user 1: the judge's goes next with no other role's
// ahead of it, lane-2's two go before lane-1's third, and the gate's
// counts say so.
func TestLaneStartStormLeavesTheJudgeFirstAndOtherLanesInTurn(t *testing.T) {
	var g startGate
	lane1 := roles.Role{Name: "lane-1", UID: 101, Kind: roles.Lane}
	lane2 := roles.Role{Name: "lane-2", UID: 102, Kind: roles.Lane}
	run := roles.Role{Name: "run", UID: 2, Kind: roles.Timing}
	g.acquire(lane1) // under way
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	queue := func(r roles.Role, n int) {
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ahead := g.acquire(r)
				mu.Lock()
				order = append(order, fmt.Sprintf("%s:%d", r.Name, ahead))
				mu.Unlock()
				g.release()
			}()
		}
	}
	queued := func(n int) {
		for {
			g.mu.Lock()
			w := len(g.waiting)
			g.mu.Unlock()
			if w == n {
				return
			}
			runtime.Gosched()
		}
	}
	queue(lane1, 20)
	queued(20)
	queue(lane2, 2)
	queued(22)
	queue(run, 1)
	queued(23)
	g.release()
	wg.Wait()
	if order[0] != "run:0" {
		t.Fatalf("after the start under way: %v, want the judge's next with none ahead", order[:3])
	}
	var lane2At []int
	for i, o := range order {
		if strings.HasPrefix(o, "lane-2:") {
			lane2At = append(lane2At, i)
		}
	}
	if len(lane2At) != 2 || lane2At[1] > 4 {
		t.Fatalf("lane-2's two starts went at %v of %v: behind lane-1's storm, not in turn", lane2At, order)
	}
	s := g.snapshot()
	if s.Starts != 24 || s.Waited != 23 || s.JudgeStarts != 1 || s.JudgeWaited != 1 || s.JudgeBehind != 0 || s.MostWaiting != 23 || s.WaitingNow != 0 {
		t.Fatalf("counts %+v", s)
	}
}
