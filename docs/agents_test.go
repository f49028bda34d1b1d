package docs

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The Node.js that scripts/agents.sh demands (node_min) is the oldest that
// every package of agents/package-lock.json declares it runs on, but for
// the packages whose declaration covers only an installer: a newer lock
// that needs more fails here, and a node_min above what the lock needs
// (which would refuse a Node.js that works) too.

// nodeOnlyToInstall are the lock's packages whose engines.node the
// programs do not need at run time, with the range each declares and why.
var nodeOnlyToInstall = map[string]string{
	// Its program is a native binary (bin/claude.exe); Node.js runs only
	// install.cjs, which copies it into place (measured on 20.20.2).
	"node_modules/@anthropic-ai/claude-code": ">=22.0.0",
}

func TestAgentsScriptNodeMinimumIsTheLocks(t *testing.T) {
	script, err := os.ReadFile(filepath.Join(moduleRoot, "scripts", "agents.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^node_min=(\d+)\.(\d+)\.(\d+)$`).FindSubmatch(script)
	if m == nil {
		t.Fatal("scripts/agents.sh has no node_min=X.Y.Z line")
	}
	var min version
	for i := range min {
		min[i], _ = strconv.Atoi(string(m[i+1]))
	}
	raw, err := os.ReadFile(filepath.Join(moduleRoot, "agents", "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	var lock struct {
		Packages map[string]struct {
			Engines json.RawMessage `json:"engines"`
		} `json:"packages"`
	}
	if err := json.Unmarshal(raw, &lock); err != nil {
		t.Fatalf("agents/package-lock.json: %v", err)
	}
	// The version just below node_min: some package must refuse it.
	below := min
	switch {
	case below[2] > 0:
		below[2]--
	case below[1] > 0:
		below[1], below[2] = below[1]-1, 999
	default:
		below[0], below[1], below[2] = below[0]-1, 999, 999
	}
	tight := false
	for name, p := range lock.Packages {
		var engines struct {
			Node string `json:"node"`
		}
		// Some old packages give engines as a list; none names node then.
		if json.Unmarshal(p.Engines, &engines) != nil || engines.Node == "" {
			continue
		}
		ok, err := satisfies(min, engines.Node)
		if err != nil {
			t.Fatalf("%s: engines.node %q: %v", name, engines.Node, err)
		}
		if want, only := nodeOnlyToInstall[name]; only {
			if engines.Node != want || ok {
				t.Errorf("%s: engines.node %q (node_min %v meets it: %v); nodeOnlyToInstall says %q, which node_min does not meet", name, engines.Node, min, ok, want)
			}
			continue
		}
		if !ok {
			t.Errorf("%s needs Node.js %s, which scripts/agents.sh's node_min %v does not meet", name, engines.Node, min)
		}
		if okBelow, _ := satisfies(below, engines.Node); !okBelow {
			tight = true
		}
	}
	if !tight {
		t.Errorf("every package of the lock runs on Node.js %v: scripts/agents.sh's node_min %v refuses one that works", below, min)
	}
	for name := range nodeOnlyToInstall {
		if _, ok := lock.Packages[name]; !ok {
			t.Errorf("nodeOnlyToInstall names %s, which the lock no longer has", name)
		}
	}
}

// version is a Node.js version: major, minor, patch.
type version [3]int

func (v version) String() string { return fmt.Sprintf("%d.%d.%d", v[0], v[1], v[2]) }

func (v version) less(o version) bool {
	for i := range v {
		if v[i] != o[i] {
			return v[i] < o[i]
		}
	}
	return false
}

// satisfies says whether v meets an npm engines range as the lock's
// packages write them: alternatives joined by ||, each comparators joined
// by spaces (>=X, ^X, X, X.*, *), a partial version standing for its
// whole span.
func satisfies(v version, rng string) (bool, error) {
	for _, alt := range strings.Split(rng, "||") {
		alt = strings.ReplaceAll(strings.TrimSpace(alt), ">= ", ">=")
		all := true
		for _, c := range strings.Fields(alt) {
			ok, err := meets(v, c)
			if err != nil {
				return false, err
			}
			all = all && ok
		}
		if all {
			return true, nil
		}
	}
	return false, nil
}

// meets is one comparator.
func meets(v version, c string) (bool, error) {
	if c == "*" {
		return true, nil
	}
	op := ""
	for _, p := range []string{">=", "^"} {
		if strings.HasPrefix(c, p) {
			op, c = p, strings.TrimPrefix(c, p)
		}
	}
	var lo version
	parts := strings.Split(strings.TrimSuffix(c, ".*"), ".")
	if len(parts) > 3 {
		return false, fmt.Errorf("%q: not a version", c)
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil {
			return false, fmt.Errorf("%q: not a version", c)
		}
		lo[i] = n
	}
	if v.less(lo) {
		return false, nil
	}
	switch {
	case op == ">=":
		return true, nil
	case op == "^" && lo[0] == 0:
		return false, fmt.Errorf("%q: a caret range below 1.0.0 is not read here", c)
	case op == "^":
		return v[0] == lo[0], nil
	}
	// A partial version: its span (18 is 18.x.x, 4.2 is 4.2.x).
	for i := range parts {
		if v[i] != lo[i] {
			return false, nil
		}
	}
	return true, nil
}

func TestNodeRangesAsTheLockWritesThem(t *testing.T) {
	v := version{20, 18, 1}
	for rng, want := range map[string]bool{
		"*": true, ">=20.18.1": true, ">=20.18.2": false, ">= 18": true, "20": true, "18": false,
		"18 || 20 || >=22": true, "6.* || 8.* || >= 10.*": true, "^20.17.0 || >=22.9.0": true,
		"^20.19.0 || >=22.9.0": false, "^12.20 || >= 14.13": true, ">=16 || 14 >=14.17": true, ">=22.0.0": false,
	} {
		if got, err := satisfies(v, rng); err != nil || got != want {
			t.Errorf("%v in %q: %v %v, want %v", v, rng, got, err, want)
		}
	}
	if _, err := satisfies(v, "^0.4.0"); err == nil {
		t.Error("^0.4.0 read without an error")
	}
}
