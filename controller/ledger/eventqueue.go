package ledger

import (
	"sync"

	bolt "go.etcd.io/bbolt"
)

// Events are written by group commit: every API call of every lane is an
// event, and one bbolt transaction (one fsync) for each would queue every
// lane's calls behind the busiest lane's. Events that arrive while a
// commit runs wait together for the next one, which takes them per trial
// in turn (nextBatch): the rig's own events (the judge's, the
// controller's: no trial) first, then one of each trial's, round-robin,
// up to maxEventBatch. A lane that floods the API fills only its own
// queue; another lane's event waits for at most a commit or two.

// maxEventBatch bounds the events of one commit.
const maxEventBatch = 256

// pendingEvent is an event waiting for its commit.
type pendingEvent struct {
	e    Event
	seq  uint64
	err  error
	done chan struct{}
}

// eventQueue holds the events waiting, one queue per trial ("" the rig's
// own), and whether a committer runs.
type eventQueue struct {
	mu      sync.Mutex
	byTrial map[string][]*pendingEvent
	order   []string // trials with events waiting, in their turn's order
	running bool
}

// nextBatch decides which waiting events the next commit takes, at most
// limit: every one of the rig's own (no trial) first, then one of each
// trial's in turn, round-robin, each trial's in the order they came: a
// trial served goes to the end of the order (across batches too), one
// whose events were all taken leaves it.
func (q *eventQueue) nextBatch(limit int) []*pendingEvent {
	var batch []*pendingEvent
	take := func(trial string) bool {
		evs := q.byTrial[trial]
		if len(evs) == 0 {
			return false
		}
		batch = append(batch, evs[0])
		if len(evs) == 1 {
			delete(q.byTrial, trial)
		} else {
			q.byTrial[trial] = evs[1:]
		}
		return true
	}
	for len(batch) < limit && take("") {
	}
	for len(batch) < limit && len(q.order) > 0 {
		trial := q.order[0]
		q.order = q.order[1:]
		if take(trial) && len(q.byTrial[trial]) > 0 {
			q.order = append(q.order, trial)
		}
	}
	return batch
}

// add queues p, and reports whether the caller must start a committer.
func (q *eventQueue) add(p *pendingEvent) (start bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	trial := p.e.Trial
	if _, waiting := q.byTrial[trial]; !waiting && trial != "" {
		q.order = append(q.order, trial)
	}
	q.byTrial[trial] = append(q.byTrial[trial], p)
	if q.running {
		return false
	}
	q.running = true
	return true
}

// commitEvents commits batches until no event waits.
func (l *Ledger) commitEvents() {
	q := &l.events
	for {
		q.mu.Lock()
		batch := q.nextBatch(maxEventBatch)
		if len(batch) == 0 {
			q.running = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		err := l.update("add events", func(tx *bolt.Tx) error {
			for _, p := range batch {
				p.seq, p.err = 0, nil
				if err := validEvent(p.e); err != nil {
					p.err = err // its own refusal: the others go on
					continue
				}
				seq, err := addEventTx(tx, p.e)
				if err != nil {
					return err
				}
				p.seq = seq
			}
			return nil
		})
		for _, p := range batch {
			switch {
			case err != nil:
				p.seq, p.err = 0, err
			case p.err != nil:
				p.err = l.wrap("add event "+p.e.Kind, p.err)
			}
			close(p.done)
		}
	}
}
