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

// benchTrial starts a trial on a lane.
func benchTrial(b *testing.B, r *testrig.Rig, lane int, project string) controller.TrialInfo {
	out, stderr, code := r.Thermite("trial", "start", "--lane", strconv.Itoa(lane), "--project", project, "--json")
	if code != 0 {
		b.Fatalf("trial start lane %d: %s", lane, stderr)
	}
	var info controller.TrialInfo
	testrig.JSON(b, out, &info)
	return info
}

// BenchmarkAPIUnderAttack is one lane's API calls (lane 2's agent, the
// trial's details and a recorded step in turn) while the rig is idle,
// then while lane 1 holds everything its budgets allow: lane-1 opens 200
// idle connections (max_conns_per_peer keeps 64) and its agent sends 32
// writes of 16 MiB with their last byte withheld
// (max_inflight_bytes_per_token keeps 2). It
// prints the p50 and p99 of both and their ratios; the bound is 2x.
//
//	go test ./e2e/rig -run '^$' -bench APIUnderAttack -benchtime 1x
func BenchmarkAPIUnderAttack(b *testing.B) {
	r := testrig.New(b, testrig.Options{})
	p := filepath.Join(r.Dir, "project")
	os.MkdirAll(p, 0o755)
	os.WriteFile(filepath.Join(p, "README"), []byte("hello project\n"), 0o644)
	t1, t2 := benchTrial(b, r, 1, p), benchTrial(b, r, 2, p)
	const n = 400
	measure := func(what string) (p50, p99 int) {
		v := startAs(b, r, "agent-2", "calls", "ATTACK_SOCKET="+t2.APISocket, "ATTACK_TOKEN="+tokenOf(b, t2), "ATTACK_N="+strconv.Itoa(n))
		line := v.expect("calls ", 2*time.Minute)
		if ok := field(b, line, "ok"); ok != n {
			b.Errorf("%s: lane 2's calls: %s", what, line)
		}
		return field(b, line, "p50"), field(b, line, "p99")
	}
	// Warm the controller and the connection path first.
	measure("warm-up")
	b.ResetTimer()
	idle50, idle99 := measure("idle")
	idler := startAs(b, r, "lane-1", "idle", "ATTACK_SOCKET="+r.Cfg.RoleAPISocket("lane-1"), "ATTACK_N=200")
	b.Logf("lane-1: %s", idler.expect("idle ", time.Minute))
	withholder := startAs(b, r, "agent-1", "withheld", "ATTACK_SOCKET="+t1.APISocket, "ATTACK_TOKEN="+tokenOf(b, t1),
		"ATTACK_PATH=/v1/fs/write", "ATTACK_N=32", "ATTACK_LEN="+strconv.Itoa(16<<20))
	b.Logf("agent-1: %s", withholder.expect("withheld ", 2*time.Minute))
	withholder.expect("holding ", time.Minute)
	hit50, hit99 := measure("attacked")
	b.StopTimer()
	idler.stop()
	withholder.stop()
	r50, r99 := float64(hit50)/float64(idle50), float64(hit99)/float64(idle99)
	b.ReportMetric(float64(idle50), "idle-p50-µs")
	b.ReportMetric(float64(idle99), "idle-p99-µs")
	b.ReportMetric(float64(hit50), "attacked-p50-µs")
	b.ReportMetric(float64(hit99), "attacked-p99-µs")
	b.ReportMetric(r50, "ratio-p50")
	b.ReportMetric(r99, "ratio-p99")
	fmt.Printf("lane 2's API calls (%d): idle p50 %d µs p99 %d µs; lane 1 attacking p50 %d µs p99 %d µs; ratio p50 %.2f p99 %.2f\n",
		n, idle50, idle99, hit50, hit99, r50, r99)
}
