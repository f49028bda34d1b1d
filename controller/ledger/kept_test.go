package ledger

import (
	"fmt"
	"testing"

	bolt "go.etcd.io/bbolt"
)

func ids(ts []Trial) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.ID)
	}
	return out
}

// Retention and status read the kept and the open trials from indexes:
// an ended trial is kept until its folder is removed, an open one is in
// neither the kept list nor, once ended, the open one.
func TestKeptAndOpenTrialsFollowEndAndRemoval(t *testing.T) {
	l, _ := openTemp(t)
	mustRun(t, l, "r")
	for i, id := range []string{"a", "b", "c"} {
		if err := l.StartTrial(trial(id, "r", i+1, "tok-"+id)); err != nil {
			t.Fatal(err)
		}
	}
	l.EndTrial("a", "done", at)
	l.EndTrial("b", "done", at)
	l.TrialRemoved("a", at)
	kept, err := l.KeptTrials()
	if err != nil || len(kept) != 1 || kept[0].ID != "b" {
		t.Fatalf("kept trials: %v %v, want [b]", ids(kept), err)
	}
	open, err := l.OpenTrials()
	if err != nil || len(open) != 1 || open[0].ID != "c" {
		t.Fatalf("open trials: %v %v, want [c]", ids(open), err)
	}
}

// A ledger written before the kept index existed gets it built once, at
// its next open, from the trials it holds.
func TestKeptIndexBuiltForAnOlderLedger(t *testing.T) {
	l, path := openTemp(t)
	mustRun(t, l, "r")
	for i, id := range []string{"a", "b", "c"} {
		l.StartTrial(trial(id, "r", i+1, "tok-"+id))
	}
	l.EndTrial("a", "done", at)
	l.EndTrial("b", "done", at)
	l.TrialRemoved("b", at)
	// As an older build left it: no index, no mark.
	l.db.Update(func(tx *bolt.Tx) error {
		tx.Bucket(tMeta.bucket).Delete([]byte("kept_index"))
		return tx.DeleteBucket(tKept.bucket)
	})
	l.Close()
	l2, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	kept, err := l2.KeptTrials()
	if err != nil || len(kept) != 1 || kept[0].ID != "a" {
		t.Fatalf("kept trials after the upgrade: %v %v, want [a]", ids(kept), err)
	}
}

// BenchmarkRetentionTick is what one retention tick reads from a ledger of
// 10,000 trials of which 100 are kept: the kept index against every trial
// (what the tick read before the index).
//
//	go test ./controller/ledger -run '^$' -bench RetentionTick
func BenchmarkRetentionTick(b *testing.B) {
	l, _ := openTemp(b)
	if err := l.PutRun(Run{ID: "r", Created: at}); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < 10000; i++ {
		id := fmt.Sprintf("t%05d", i)
		l.StartTrial(trial(id, "r", 1, "tok-"+id))
		l.EndTrial(id, "done", at)
		if i < 9900 {
			l.TrialRemoved(id, at)
		}
	}
	b.Run("kept-index", func(b *testing.B) {
		for b.Loop() {
			if ts, err := l.KeptTrials(); err != nil || len(ts) != 100 {
				b.Fatal(len(ts), err)
			}
		}
	})
	b.Run("every-trial", func(b *testing.B) {
		for b.Loop() {
			if ts, err := l.Trials(); err != nil || len(ts) != 10000 {
				b.Fatal(len(ts), err)
			}
		}
	})
}
