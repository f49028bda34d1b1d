package seccomp

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// Built is a filter assembled once, ready for seccomp(SECCOMP_SET_MODE_FILTER):
// the spawn path hands Prog to its child, which loads it with one system
// call and no allocation.
type Built struct {
	Options Options
	filter  []unix.SockFilter
	prog    unix.SockFprog
}

// Build assembles the filter for o.
func Build(o Options) (*Built, error) {
	filter, err := Program(o)
	if err != nil {
		return nil, err
	}
	if len(filter) == 0 || len(filter) > 0xFFFF {
		return nil, fmt.Errorf("seccomp: a filter of %d instructions cannot be loaded", len(filter))
	}
	b := &Built{Options: o, filter: filter}
	b.prog = unix.SockFprog{Len: uint16(len(filter)), Filter: &b.filter[0]}
	return b, nil
}

// Prog is the program as the kernel reads it. It points into b, which the
// caller keeps alive until the filter is loaded.
func (b *Built) Prog() *unix.SockFprog { return &b.prog }

// Len is the number of instructions.
func (b *Built) Len() int { return len(b.filter) }

// Cache holds one Built per option set, so a filter is assembled once per
// set for the life of the broker rather than once per command.
type Cache struct {
	mu    sync.Mutex
	built map[string]*Built
}

// key names an option set; Options holds a slice, so it is not comparable.
// Every field is in it (%+v), so an option added later cannot make two
// sets share one filter.
func (o Options) key() string {
	return fmt.Sprintf("%+v", o)
}

// Get returns the filter for o, assembling it on first use.
func (c *Cache) Get(o Options) (*Built, error) {
	k := o.key()
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, ok := c.built[k]; ok {
		return b, nil
	}
	b, err := Build(o)
	if err != nil {
		return nil, err
	}
	if c.built == nil {
		c.built = map[string]*Built{}
	}
	c.built[k] = b
	return b, nil
}
