package seccomp

import "testing"

// TestCacheBuildsOncePerOptionSet: the same option set gives the same
// program (assembled once); another set gives another, with its own rules.
func TestCacheBuildsOncePerOptionSet(t *testing.T) {
	var c Cache
	a1, err := c.Get(Options{Network: NetworkNone})
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := c.Get(Options{Network: NetworkNone})
	if a1 != a2 {
		t.Error("the same options were assembled twice")
	}
	b, _ := c.Get(Options{Network: NetworkOpen})
	if b == a1 {
		t.Error("network open shares network none's program")
	}
	want, _ := Program(Options{Network: NetworkNone})
	if a1.Len() != len(want) || int(a1.Prog().Len) != len(want) {
		t.Errorf("built program has %d instructions, Program %d", a1.Len(), len(want))
	}
	// Each option is its own set: the judge's users' filter is not the
	// lanes', though their network is the same (a key that left a field
	// out once handed the builder's filter to the supervisor).
	seen := map[*Built]Options{a1: {Network: NetworkNone}}
	for _, o := range []Options{
		{Network: NetworkNone, NoUnixSockets: true}, {Network: NetworkNone, NoWatches: true},
		{Network: NetworkNone, AllowPerf: true}, {Network: NetworkNone, FileHelper: true},
	} {
		got, err := c.Get(o)
		if err != nil {
			t.Fatal(err)
		}
		if prev, ok := seen[got]; ok {
			t.Errorf("%+v shares the program of %+v", o, prev)
		}
		seen[got] = o
	}
	if _, err := c.Get(Options{Network: "bogus"}); err == nil {
		t.Error("an invalid network policy was built")
	}
}
