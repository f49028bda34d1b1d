// Package ledger is the controller's record of the rig: runs, trials and
// their token hashes, events, self-test results, the judge's builds and
// timed runs, and a table of hidden test-case results that nothing but
// PutHidden and Hidden can reach.
//
// It is one bbolt file under the controller's folder, mode 0600, owned by
// the controller's user. Every write is one bbolt transaction, fsynced
// before it returns, so a SIGKILL at any moment leaves either the whole
// transaction or none of it.
package ledger

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// openTimeout bounds the wait for bbolt's file lock: a second controller
// (or an export run while the controller holds the file) fails with a
// clear error instead of hanging. A variable so tests can shorten it.
var openTimeout = 3 * time.Second

// schemaVersion is written once into the meta bucket; a ledger written by a
// newer layout is refused rather than misread.
const schemaVersion = "1"

// Errors callers may test with errors.Is; the message always carries the
// path and what was asked.
var (
	ErrNotFound   = errors.New("not in the ledger")
	ErrLaneBusy   = errors.New("lane already has an open trial")
	ErrTrialEnded = errors.New("trial already ended")
	ErrInvalid    = errors.New("invalid record")
)

// table is a bucket the generic accessors may read and write. The hidden
// results' bucket is deliberately not a table (see hidden.go), so no
// generic accessor and no export can be handed it.
type table struct {
	name   string // the key in Export's object
	bucket []byte
}

var (
	tRuns      = table{"runs", []byte("runs")}
	tTrials    = table{"trials", []byte("trials")}
	tEvents    = table{"events", []byte("events")}
	tSelftests = table{"selftests", []byte("selftests")}
	tBuilds    = table{"builds", []byte("builds")}
	tTimedRuns = table{"timed_runs", []byte("timed_runs")}

	// Internal tables: never exported (derived or bookkeeping only).
	tOpenLanes = table{"", []byte("open_lanes")} // lane number -> open trial id
	// tKept indexes the trials that ended and whose folder is not yet
	// removed (id -> "1"): what retention and `status` look at, so
	// their cost follows what the rig keeps, not its whole history.
	tKept = table{"", []byte("kept_trials")}
	// tTrialEvents indexes the events by trial (trial id, then the
	// event's sequence number -> nothing), so that one trial's events are
	// read without a walk of every event the rig ever recorded.
	tTrialEvents = table{"", []byte("trial_events")}
	tMeta        = table{"", []byte("meta")}
)

// exportTables is Export's allow-list, in output order. A table is
// exported only if it is named here; there is no deny-list to forget.
var exportTables = []table{tRuns, tTrials, tEvents, tSelftests, tBuilds, tTimedRuns}

// allBuckets are created at Open.
var allBuckets = [][]byte{
	tRuns.bucket, tTrials.bucket, tEvents.bucket, tSelftests.bucket,
	tBuilds.bucket, tTimedRuns.bucket, tOpenLanes.bucket, tKept.bucket, tTrialEvents.bucket, tMeta.bucket,
	hiddenBucket,
}

// Ledger is an open ledger file. Its methods are safe for concurrent use.
type Ledger struct {
	db     *bolt.DB
	path   string
	events eventQueue
}

// Open opens or creates the ledger at path with mode 0600. It refuses an
// existing file that group or others can read or write, a symlink, or
// anything but a regular file, and gives up after a few seconds if another
// process holds the file open.
func Open(path string) (*Ledger, error) {
	opts := &bolt.Options{
		Timeout:      openTimeout,
		FreelistType: bolt.FreelistArrayType,
		OpenFile:     openPrivate,
	}
	db, err := bolt.Open(path, 0o600, opts)
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("ledger: %s: held open by another process (gave up after %s): %w", path, openTimeout, err)
		}
		var me *modeError
		if errors.As(err, &me) {
			return nil, err
		}
		return nil, fmt.Errorf("ledger: %s: open: %w", path, err)
	}
	l := &Ledger{db: db, path: path, events: eventQueue{byTrial: map[string][]*pendingEvent{}}}
	if err := l.init(); err != nil {
		db.Close()
		return nil, err
	}
	return l, nil
}

// modeError is openPrivate's refusal, already phrased for a person.
type modeError struct{ msg string }

func (e *modeError) Error() string { return e.msg }

// openPrivate is bbolt's OpenFile: it checks the descriptor it opened, not
// the path, so nothing can swap the file between the check and the use.
func openPrivate(name string, flag int, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(name, flag|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, perm)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, &modeError{fmt.Sprintf("ledger: %s: is a symlink; refusing to follow it", name)}
		}
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, &modeError{fmt.Sprintf("ledger: %s: not a regular file (%s)", name, fi.Mode().Type())}
	}
	if m := fi.Mode().Perm(); m&0o077 != 0 {
		f.Close()
		return nil, &modeError{fmt.Sprintf("ledger: %s: mode %04o lets group or others in; the ledger must be 0600 (chmod 600 %s)", name, m, name)}
	}
	return f, nil
}

func (l *Ledger) init() error {
	err := l.db.Update(func(tx *bolt.Tx) error {
		for _, b := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return fmt.Errorf("bucket %s: %w", b, err)
			}
		}
		meta := tx.Bucket(tMeta.bucket)
		switch v := meta.Get([]byte("schema")); {
		case v == nil:
			return meta.Put([]byte("schema"), []byte(schemaVersion))
		case string(v) != schemaVersion:
			return fmt.Errorf("schema version %q, this build reads %q", v, schemaVersion)
		}
		if err := indexKept(tx); err != nil {
			return err
		}
		return indexTrialEvents(tx)
	})
	if err != nil {
		return fmt.Errorf("ledger: %s: init: %w", l.path, err)
	}
	return nil
}

// Path is the ledger file's path.
func (l *Ledger) Path() string { return l.path }

// Close closes the file; later calls fail.
func (l *Ledger) Close() error {
	if err := l.db.Close(); err != nil {
		return fmt.Errorf("ledger: %s: close: %w", l.path, err)
	}
	return nil
}

// wrap gives every error the path and the operation a person needs.
func (l *Ledger) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("ledger: %s: %s: %w", l.path, op, err)
}

func (l *Ledger) update(op string, fn func(tx *bolt.Tx) error) error {
	return l.wrap(op, l.db.Update(fn))
}

func (l *Ledger) view(op string, fn func(tx *bolt.Tx) error) error {
	return l.wrap(op, l.db.View(fn))
}

// getJSON reads one record; found is false when the key is absent.
func getJSON(tx *bolt.Tx, t table, key string, v any) (bool, error) {
	data := tx.Bucket(t.bucket).Get([]byte(key))
	if data == nil {
		return false, nil
	}
	if err := json.Unmarshal(data, v); err != nil {
		return true, fmt.Errorf("%s %q: decode: %w", t.bucket, key, err)
	}
	return true, nil
}

func putJSON(tx *bolt.Tx, t table, key []byte, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("%s %q: encode: %w", t.bucket, key, err)
	}
	return tx.Bucket(t.bucket).Put(key, data)
}

// listJSON decodes every record of a table in key order.
func listJSON[T any](tx *bolt.Tx, t table) ([]T, error) {
	var out []T
	err := tx.Bucket(t.bucket).ForEach(func(k, v []byte) error {
		if v == nil { // a nested bucket; none are expected here
			return nil
		}
		var x T
		if err := json.Unmarshal(v, &x); err != nil {
			return fmt.Errorf("%s %q: decode: %w", t.bucket, k, err)
		}
		out = append(out, x)
		return nil
	})
	return out, err
}

// get and list are the typed one-table reads.
func get[T any](l *Ledger, t table, id string) (T, bool, error) {
	var x T
	var found bool
	err := l.view("read "+string(t.bucket)+" "+id, func(tx *bolt.Tx) error {
		var err error
		found, err = getJSON(tx, t, id, &x)
		return err
	})
	return x, found, err
}

func list[T any](l *Ledger, t table) ([]T, error) {
	var out []T
	err := l.view("list "+string(t.bucket), func(tx *bolt.Tx) error {
		var err error
		out, err = listJSON[T](tx, t)
		return err
	})
	return out, err
}

// utc keeps stored times in one zone so exports read the same everywhere;
// a zero time stays zero.
func utc(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC()
}

// now is the default time for records written without one.
func now() time.Time { return time.Now().UTC() }
