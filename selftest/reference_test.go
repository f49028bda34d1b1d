package selftest

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"thermite/roles"
)

// TestReferenceIsCurrent fails when docs/rig-checks.md and the tables
// differ: a probe added, changed or removed without the reference.
func TestReferenceIsCurrent(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	doc := filepath.Join(filepath.Dir(file), "..", "docs", "rig-checks.md")
	have, err := os.ReadFile(doc)
	if err != nil {
		t.Fatalf("%v: write it with `go run ./cmd/thermite selftest reference > docs/rig-checks.md`", err)
	}
	if want := Reference(); string(have) != want {
		hl, wl := strings.Split(string(have), "\n"), strings.Split(want, "\n")
		for i := 0; i < len(hl) || i < len(wl); i++ {
			var h, w string
			if i < len(hl) {
				h = hl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if h != w {
				t.Fatalf("docs/rig-checks.md differs from the tables at line %d:\n have %q\n want %q\nrewrite it with `go run ./cmd/thermite selftest reference > docs/rig-checks.md`", i+1, h, w)
			}
		}
	}
}

// Every row of every table is in the reference.
func TestReferenceListsEveryRow(t *testing.T) {
	ref := Reference()
	for _, r := range Policy {
		if !strings.Contains(ref, cell(r.Attempt)) {
			t.Errorf("probe %q is not in the reference", r.Attempt)
		}
	}
	for _, r := range RigChecks {
		if !strings.Contains(ref, cell(r.Attempt)) {
			t.Errorf("rig row %q is not in the reference", r.Attempt)
		}
	}
	for _, h := range HostChecks {
		if !strings.Contains(ref, cell(h.Name)) {
			t.Errorf("host check %q is not in the reference", h.Name)
		}
	}
}

// The bounding-set row fails for a role that keeps capabilities the
// broker's own set has not (or any, where the broker's is empty).
func TestBoundingEmptyRowCanFail(t *testing.T) {
	st := func(bnd string) Outcome { return Outcome{Detail: "CapBnd:\t" + bnd + "\n"} }
	for _, tc := range []struct {
		broker, role string
		ok           bool
	}{
		{"0000000000000000", "0000000000000000", true},
		{"0000000000000000", "00000000000000eb", false},
		{"00000000000000eb", "00000000000000eb", true},
		{"00000000000000eb", "000001ffffffffff", false},
	} {
		got := boundingEmpty(&Context{BrokerCapBnd: tc.broker}, roles.Role{}, st(tc.role))
		if (got == "") != tc.ok {
			t.Errorf("broker %s, role %s: %q, want ok=%v", tc.broker, tc.role, got, tc.ok)
		}
	}
}
