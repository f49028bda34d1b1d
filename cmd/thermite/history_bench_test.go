package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"thermite/internal/testrig"
)

// BenchmarkHistory times what must not get slower with the rig's history
// (a command of the controller's role, the isolation self-test, and the
// broker's start) on a fresh rig and again after HISTORY_TRIALS trials
// (default 200) have started, run a command and ended, and prints each
// after/fresh ratio (aim: 1x).
//
//	HISTORY_TRIALS=1000 go test ./cmd/thermite -run '^$' -bench History -benchtime 1x -timeout 60m
func BenchmarkHistory(b *testing.B) {
	trials := 200
	if v := os.Getenv("HISTORY_TRIALS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("HISTORY_TRIALS: %q is not a count", v)
		}
		trials = n
	}
	r := testrig.New(b, testrig.Options{Lanes: 2})
	project := filepath.Join(r.Dir, "project")
	os.MkdirAll(filepath.Join(project, "src"), 0o755)
	for i := 0; i < 100; i++ {
		os.WriteFile(filepath.Join(project, "src", fmt.Sprintf("f%03d", i)), []byte("x"), 0o644)
	}
	median := func(f func()) time.Duration {
		var d []time.Duration
		for i := 0; i < 5; i++ {
			t0 := time.Now()
			f()
			d = append(d, time.Since(t0))
		}
		return time.Duration(pct(d, 50) * float64(time.Millisecond))
	}
	ops := []struct {
		name string
		f    func()
	}{
		{"run-as thermite -- true", func() {
			if _, stderr, code := r.RunAs("thermite", nil, "true"); code != 0 {
				b.Fatalf("run-as: %s", stderr)
			}
		}},
		{"selftest isolation", func() {
			if _, stderr, code := r.Thermite("selftest", "isolation", "--force"); code != 0 {
				b.Fatalf("selftest: %s", stderr)
			}
		}},
		{"broker start to ready", func() {
			r.StopBroker()
			if err := r.Start(); err != nil {
				b.Fatal(err)
			}
		}},
	}
	fresh := make([]time.Duration, len(ops))
	for i, op := range ops {
		fresh[i] = median(op.f)
	}
	b.ResetTimer()
	for i := 0; i < trials; i++ {
		info := benchTrial(b, r, 1+i%2, project)
		if _, stderr, code := r.Thermite("trial", "exec", info.ID, "--", "sh", "-c", "echo $RANDOM > out"); code != 0 {
			b.Fatalf("trial exec: %s", stderr)
		}
		if _, stderr, code := r.Thermite("trial", "end", info.ID); code != 0 {
			b.Fatalf("trial end: %s", stderr)
		}
	}
	b.StopTimer()
	fmt.Printf("after %d trials against a fresh rig (median of 5):\n", trials)
	for i, op := range ops {
		after := median(op.f)
		fmt.Printf("  %-24s fresh %8.1f ms  after %8.1f ms  %5.2fx\n", op.name, float64(fresh[i].Microseconds())/1000, float64(after.Microseconds())/1000, float64(after)/float64(fresh[i]))
	}
}
