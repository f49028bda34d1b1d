package ledger

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"
)

// TestNextBatchTakesEachTrialInTurn: a trial with a thousand events
// waiting takes one place a turn, like a trial with one; the rig's own
// events (no trial) go first; each trial's keep their order; and the
// flooding trial's next turn comes after the others'.
func TestNextBatchTakesEachTrialInTurn(t *testing.T) {
	q := &eventQueue{byTrial: map[string][]*pendingEvent{}}
	add := func(trial string, n int) {
		for i := range n {
			q.add(&pendingEvent{e: Event{Kind: fmt.Sprintf("%s-%d", trial, i), Trial: trial}})
		}
	}
	add("flood", 1000)
	add("quiet", 2)
	add("", 2) // the judge's
	add("other", 1)
	kinds := func(b []*pendingEvent) (out []string) {
		for _, p := range b {
			out = append(out, p.e.Kind)
		}
		return out
	}
	got := fmt.Sprint(kinds(q.nextBatch(6)))
	if want := "[-0 -1 flood-0 quiet-0 other-0 flood-1]"; got != want {
		t.Fatalf("first batch %s, want %s", got, want)
	}
	// quiet's second event comes before flood's third.
	got = fmt.Sprint(kinds(q.nextBatch(2)))
	if want := "[quiet-1 flood-2]"; got != want {
		t.Fatalf("second batch %s, want %s", got, want)
	}
	add("late", 1)
	if got := kinds(q.nextBatch(3)); fmt.Sprint(got) != "[flood-3 late-0 flood-4]" {
		t.Fatalf("a trial that comes late waits for one turn of the flood's, not its queue: %v", got)
	}
	rest := q.nextBatch(10000)
	if len(rest) != 995 || rest[0].e.Kind != "flood-5" || rest[994].e.Kind != "flood-999" || len(q.order) != 0 || len(q.byTrial) != 0 {
		t.Fatalf("the rest: %d events, order %v, %d queues", len(rest), q.order, len(q.byTrial))
	}
}

// TestAddEventGroupCommit: events added at once from many goroutines are
// each committed once, with sequence numbers unique and, within a trial,
// in the order its events were added; a refused event refuses only
// itself.
func TestAddEventGroupCommit(t *testing.T) {
	l, err := Open(filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const trials, each = 8, 40
	var wg sync.WaitGroup
	seqs := make([][]uint64, trials)
	for tr := range trials {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				seq, err := l.AddEvent(Event{Kind: "step", Trial: fmt.Sprintf("t%d", tr), Data: []byte(fmt.Sprintf(`{"i":%d}`, i))})
				if err != nil {
					t.Error(err)
					return
				}
				seqs[tr] = append(seqs[tr], seq)
			}
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := l.AddEvent(Event{Kind: "bad", Trial: fmt.Sprintf("t%d", tr), Data: []byte("{")}); err == nil {
				t.Error("an event whose data is not JSON was added")
			}
		}()
	}
	wg.Wait()
	seen := map[uint64]bool{}
	for tr, s := range seqs {
		for i, seq := range s {
			if seen[seq] {
				t.Fatalf("sequence %d given twice", seq)
			}
			seen[seq] = true
			if i > 0 && seq <= s[i-1] {
				t.Fatalf("trial %d's events out of order: %v", tr, s)
			}
		}
		evs, err := l.TrialEvents(fmt.Sprintf("t%d", tr), 0, 0)
		if err != nil || len(evs) != each {
			t.Fatalf("trial %d holds %d events (%v), want %d", tr, len(evs), err, each)
		}
	}
}
