package ledger

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"sort"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Run is a research run.
type Run struct {
	ID      string    `json:"id"`
	Title   string    `json:"title"`
	Project string    `json:"project,omitempty"`
	Created time.Time `json:"created"`
}

// Trial states.
const (
	TrialOpen  = "open"
	TrialEnded = "ended"
)

// Trial is one lane's turn in a run. Its token is never stored: only the
// hex SHA-256 of it, and only an open trial's hash answers TrialByToken.
type Trial struct {
	ID          string    `json:"id"`
	Run         string    `json:"run"`
	Lane        int       `json:"lane"`
	Workspace   string    `json:"workspace"`
	AgentDir    string    `json:"agent_dir"`
	ResearchDir string    `json:"research_dir"`
	TokenHash   string    `json:"token_hash"`
	State       string    `json:"state"`
	Started     time.Time `json:"started"`
	Ended       time.Time `json:"ended"`
	EndReason   string    `json:"end_reason,omitempty"`
	// The trial's decoy AWS key pair: fake, different for every trial, put
	// in its lane's and agent's environments so that a leak shows.
	DecoyKeyID  string `json:"decoy_key_id,omitempty"`
	DecoySecret string `json:"decoy_secret,omitempty"`
	// DiskBytes is what its folders held when it was last measured.
	DiskBytes int64 `json:"disk_bytes,omitempty"`
	// Removed is when an ended trial's folder (workspace and agent folder)
	// was removed; zero while it is kept.
	Removed time.Time `json:"removed,omitempty"`
}

// HashToken is the hex SHA-256 of a trial token, the only form of it the
// ledger keeps. Tokens are random and long, so a plain hash is enough.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// validHash is a lowercase hex SHA-256; anything else is refused so that a
// token handed over by mistake is never written in clear.
func validHash(h string) bool {
	if len(h) != 2*sha256.Size {
		return false
	}
	for _, c := range h {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func laneKey(lane int) []byte { return []byte(strconv.Itoa(lane)) }

// PutRun records or replaces a run.
func (l *Ledger) PutRun(r Run) error {
	if r.ID == "" {
		return l.wrap("put run", fmt.Errorf("%w: run without an id", ErrInvalid))
	}
	if r.Created.IsZero() {
		r.Created = now()
	}
	r.Created = utc(r.Created)
	return l.update("put run "+r.ID, func(tx *bolt.Tx) error {
		return putJSON(tx, tRuns, []byte(r.ID), r)
	})
}

// Run reads one run.
func (l *Ledger) Run(id string) (Run, bool, error) { return get[Run](l, tRuns, id) }

// Runs lists every run in id order.
func (l *Ledger) Runs() ([]Run, error) { return list[Run](l, tRuns) }

// StartTrial records t as a new open trial. In one transaction it checks
// that the run exists, that the trial id is new and that the lane has no
// open trial, so two starts on a lane can never both succeed.
func (l *Ledger) StartTrial(t Trial) error {
	op := "start trial " + t.ID
	switch {
	case t.ID == "":
		return l.wrap("start trial", fmt.Errorf("%w: trial without an id", ErrInvalid))
	case t.Run == "":
		return l.wrap(op, fmt.Errorf("%w: trial without a run", ErrInvalid))
	case t.Lane < 1:
		return l.wrap(op, fmt.Errorf("%w: lane %d (lanes count from 1)", ErrInvalid, t.Lane))
	case !validHash(t.TokenHash):
		return l.wrap(op, fmt.Errorf("%w: token hash is not a hex SHA-256 (pass HashToken(token), never the token)", ErrInvalid))
	}
	t.State = TrialOpen
	t.Ended, t.EndReason = time.Time{}, ""
	if t.Started.IsZero() {
		t.Started = now()
	}
	t.Started = utc(t.Started)
	return l.update(op, func(tx *bolt.Tx) error {
		if tx.Bucket(tRuns.bucket).Get([]byte(t.Run)) == nil {
			return fmt.Errorf("run %s: %w", t.Run, ErrNotFound)
		}
		if tx.Bucket(tTrials.bucket).Get([]byte(t.ID)) != nil {
			return fmt.Errorf("%w: trial id %s already used", ErrInvalid, t.ID)
		}
		lanes := tx.Bucket(tOpenLanes.bucket)
		if open := lanes.Get(laneKey(t.Lane)); open != nil {
			return fmt.Errorf("lane %d: %w: %s", t.Lane, ErrLaneBusy, open)
		}
		if err := putJSON(tx, tTrials, []byte(t.ID), t); err != nil {
			return err
		}
		return lanes.Put(laneKey(t.Lane), []byte(t.ID))
	})
}

// Trial reads one trial.
func (l *Ledger) Trial(id string) (Trial, bool, error) { return get[Trial](l, tTrials, id) }

// Trials lists every trial in id order.
func (l *Ledger) Trials() ([]Trial, error) { return list[Trial](l, tTrials) }

// OpenTrialOnLane is the lane's open trial, if it has one.
func (l *Ledger) OpenTrialOnLane(lane int) (Trial, bool, error) {
	var t Trial
	var found bool
	err := l.view("open trial on lane "+strconv.Itoa(lane), func(tx *bolt.Tx) error {
		id := tx.Bucket(tOpenLanes.bucket).Get(laneKey(lane))
		if id == nil {
			return nil
		}
		var err error
		found, err = getJSON(tx, tTrials, string(id), &t)
		if err == nil && !found {
			err = fmt.Errorf("lane %d names trial %s, which is missing", lane, id)
		}
		return err
	})
	return t, found, err
}

// TrialByToken finds the open trial whose token hash matches token. Only
// open trials are looked at (at most one per lane), each compared in
// constant time; an ended trial's token finds nothing.
func (l *Ledger) TrialByToken(token string) (Trial, bool, error) {
	var match Trial
	var found bool
	if token == "" {
		return match, false, nil
	}
	want := sha256.Sum256([]byte(token))
	err := l.view("trial by token", func(tx *bolt.Tx) error {
		return tx.Bucket(tOpenLanes.bucket).ForEach(func(lane, id []byte) error {
			var t Trial
			ok, err := getJSON(tx, tTrials, string(id), &t)
			if err != nil || !ok {
				return err
			}
			have, err := hex.DecodeString(t.TokenHash)
			if err != nil {
				return fmt.Errorf("trial %s: token hash: %w", t.ID, err)
			}
			if subtle.ConstantTimeCompare(have, want[:]) == 1 && t.State == TrialOpen && !found {
				match, found = t, true
			}
			return nil
		})
	})
	if err != nil {
		return Trial{}, false, err
	}
	return match, found, nil
}

// EndTrial marks the trial ended with a reason and, in the same
// transaction, frees its lane and so revokes its token.
func (l *Ledger) EndTrial(id, reason string, at time.Time) error {
	op := "end trial " + id
	if reason == "" {
		return l.wrap(op, fmt.Errorf("%w: no reason given", ErrInvalid))
	}
	if at.IsZero() {
		at = now()
	}
	return l.changeTrial(op, id, func(tx *bolt.Tx, t *Trial) error {
		if t.State != TrialOpen {
			return fmt.Errorf("%w at %s (%s)", ErrTrialEnded, t.Ended.Format(time.RFC3339), t.EndReason)
		}
		t.State, t.Ended, t.EndReason = TrialEnded, utc(at), reason
		if err := tx.Bucket(tKept.bucket).Put([]byte(id), []byte("1")); err != nil {
			return err
		}
		lanes := tx.Bucket(tOpenLanes.bucket)
		if string(lanes.Get(laneKey(t.Lane))) == id {
			return lanes.Delete(laneKey(t.Lane))
		}
		return nil
	})
}

// SetTrialDisk records what a trial's folders held when last measured.
func (l *Ledger) SetTrialDisk(id string, bytes int64) error {
	return l.changeTrial("measure trial "+id, id, func(_ *bolt.Tx, t *Trial) error {
		t.DiskBytes = bytes
		return nil
	})
}

// TrialRemoved records that an ended trial's folder is gone.
func (l *Ledger) TrialRemoved(id string, at time.Time) error {
	return l.changeTrial("remove trial "+id, id, func(tx *bolt.Tx, t *Trial) error {
		if t.State == TrialOpen {
			return fmt.Errorf("%w: trial %s is open", ErrInvalid, id)
		}
		t.Removed = utc(at)
		return tx.Bucket(tKept.bucket).Delete([]byte(id))
	})
}

// KeptTrials lists the ended trials whose folders are not yet removed, in
// id order, from their index: its cost is what the rig keeps.
func (l *Ledger) KeptTrials() ([]Trial, error) {
	var out []Trial
	err := l.view("list kept trials", func(tx *bolt.Tx) error {
		return tx.Bucket(tKept.bucket).ForEach(func(k, _ []byte) error {
			var t Trial
			ok, err := getJSON(tx, tTrials, string(k), &t)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("kept trial %s: %w", k, ErrNotFound)
			}
			out = append(out, t)
			return nil
		})
	})
	return out, err
}

// OpenTrials lists the open trials (at most one per lane), from their
// index.
func (l *Ledger) OpenTrials() ([]Trial, error) {
	var out []Trial
	err := l.view("list open trials", func(tx *bolt.Tx) error {
		return tx.Bucket(tOpenLanes.bucket).ForEach(func(_, id []byte) error {
			var t Trial
			ok, err := getJSON(tx, tTrials, string(id), &t)
			if err == nil && ok {
				out = append(out, t)
			}
			return err
		})
	})
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, err
}

// indexKept builds the kept trials' index once, for a ledger written
// before it existed: every ended trial not yet removed.
func indexKept(tx *bolt.Tx) error {
	meta := tx.Bucket(tMeta.bucket)
	if meta.Get([]byte("kept_index")) != nil {
		return nil
	}
	ts, err := listJSON[Trial](tx, tTrials)
	if err != nil {
		return err
	}
	kept := tx.Bucket(tKept.bucket)
	for _, t := range ts {
		if t.State != TrialOpen && t.Removed.IsZero() {
			if err := kept.Put([]byte(t.ID), []byte("1")); err != nil {
				return err
			}
		}
	}
	return meta.Put([]byte("kept_index"), []byte("1"))
}

// changeTrial reads a trial, lets f change it (and what else its
// transaction must), and writes it back, all in one transaction.
func (l *Ledger) changeTrial(op, id string, f func(tx *bolt.Tx, t *Trial) error) error {
	return l.update(op, func(tx *bolt.Tx) error {
		var t Trial
		ok, err := getJSON(tx, tTrials, id, &t)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("trial %s: %w", id, ErrNotFound)
		}
		if err := f(tx, &t); err != nil {
			return err
		}
		return putJSON(tx, tTrials, []byte(id), t)
	})
}
