package landlock

import (
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// DefaultMaxCached is how many rule sets a Cache keeps before it lets them
// all go: every timed run has its own out/, so places long gone pile up.
const DefaultMaxCached = 256

// Cache keeps the role rule sets the broker has built, one per spec and
// per inode of each writable place, and hands each command a hold on one.
// A rule set is closed only when it has left the cache (stale, or the
// cache was full) AND no command holds it: a command may hand its
// descriptor number to its spawn.Start child at any time until it lets go. The zero
// Cache is ready to use.
type Cache struct {
	// Max is how many rule sets it keeps; 0 means DefaultMaxCached.
	Max int

	mu    sync.Mutex
	built map[string]*cached
}

// cached is one built rule set and the commands that hold it.
type cached struct {
	fd      *os.File
	stamps  []Stamp
	refs    int
	evicted bool
}

// Get returns the rule set for spec, building it the first time and again
// whenever a folder it was built from has changed (a node appeared in
// /dev), and a release the caller calls once its command no longer needs
// the descriptor (its child has exec'd, or will not start); release may be
// called more than once.
//
// abi is the kernel's Landlock ABI as the broker's kernel policy accepted
// it: below what the role policy needs, the operator accepted every
// protection this kernel lacks, so the rule set keeps what the kernel has;
// with 0 (no Landlock) there is none, a nil file. The GPU fence alone
// (FenceOnly) is never trimmed: Build refuses a kernel without its rights.
func (c *Cache) Get(spec RoleSpec, abi int) (*os.File, func(), error) {
	key := cacheKey(spec)
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.built[key]; ok {
		if Stale(e.stamps) == "" {
			return e.fd, c.holdLocked(e), nil
		}
		delete(c.built, key)
		e.evictLocked()
	}
	p, walked, err := RolePolicy(spec)
	if err != nil {
		return nil, nil, err
	}
	stamps := Stamps(walked)
	minABI := PolicyABI
	if spec.FenceOnly {
		minABI = FenceABI
	}
	if abi < minABI && !spec.FenceOnly {
		if abi == 0 {
			return nil, func() {}, nil
		}
		p.Fit(abi)
		minABI = abi
	}
	fd, err := p.Build(minABI)
	if err != nil {
		return nil, nil, err
	}
	max := c.Max
	if max <= 0 {
		max = DefaultMaxCached
	}
	if c.built == nil {
		c.built = map[string]*cached{}
	}
	if len(c.built) >= max {
		// Let them all go; each closes once no command holds it.
		for k, old := range c.built {
			delete(c.built, k)
			old.evictLocked()
		}
	}
	e := &cached{fd: fd, stamps: stamps}
	c.built[key] = e
	return fd, c.holdLocked(e), nil
}

// cacheKey names a spec's rule set. Landlock rules hold the inodes of
// their paths, so a writable place made anew at the same path (a timed
// run's fresh out/) gets a rule set of its own.
func cacheKey(spec RoleSpec) string {
	key := fmt.Sprintf("%v", spec)
	for _, w := range spec.Writable {
		var st unix.Stat_t
		if unix.Lstat(w, &st) == nil {
			key += fmt.Sprintf(":%d/%d", st.Dev, st.Ino)
		}
	}
	return key
}

// holdLocked counts one more holder of e and returns its release, which
// is safe to call more than once.
func (c *Cache) holdLocked(e *cached) func() {
	e.refs++
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			e.refs--
			if e.evicted && e.refs == 0 {
				e.fd.Close()
			}
		})
	}
}

// evictLocked takes a rule set out of the cache; it closes once unheld.
func (e *cached) evictLocked() {
	e.evicted = true
	if e.refs == 0 {
		e.fd.Close()
	}
}
