package rig

import (
	"regexp"
	"testing"
	"time"

	"thermite/internal/testrig"
)

// The disk checks' real interval is reported, not assumed: status names
// the setting and the slowest interval the open trials saw.
func TestStatusShowsRealDiskCheckInterval(t *testing.T) {
	r := testrig.New(t, testrig.Options{Extra: "[trial]\ndisk_check = \"300ms\"\n"})
	out, _, _ := r.Thermite("status")
	if !regexp.MustCompile(`disk checks: every 300ms; no open trial`).MatchString(out) {
		t.Fatalf("status without trials:\n%s", out)
	}
	project := makeProject(t, r)
	startTrial(t, r, 1, project)
	startTrial(t, r, 2, project)
	re := regexp.MustCompile(`disk checks: every 300ms; 2 open trials, slowest real interval ([0-9.]+m?s)`)
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, _, _ = r.Thermite("status")
		if m := re.FindStringSubmatch(out); m != nil && m[1] != "0s" {
			d, err := time.ParseDuration(m[1])
			if err != nil || d <= 0 {
				t.Fatalf("interval %q: %v", m[1], err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never showed the real interval of two open trials:\n%s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
