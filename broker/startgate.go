package broker

import (
	"sync"
	"time"

	"thermite/internal/rpc"
	"thermite/roles"
)

// The broker starts one command at a time: spawn.Start's child shares
// the broker's memory (CLONE_VFORK) until its execve, and the reaper must
// know it before it can be reaped (reaper.fork). That one start at a time
// is the one queue every role's commands pass through, so it is kept
// fair: the judge's starts (its builds, timed runs and the stops after
// them) go first, and the other roles' in turn by uid, so a lane storming
// execs waits behind its own starts, not the judge's nor another lane's.

// startKey is what the gate knows of a waiting start: its role's uid,
// whether it is the judge's work, and when it came.
type startKey struct {
	uid   int
	judge bool
	seq   uint64
}

// nextStart decides which waiting start goes next: the judge's that came
// first, else the first to come of the role whose uid follows last's in
// turn (wrapping round to the lowest), so that every role waiting gets
// one start before any gets a second. It returns the index in waiting
// (not empty).
func nextStart(waiting []startKey, last int) int {
	best := -1
	better := func(i int) bool {
		if best < 0 {
			return true
		}
		a, b := waiting[i], waiting[best]
		if a.judge != b.judge {
			return a.judge
		}
		if a.judge || a.uid == b.uid {
			return a.seq < b.seq
		}
		// The uid after last comes first: those above it in order, then
		// those at or below it.
		aNext, bNext := a.uid > last, b.uid > last
		if aNext != bNext {
			return aNext
		}
		return a.uid < b.uid
	}
	for i := range waiting {
		if better(i) {
			best = i
		}
	}
	return best
}

// judgeRole says whether a role's starts are the judge's: its builds and
// its timed runs.
func judgeRole(r roles.Role) bool {
	return r.Kind == roles.Builder || r.Kind == roles.Timing
}

// startGate lets one start go at a time, in nextStart's order, and counts
// how the order went.
type startGate struct {
	mu      sync.Mutex
	busy    bool
	seq     uint64
	last    int // the uid of the last start let go that was not the judge's
	waiting []*startWaiter
	stats   rpc.StartStats
}

// startWaiter is one start waiting at the gate.
type startWaiter struct {
	key startKey
	// ahead counts the starts of other roles let go while it waited.
	ahead int
	go_   chan struct{}
}

// acquire waits for r's start's turn. It returns how many starts of other
// roles went while it waited; the caller calls release once its child has
// exec'd (or failed to).
func (g *startGate) acquire(r roles.Role) (ahead int) {
	g.mu.Lock()
	g.seq++
	judge := judgeRole(r)
	g.stats.Starts++
	if judge {
		g.stats.JudgeStarts++
	}
	if !g.busy {
		g.busy = true
		g.mu.Unlock()
		return 0
	}
	w := &startWaiter{key: startKey{uid: r.UID, judge: judge, seq: g.seq}, go_: make(chan struct{})}
	g.waiting = append(g.waiting, w)
	g.stats.Waited++
	g.stats.MostWaiting = max(g.stats.MostWaiting, len(g.waiting))
	if judge {
		g.stats.JudgeWaited++
	}
	g.mu.Unlock()
	<-w.go_
	return w.ahead
}

// release lets the next start go, or opens the gate.
func (g *startGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.waiting) == 0 {
		g.busy = false
		return
	}
	keys := make([]startKey, len(g.waiting))
	for i, w := range g.waiting {
		keys[i] = w.key
	}
	i := nextStart(keys, g.last)
	w := g.waiting[i]
	g.waiting = append(g.waiting[:i], g.waiting[i+1:]...)
	for _, o := range g.waiting {
		if o.key.uid != w.key.uid {
			o.ahead++
		}
	}
	if !w.key.judge {
		g.last = w.key.uid
	}
	if w.key.judge && w.ahead > 0 {
		g.stats.JudgeBehind++
	}
	close(w.go_)
}

// snapshot is the gate's counts so far.
func (g *startGate) snapshot() rpc.StartStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.stats
	s.WaitingNow = len(g.waiting)
	return s
}

// startWait is how long a command waited before its start: since the
// broker took its Run (received), or since now where it took none.
func startWait(received time.Time) time.Duration {
	if received.IsZero() {
		return 0
	}
	return time.Since(received)
}
