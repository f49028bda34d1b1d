package rig

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// The fourth red team's attacks on issue 26's and 27's surfaces: each test
// is one attack, as the role would make it, that the rig once let
// through, and what the role still may do beside it.

// TestLaneSparseFileInItsResearchCannotStallAnotherLanesSearch: lane-1
// leaves in its research area a file of 15 TiB that takes a few blocks:
// text longer than the binary sniff, then a hole (truncate -s). Its trial
// ends and the area is published to the run. Lane-2's research search,
// made in lane-2's file helper, would read the hole's 15 TiB of zeros,
// which held that helper for hours (and with 16 such searches, every
// file call of lane-2's). The search takes a file with a hole as binary,
// as GNU grep does: it answers, passing the file over, and finds lane-1's
// plain file beside it.
func TestLaneSparseFileInItsResearchCannotStallAnotherLanesSearch(t *testing.T) {
	r := newRig(t)
	p := makeProject(t, r)
	t1, _ := startTrial(t, r, 1, p, "--run", "r1")
	if out, stderr, code := r.Thermite("trial", "exec", t1.ID, "--", "sh", "-c", `set -e
cd "$1"
{ echo "a needle in a sparse file"; i=0; while [ $i -lt 2000 ]; do echo "filler line"; i=$((i+1)); done; } > sparse.txt
truncate -s 15T sparse.txt
echo "a plain needle" > plain.txt
stat -c '%s %b' sparse.txt`, "sh", t1.LaneArea); code != 0 || !strings.HasPrefix(out, "16492674416640 ") {
		t.Fatalf("lane-1 leaves a sparse file in its research area: exit %d %q %s", code, out, stderr)
	}
	if _, stderr, code := r.Thermite("trial", "end", t1.ID); code != 0 {
		t.Fatalf("trial end: %s", stderr)
	}
	t2, _ := startTrial(t, r, 2, p, "--run", "r1")
	client := apiClient(r.Cfg.APISocket(), 90*time.Second) // a liveness bound
	code, body, err := post(client, tokenOf(t, t2), "/v1/research/search", `{"pattern": "needle"}`)
	if err != nil {
		t.Fatalf("lane-2's research search beside lane-1's sparse file: %v (held by the file's hole)", err)
	}
	var g struct {
		Matches []struct {
			Path string `json:"path"`
		} `json:"matches"`
		BinarySkipped int `json:"binary_skipped"`
	}
	if code != 200 || json.Unmarshal(body, &g) != nil {
		t.Fatalf("lane-2's research search: %d %s", code, body)
	}
	var paths []string
	for _, m := range g.Matches {
		paths = append(paths, m.Path)
	}
	if len(paths) != 1 || paths[0] != "lanes/lane-1/plain.txt" || g.BinarySkipped != 1 {
		t.Errorf("lane-2's research search: matches %v, %d binary skipped; want lanes/lane-1/plain.txt alone, the sparse file skipped", paths, g.BinarySkipped)
	}
}
