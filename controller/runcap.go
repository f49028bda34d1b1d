package controller

import (
	"fmt"
	"net/http"
	"sync"
)

// laneRuns counts the commands each lane runs through the API's exec at
// once: a lane past api.max_runs_per_lane is refused (429), so that its
// exec storm holds at most that many of the broker's Runs, and queues no
// more than that at the broker's starts, where each lane takes its turn
// and the judge goes first.
type laneRuns struct {
	mu  sync.Mutex
	max int
	n   map[int]int
}

// admitRun decides whether lane may start one more command: it returns
// the release, or nil and the one line that refuses it.
func (l *laneRuns) admitRun(lane int) (release func(), msg string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == nil {
		l.n = map[int]int{}
	}
	if l.n[lane] >= l.max {
		return nil, fmt.Sprintf("lane %d already runs %d commands through the API at once, its api.max_runs_per_lane of %d: wait for one to end", lane, l.n[lane], l.max)
	}
	l.n[lane]++
	return sync.OnceFunc(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.n[lane]--; l.n[lane] == 0 {
			delete(l.n, lane)
		}
	}), ""
}

// execCapped is the API's exec within the lane's cap of commands at once.
func (c *Controller) execCapped(w http.ResponseWriter, r *http.Request, rt *trialRT, req ExecRequest) {
	release, msg := c.runs.admitRun(rt.t.Lane)
	if release == nil {
		writeProblem(w, http.StatusTooManyRequests, CodeTooManyRequests, msg)
		return
	}
	defer release()
	c.execInTrial(w, r, rt, req)
}
