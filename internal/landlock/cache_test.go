package landlock

import (
	"os"
	"path/filepath"
	"testing"

	"thermite/internal/netpolicy"
)

// open says whether f's descriptor is still open.
func open(f *os.File) bool { _, err := f.Stat(); return err == nil }

// requirePolicyABI skips where the kernel cannot build a role's full rule set.
func requirePolicyABI(t *testing.T) int {
	t.Helper()
	if err := CheckABI(PolicyABI); err != nil {
		t.Skipf("needs Landlock ABI %d to build a role's rule set: %v", PolicyABI, err)
	}
	return ABI()
}

// An evicted rule set stays open while a command that took it has not yet
// handed it to its child, and closes when the last holder lets go: a timer
// closed it a minute after eviction, whatever still waited to use it.
func TestEvictedRuleSetStaysOpenWhileHeld(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	c := &Cache{}
	e := &cached{fd: r}
	c.mu.Lock()
	first, second := c.holdLocked(e), c.holdLocked(e)
	e.evictLocked()
	c.mu.Unlock()
	if !open(r) {
		t.Fatal("evicted while two commands hold it: closed")
	}
	first()
	first() // a second release of the same hold changes nothing
	if !open(r) {
		t.Fatal("closed while a command still holds it")
	}
	second()
	if open(r) {
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
	c := &Cache{}
	e := &cached{fd: r}
	c.mu.Lock()
	release := c.holdLocked(e)
	c.mu.Unlock()
	release()
	if !open(r) {
		t.Fatal("a cached rule set was closed when its holder let go")
	}
}

// A command that holds a rule set while a node appears in the device
// folder keeps a working descriptor: the next command gets a rule set built
// anew (the new node must be denied), and the old one closes only when its
// holder lets go.
func TestStaleRuleSetHeldByACommandIsNotClosed(t *testing.T) {
	abi := requirePolicyABI(t)
	dev := t.TempDir()
	spec := RoleSpec{DevRoot: dev, Network: netpolicy.API, Writable: []string{t.TempDir()}}
	var c Cache
	old, releaseOld, err := c.Get(spec, abi)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dev, "nvidia9"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	fresh, releaseFresh, err := c.Get(spec, abi)
	if err != nil {
		t.Fatal(err)
	}
	defer releaseFresh()
	if fresh == old {
		t.Fatal("a rule set built before a node appeared in the device folder was handed out again")
	}
	if !open(old) {
		t.Fatal("the stale rule set was closed while a command held it")
	}
	releaseOld()
	if open(old) {
		t.Fatal("the stale rule set stayed open after its last holder let go")
	}
	if !open(fresh) {
		t.Fatal("the fresh rule set was closed")
	}
}

// Unchanged folders and places get the very same rule set; a writable
// place removed and made again at the same path (a timed run's fresh out/)
// gets a new one: the old rules hold the old inode, and would leave the
// new folder unwritable or, worse, keep granting a folder moved elsewhere.
func TestRecreatedWritablePlaceGetsANewRuleSet(t *testing.T) {
	abi := requirePolicyABI(t)
	out := filepath.Join(t.TempDir(), "out")
	if err := os.Mkdir(out, 0o700); err != nil {
		t.Fatal(err)
	}
	// /dev as the device root: a temporary one would sit in /tmp, which
	// other tests change, making the rule set stale between two calls.
	spec := RoleSpec{DevRoot: "/dev", Network: netpolicy.None, Writable: []string{out}}
	var c Cache
	first, release, err := c.Get(spec, abi)
	if err != nil {
		t.Fatal(err)
	}
	release()
	changed := Stale(c.built[cacheKey(spec)].stamps)
	again, release, err := c.Get(spec, abi)
	if err != nil {
		t.Fatal(err)
	}
	release()
	if again != first && changed == "" {
		t.Fatal("the same spec with the same places built a second rule set")
	}
	if err := os.Remove(out); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(out, 0o700); err != nil {
		t.Fatal(err)
	}
	fresh, release, err := c.Get(spec, abi)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if fresh == first || fresh == again {
		t.Fatalf("%s made anew got the rule set of the folder it replaced", out)
	}
}

// A full cache lets every rule set go, but each closes only once no
// command holds it.
func TestFullCacheClosesOnlyUnheldRuleSets(t *testing.T) {
	abi := requirePolicyABI(t)
	c := Cache{Max: 2}
	get := func(n netpolicy.Network) (*os.File, func()) {
		f, release, err := c.Get(RoleSpec{DevRoot: "/dev", Network: n}, abi)
		if err != nil {
			t.Fatal(err)
		}
		return f, release
	}
	held, releaseHeld := get(netpolicy.None)
	unheld, release := get(netpolicy.Open)
	release()
	third, releaseThird := get(netpolicy.API)
	defer releaseThird()
	if open(unheld) {
		t.Error("an evicted rule set no command holds is still open")
	}
	if !open(held) {
		t.Fatal("an evicted rule set a command holds was closed")
	}
	releaseHeld()
	if open(held) {
		t.Error("an evicted rule set is still open after its holder let go")
	}
	if !open(third) {
		t.Error("the rule set built last was closed")
	}
}

// Without Landlock (an ABI the operator accepted as 0) there is no rule set
// to hand out, and nothing to release.
func TestNoRuleSetWithoutLandlock(t *testing.T) {
	var c Cache
	f, release, err := c.Get(RoleSpec{DevRoot: "/dev", Network: netpolicy.None}, 0)
	if err != nil || f != nil {
		t.Fatalf("got %v, %v; want no rule set and no error", f, err)
	}
	release()
}

// A spec whose network policy is no policy builds nothing.
func TestRuleSetRefusesAnUnknownNetwork(t *testing.T) {
	var c Cache
	_, _, err := c.Get(RoleSpec{DevRoot: "/dev", Network: "wide"}, ABI())
	if err == nil || err.Error() != `landlock: network policy: "wide" is not one of none, api, egress, open` {
		t.Fatalf("got %v", err)
	}
	if len(c.built) != 0 {
		t.Fatal("a refused spec left a rule set in the cache")
	}
}
