package broker

import (
	"os"
	"testing"
)

// An evicted rule set stays open while a command that took it has not yet
// handed it to its shim, and closes when the last holder lets go: a timer
// closed it a minute after eviction, whatever still waited to use it.
func TestEvictedRuleSetStaysOpenWhileHeld(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	b := &Broker{}
	bf := &builtFence{fd: r}
	b.gpu.mu.Lock()
	first, second := b.holdRuleSetLocked(bf), b.holdRuleSetLocked(bf)
	bf.evictLocked()
	b.gpu.mu.Unlock()
	open := func() bool { _, err := r.Stat(); return err == nil }
	if !open() {
		t.Fatal("evicted while two commands hold it: closed")
	}
	first()
	first() // a second release of the same hold changes nothing
	if !open() {
		t.Fatal("closed while a command still holds it")
	}
	second()
	if open() {
		t.Fatal("still open after the last holder let go of an evicted rule set")
	}
}

// A rule set still in the cache is never closed by its holders.
func TestCachedRuleSetOutlivesItsHolders(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	defer r.Close()
	b := &Broker{}
	bf := &builtFence{fd: r}
	b.gpu.mu.Lock()
	release := b.holdRuleSetLocked(bf)
	b.gpu.mu.Unlock()
	release()
	if _, err := r.Stat(); err != nil {
		t.Fatalf("a cached rule set was closed when its holder let go: %v", err)
	}
}
