package ledger

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Event is one entry of the rig's event log. Data is the event's own JSON.
type Event struct {
	Seq   uint64          `json:"seq"`
	At    time.Time       `json:"at"`
	Kind  string          `json:"kind"`
	Trial string          `json:"trial,omitempty"`
	Run   string          `json:"run,omitempty"`
	Data  json.RawMessage `json:"data,omitempty"`
}

// Selftest is one stored self-test result, as the broker reported it.
type Selftest struct {
	Seq    uint64          `json:"seq"`
	At     time.Time       `json:"at"`
	Result json.RawMessage `json:"result"`
}

// seqKey is big-endian so bbolt's byte order is sequence order.
func seqKey(n uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], n)
	return k[:]
}

// AddEvent appends e and returns its sequence number, which increases with
// every event ever added (bbolt's bucket sequence, committed with the event).
// It returns once the event is committed, with the others waiting then
// (eventQueue).
func (l *Ledger) AddEvent(e Event) (uint64, error) {
	p := &pendingEvent{e: e, done: make(chan struct{})}
	if l.events.add(p) {
		go l.commitEvents()
	}
	<-p.done
	return p.seq, p.err
}

// validEvent refuses an event the ledger must not hold.
func validEvent(e Event) error {
	if e.Kind == "" {
		return fmt.Errorf("%w: event without a kind", ErrInvalid)
	}
	if len(e.Data) > 0 && !json.Valid(e.Data) {
		return fmt.Errorf("%w: event %s: data is not JSON", ErrInvalid, e.Kind)
	}
	return nil
}

func addEventTx(tx *bolt.Tx, e Event) (uint64, error) {
	if err := validEvent(e); err != nil {
		return 0, err
	}
	b := tx.Bucket(tEvents.bucket)
	seq, err := b.NextSequence()
	if err != nil {
		return 0, err
	}
	e.Seq = seq
	if e.At.IsZero() {
		e.At = now()
	}
	e.At = utc(e.At)
	if e.Trial != "" {
		if err := tx.Bucket(tTrialEvents.bucket).Put(trialEventKey(e.Trial, seq), nil); err != nil {
			return 0, err
		}
	}
	return seq, putJSON(tx, tEvents, seqKey(seq), e)
}

// trialEventKey is the index's key of a trial's event: the trial's id,
// a NUL (no id holds one), then the event's sequence number.
func trialEventKey(trial string, seq uint64) []byte {
	return append(append([]byte(trial), 0), seqKey(seq)...)
}

// indexTrialEvents indexes, once, the events recorded before the index
// was kept.
func indexTrialEvents(tx *bolt.Tx) error {
	meta := tx.Bucket(tMeta.bucket)
	if meta.Get([]byte("trial_events_index")) != nil {
		return nil
	}
	idx := tx.Bucket(tTrialEvents.bucket)
	err := tx.Bucket(tEvents.bucket).ForEach(func(k, v []byte) error {
		var e struct {
			Trial string `json:"trial"`
		}
		if v == nil || json.Unmarshal(v, &e) != nil || e.Trial == "" {
			return nil
		}
		return idx.Put(trialEventKey(e.Trial, binary.BigEndian.Uint64(k)), nil)
	})
	if err != nil {
		return err
	}
	return meta.Put([]byte("trial_events_index"), []byte("1"))
}

// TrialEvents returns the events of one trial with Seq > afterSeq in
// order, at most limit of them (limit <= 0: all), from the trial's
// index: its cost follows that trial's events, not the ledger's.
func (l *Ledger) TrialEvents(trial string, afterSeq uint64, limit int) ([]Event, error) {
	var out []Event
	if afterSeq == math.MaxUint64 || trial == "" {
		return nil, nil
	}
	prefix := append([]byte(trial), 0)
	err := l.view("list events of trial "+trial, func(tx *bolt.Tx) error {
		events := tx.Bucket(tEvents.bucket)
		c := tx.Bucket(tTrialEvents.bucket).Cursor()
		for k, _ := c.Seek(trialEventKey(trial, afterSeq+1)); k != nil && bytes.HasPrefix(k, prefix) && len(k) == len(prefix)+8; k, _ = c.Next() {
			if limit > 0 && len(out) >= limit {
				break
			}
			seq := k[len(prefix):]
			v := events.Get(seq)
			if v == nil {
				continue
			}
			var e Event
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("event %d: decode: %w", binary.BigEndian.Uint64(seq), err)
			}
			out = append(out, e)
		}
		return nil
	})
	return out, err
}

// Events returns events with Seq > afterSeq in order, at most limit of
// them (limit <= 0: all).
func (l *Ledger) Events(afterSeq uint64, limit int) ([]Event, error) {
	var out []Event
	if afterSeq == math.MaxUint64 { // nothing can follow, and +1 would wrap to the start
		return nil, nil
	}
	err := l.view("list events", func(tx *bolt.Tx) error {
		c := tx.Bucket(tEvents.bucket).Cursor()
		for k, v := c.Seek(seqKey(afterSeq + 1)); k != nil; k, v = c.Next() {
			if limit > 0 && len(out) >= limit {
				break
			}
			var e Event
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("event %d: decode: %w", binary.BigEndian.Uint64(k), err)
			}
			out = append(out, e)
		}
		return nil
	})
	return out, err
}

// AddSelftest stores one self-test result (the verdict's JSON).
func (l *Ledger) AddSelftest(res json.RawMessage, at time.Time) error {
	if !json.Valid(res) {
		return l.wrap("add self-test", fmt.Errorf("%w: result is not JSON", ErrInvalid))
	}
	if at.IsZero() {
		at = now()
	}
	return l.update("add self-test", func(tx *bolt.Tx) error {
		b := tx.Bucket(tSelftests.bucket)
		seq, err := b.NextSequence()
		if err != nil {
			return err
		}
		return putJSON(tx, tSelftests, seqKey(seq), Selftest{Seq: seq, At: utc(at), Result: res})
	})
}

// Selftests lists every stored self-test result, oldest first.
func (l *Ledger) Selftests() ([]Selftest, error) { return list[Selftest](l, tSelftests) }
