package rig

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"thermite/controller"
	"thermite/internal/testrig"
)

// floodRig is a rig of lanes lanes, each with an open trial, for the
// flood: every lane's trial, in lane order.
func floodRig(tb testing.TB, lanes int) (*testrig.Rig, []controller.TrialInfo) {
	return floodRigWith(tb, lanes, testrig.Options{Lanes: lanes})
}

// floodRigWith is floodRig on a rig of options o.
func floodRigWith(tb testing.TB, lanes int, o testrig.Options) (*testrig.Rig, []controller.TrialInfo) {
	r := testrig.New(tb, o)
	p := filepath.Join(r.Dir, "project")
	os.MkdirAll(p, 0o755)
	os.WriteFile(filepath.Join(p, "README"), []byte("hello project\n"), 0o644)
	var trials []controller.TrialInfo
	for lane := 1; lane <= lanes; lane++ {
		out, stderr, code := r.Thermite("trial", "start", "--lane", strconv.Itoa(lane), "--project", p, "--json")
		if code != 0 {
			tb.Fatalf("trial start lane %d: %s", lane, stderr)
		}
		var info controller.TrialInfo
		testrig.JSON(tb, out, &info)
		tb.Logf("lane %d: trial %s", lane, info.ID)
		trials = append(trials, info)
	}
	return r, trials
}

// ordinaryCalls runs n of a lane's ordinary calls, as its agent on the
// agent's own socket (a lane's exec ends by stopping what is left of the
// lane's processes: the caller must not be one), and returns the
// helper's line.
func ordinaryCalls(tb testing.TB, r *testrig.Rig, t controller.TrialInfo, n int, within time.Duration) string {
	role := "agent-" + strconv.Itoa(t.Lane)
	v := startAs(tb, r, role, "ordinary", "ATTACK_SOCKET="+t.APISocket, "ATTACK_TOKEN="+tokenOf(tb, t), "ATTACK_N="+strconv.Itoa(n), "ATTACK_MS="+strconv.Itoa(int(within.Milliseconds())))
	l, ok := v.next("ordinary ", within+time.Minute)
	if !ok {
		v.cmd.Wait()
		tb.Fatalf("%s's ordinary calls ended before their report: %v", role, v.cmd.ProcessState)
	}
	v.stop()
	return l
}

// startFloods starts every lane's flood but the last's, each as the
// lane's agent on its own socket, and waits until all are flooding. Each stops when
// its stdin closes (the test's end) or after limit.
func startFloods(tb testing.TB, r *testrig.Rig, trials []controller.TrialInfo, limit, pause time.Duration) []*roleProc {
	var floods []*roleProc
	for _, t := range trials[:len(trials)-1] {
		floods = append(floods, startAs(tb, r, "agent-"+strconv.Itoa(t.Lane), "flood", "ATTACK_SOCKET="+t.APISocket, "ATTACK_TOKEN="+tokenOf(tb, t), "ATTACK_MS="+strconv.Itoa(int(limit.Milliseconds())), "ATTACK_PAUSE_MS="+strconv.Itoa(int(pause.Milliseconds()))))
	}
	for _, f := range floods {
		f.expect("flooding", 2*time.Minute)
	}
	return floods
}

// stopFloods stops the floods and logs what each did.
func stopFloods(tb testing.TB, floods []*roleProc) {
	for _, f := range floods {
		f.stdin.Close()
	}
	for i, f := range floods {
		if l, ok := f.next("flood ", time.Minute); ok {
			tb.Logf("lane %d: %s", i+1, l)
		}
		f.stop()
	}
}

// BenchmarkFlood is lane 16's ordinary calls (its trial's details, a
// recorded step, an exec of /bin/true, a 4 KiB file write, in turn) on a
// rig of 16 lanes, idle and then while the other 15 flood every path at
// once (connect-and-close loops, 40 idle connections, an 8 MiB body
// withheld their last byte, two execs whose output is never read, exec
// storms, dd with fsync, file writes, recorded steps). It prints lane 16's
// p99 idle and flooded, their ratio (the bound is 2x) and its errors (the
// bound is 0). FLOOD_N sets the calls measured (default 100);
// FLOOD_PAUSE_MS the pause after each request of each flooding loop
// (default 10: on a machine of two cores, 15 lanes with none only
// measure the CPU, not the queues).
//
//	go test ./e2e/rig -run '^$' -bench Flood -benchtime 1x
func BenchmarkFlood(b *testing.B) {
	n := envOr("FLOOD_N", 100)
	pause := time.Duration(envOr("FLOOD_PAUSE_MS", 10)) * time.Millisecond
	r, trials := floodRig(b, 16)
	victim := trials[len(trials)-1]
	ordinaryCalls(b, r, victim, 40, time.Minute) // warm the controller and the paths
	b.ResetTimer()
	idle := ordinaryCalls(b, r, victim, n, 2*time.Minute)
	floods := startFloods(b, r, trials, 5*time.Minute, pause)
	hit := ordinaryCalls(b, r, victim, n, 3*time.Minute)
	b.StopTimer()
	stopFloods(b, floods)
	idle99, hit99 := field(b, idle, "p99"), field(b, hit, "p99")
	errs := field(b, idle, "errors") + field(b, hit, "errors")
	ratio := float64(hit99) / float64(max(idle99, 1))
	b.ReportMetric(float64(field(b, idle, "p50")), "idle-p50-µs")
	b.ReportMetric(float64(idle99), "idle-p99-µs")
	b.ReportMetric(float64(field(b, hit, "p50")), "flooded-p50-µs")
	b.ReportMetric(float64(hit99), "flooded-p99-µs")
	b.ReportMetric(ratio, "ratio-p99")
	b.ReportMetric(float64(errs), "errors")
	fmt.Printf("lane 16's ordinary calls (%d): idle p99 %d µs; 15 lanes flooding p99 %d µs; ratio %.2f; errors %d\n  idle:    %s\n  flooded: %s\n",
		n, idle99, hit99, ratio, errs, idle, hit)
	if errs > 0 {
		b.Errorf("lane 16 saw %d errors: %s", errs, hit)
	}
}

// envOr is the integer in the environment variable name, or def.
func envOr(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
