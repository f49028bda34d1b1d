package ledger

import (
	"encoding/json"
	"fmt"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// kinds are the events' kinds in order, with the trial of each.
func kinds(evs []Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Trial+":"+e.Kind)
	}
	return out
}

// One trial's events come from its index, in order, none of another
// trial's (one whose id begins with the first's either), paged by
// sequence number; a ledger written before the index is indexed when
// it is opened.
func TestTrialEventsByTrialInOrderAndIndexedAtOpen(t *testing.T) {
	l, path := openTemp(t)
	for i, tr := range []string{"t1", "t1x", "t1", "", "t2", "t1"} {
		if _, err := l.AddEvent(Event{Kind: fmt.Sprintf("k%d", i), Trial: tr, Data: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(l *Ledger) {
		t.Helper()
		evs, err := l.TrialEvents("t1", 0, 0)
		if got := fmt.Sprint(kinds(evs)); err != nil || got != "[t1:k0 t1:k2 t1:k5]" {
			t.Fatalf("TrialEvents(t1) = %s, %v", got, err)
		}
		after, _ := l.TrialEvents("t1", evs[0].Seq, 1)
		if got := fmt.Sprint(kinds(after)); got != "[t1:k2]" {
			t.Errorf("TrialEvents(t1, after %d, 1) = %s", evs[0].Seq, got)
		}
		if tail, _ := l.TrialEvents("t1", evs[2].Seq, 0); len(tail) != 0 {
			t.Errorf("TrialEvents after t1's last = %v", kinds(tail))
		}
		if none, _ := l.TrialEvents("t9", 0, 0); len(none) != 0 {
			t.Errorf("TrialEvents of a trial with none = %v", kinds(none))
		}
	}
	check(l)
	l.Close()

	// A ledger of before the index: its index and its mark gone.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket(tTrialEvents.bucket); err != nil {
			return err
		}
		return tx.Bucket(tMeta.bucket).Delete([]byte("trial_events_index"))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	l2, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	check(l2)
}
