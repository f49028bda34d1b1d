package ledger

import (
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Build is one of the judge's builds of a project with a kit.
type Build struct {
	ID        string    `json:"id"`
	Kit       string    `json:"kit"`
	Project   string    `json:"project"`
	Created   time.Time `json:"created"`
	Status    string    `json:"status"`
	ExitCode  int       `json:"exit_code"`
	Log       string    `json:"log"`
	StorePath string    `json:"store_path"`
	// Manifest maps each stored file's path, relative to StorePath, to
	// its hex SHA-256; the judge checks it again before every timed run.
	Manifest map[string]string `json:"manifest"`
}

// TimedRun is one timed run of a build on a card.
type TimedRun struct {
	ID           string    `json:"id"`
	Build        string    `json:"build"`
	Kit          string    `json:"kit"`
	Card         int       `json:"card"`
	Repeats      []Repeat  `json:"repeats"`
	MedianWallNS int64     `json:"median_wall_ns"`
	SpreadWallNS int64     `json:"spread_wall_ns"`
	PublicScore  *float64  `json:"public_score,omitempty"`
	CheckOutput  string    `json:"check_output"`
	Created      time.Time `json:"created"`
	Status       string    `json:"status"`
	// Role and CPUs say who timed it, and where.
	Role string `json:"role,omitempty"`
	CPUs string `json:"cpus,omitempty"`
	// CVPercent is the coefficient of variation of the wall times.
	CVPercent float64 `json:"cv_percent"`
	Error     string  `json:"error,omitempty"`
}

// Repeat is one repetition of a timed run.
type Repeat struct {
	WallNS   int64 `json:"wall_ns"`
	UserNS   int64 `json:"user_ns"`
	SysNS    int64 `json:"sys_ns"`
	MaxRSSKB int64 `json:"max_rss_kb"`
	ExitCode int   `json:"exit_code"`
	// StartWaitNS is how long the repeat waited at the broker before it
	// started, StartsAhead how many starts of other roles went first
	// meanwhile: the judge's starts go first, so 0 while that holds.
	StartWaitNS int64 `json:"start_wait_ns,omitempty"`
	StartsAhead int   `json:"starts_ahead,omitempty"`
}

// PutBuild records or replaces a build (a build's status changes as it
// runs). Manifest paths must stay inside the store path and every value
// must be a hex SHA-256, "dir" (an empty folder) or "symlink:<target>".
func (l *Ledger) PutBuild(b Build) error {
	op := "put build " + b.ID
	if b.ID == "" {
		return l.wrap("put build", fmt.Errorf("%w: build without an id", ErrInvalid))
	}
	for p, h := range b.Manifest {
		if !filepath.IsLocal(p) {
			return l.wrap(op, fmt.Errorf("%w: manifest path %q is not inside the store path", ErrInvalid, p))
		}
		if !validHash(h) && h != "dir" && !strings.HasPrefix(h, "symlink:") {
			return l.wrap(op, fmt.Errorf("%w: manifest %q: %q is not a hex SHA-256, dir or symlink:<target>", ErrInvalid, p, h))
		}
	}
	if b.Created.IsZero() {
		b.Created = now()
	}
	b.Created = utc(b.Created)
	return l.update(op, func(tx *bolt.Tx) error {
		return putJSON(tx, tBuilds, []byte(b.ID), b)
	})
}

// Build reads one build.
func (l *Ledger) Build(id string) (Build, bool, error) { return get[Build](l, tBuilds, id) }

// Builds lists every build in id order.
func (l *Ledger) Builds() ([]Build, error) { return list[Build](l, tBuilds) }

// PutTimedRun records or replaces a timed run; its build must be in the
// ledger already.
func (l *Ledger) PutTimedRun(r TimedRun) error {
	op := "put timed run " + r.ID
	switch {
	case r.ID == "":
		return l.wrap("put timed run", fmt.Errorf("%w: timed run without an id", ErrInvalid))
	case r.Build == "":
		return l.wrap(op, fmt.Errorf("%w: timed run without a build", ErrInvalid))
	case r.PublicScore != nil && (math.IsNaN(*r.PublicScore) || math.IsInf(*r.PublicScore, 0)):
		return l.wrap(op, fmt.Errorf("%w: public score %v", ErrInvalid, *r.PublicScore))
	}
	if r.Created.IsZero() {
		r.Created = now()
	}
	r.Created = utc(r.Created)
	return l.update(op, func(tx *bolt.Tx) error {
		if tx.Bucket(tBuilds.bucket).Get([]byte(r.Build)) == nil {
			return fmt.Errorf("build %s: %w", r.Build, ErrNotFound)
		}
		return putJSON(tx, tTimedRuns, []byte(r.ID), r)
	})
}

// TimedRun reads one timed run.
func (l *Ledger) TimedRun(id string) (TimedRun, bool, error) {
	return get[TimedRun](l, tTimedRuns, id)
}

// TimedRuns lists every timed run in id order.
func (l *Ledger) TimedRuns() ([]TimedRun, error) { return list[TimedRun](l, tTimedRuns) }
