package rig

import (
	"os"
	"sort"
	"syscall"
	"testing"
	"time"

	"thermite/internal/rpc"
	"thermite/internal/testrig"
)

// BenchmarkJudgeClock: the median wall time the judge path measures for a
// trivial candidate (/bin/true as the timing user, through the broker's
// start and hold, from its execve to its exit), against the same program
// timed directly around a plain fork+exec+wait, in one run. judged/direct
// near 1 or below means the clock counts the candidate, not the sandbox.
func BenchmarkJudgeClock(b *testing.B) {
	r := testrig.New(b, testrig.Options{})
	req := &rpc.Request{Op: rpc.OpRun, Run: &rpc.RunRequest{Role: "run", Argv: []string{"/bin/true"}}}
	null, err := os.Open(os.DevNull)
	if err != nil {
		b.Fatal(err)
	}
	defer null.Close()
	attr := &syscall.ProcAttr{Files: []uintptr{null.Fd(), null.Fd(), null.Fd()}}
	var judged, direct []int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		resp, err := rpc.Call(r.Cfg.BrokerSocket(), req)
		if err != nil || resp.Run == nil || resp.Run.ExitCode != 0 {
			b.Fatalf("%v %+v", err, resp)
		}
		judged = append(judged, resp.Run.WallNS)
		start := time.Now()
		pid, err := syscall.ForkExec("/bin/true", []string{"/bin/true"}, attr)
		if err != nil {
			b.Fatal(err)
		}
		var ws syscall.WaitStatus
		if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil {
			b.Fatal(err)
		}
		direct = append(direct, time.Since(start).Nanoseconds())
	}
	j, d := medianNS(judged), medianNS(direct)
	b.ReportMetric(j, "judged-median-ns")
	b.ReportMetric(d, "direct-median-ns")
	b.ReportMetric(j/d, "judged/direct")
}

func medianNS(xs []int64) float64 {
	s := append([]int64(nil), xs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return float64(s[len(s)/2])
	}
	return float64(s[len(s)/2-1]+s[len(s)/2]) / 2
}
