package ledger

import (
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// hiddenBucket holds the results of hidden test cases: one nested bucket
// per timed run, case id -> result JSON. It is a plain []byte, not a table,
// so the generic accessors and Export cannot be handed it; PutHidden and
// Hidden are the only code that names it. No event, brief, export or API
// answer is built from it.
var hiddenBucket = []byte("hidden")

// PutHidden records one hidden test case's result for a timed run that is
// already in the ledger.
func (l *Ledger) PutHidden(runID, caseID string, result json.RawMessage) error {
	op := "put hidden result " + runID + "/" + caseID
	switch {
	case runID == "" || caseID == "":
		return l.wrap(op, fmt.Errorf("%w: hidden result needs a timed run and a case id", ErrInvalid))
	case !json.Valid(result):
		return l.wrap(op, fmt.Errorf("%w: hidden result is not JSON", ErrInvalid))
	}
	return l.update(op, func(tx *bolt.Tx) error {
		if tx.Bucket(tTimedRuns.bucket).Get([]byte(runID)) == nil {
			return fmt.Errorf("timed run %s: %w", runID, ErrNotFound)
		}
		run, err := tx.Bucket(hiddenBucket).CreateBucketIfNotExists([]byte(runID))
		if err != nil {
			return err
		}
		return run.Put([]byte(caseID), result)
	})
}

// Hidden returns a timed run's hidden results by case id (empty when it
// has none).
func (l *Ledger) Hidden(runID string) (map[string]json.RawMessage, error) {
	out := map[string]json.RawMessage{}
	err := l.view("read hidden results "+runID, func(tx *bolt.Tx) error {
		run := tx.Bucket(hiddenBucket).Bucket([]byte(runID))
		if run == nil {
			return nil
		}
		return run.ForEach(func(k, v []byte) error {
			// bbolt's slices live only as long as the transaction.
			out[string(k)] = append(json.RawMessage(nil), v...)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
