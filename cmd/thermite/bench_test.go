package main

import (
	"os/exec"
	"strconv"
	"testing"
	"time"

	"thermite/internal/rpc"
	"thermite/internal/testrig"
)

// BenchmarkRunTrue is the round trip of `/bin/true` as a lane through the
// broker, beside the same program started directly with os/exec, through
// setpriv (a uid switch) and through bwrap (namespaces), in one run.
// scripts/bench.sh prints each as a ratio to os/exec.
func BenchmarkRunTrue(b *testing.B) {
	r := testrig.New(b, testrig.Options{})
	lane := r.Role("lane-1")
	b.Run("exec", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := exec.Command("/bin/true").Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("broker-lane", func(b *testing.B) {
		req := &rpc.Request{Op: rpc.OpRun, Run: &rpc.RunRequest{Role: "lane-1", Argv: []string{"/bin/true"}}}
		for i := 0; i < b.N; i++ {
			resp, err := rpc.Call(r.Cfg.BrokerSocket(), req)
			if err != nil || resp.Run.ExitCode != 0 {
				b.Fatalf("%v %+v", err, resp)
			}
		}
	})
	b.Run("setpriv", func(b *testing.B) {
		if _, err := exec.LookPath("setpriv"); err != nil {
			b.Skip("needs setpriv (util-linux)")
		}
		uid := strconv.Itoa(lane.UID)
		for i := 0; i < b.N; i++ {
			if err := exec.Command("setpriv", "--reuid", uid, "--regid", uid, "--clear-groups", "/bin/true").Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("bwrap", func(b *testing.B) {
		if _, err := exec.LookPath("bwrap"); err != nil {
			b.Skip("needs bwrap (Debian package bubblewrap)")
		}
		for i := 0; i < b.N; i++ {
			if out, err := exec.Command("bwrap", "--ro-bind", "/", "/", "/bin/true").CombinedOutput(); err != nil {
				b.Fatalf("%v %s", err, out)
			}
		}
	})
}

// BenchmarkStopUser500 is StopUser of a lane running 500 processes.
func BenchmarkStopUser500(b *testing.B) {
	r := testrig.New(b, testrig.Options{Extra: "[limits]\nprocesses = 2000\n"})
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		go r.RunAs("lane-1", nil, "sh", "-c", "exec >/dev/null 2>&1 </dev/null; i=0; while [ $i -lt 500 ]; do setsid sleep 600 & i=$((i+1)); done")
		deadline := time.Now().Add(30 * time.Second)
		for len(r.Procs("lane-1")) < 500 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		n := len(r.Procs("lane-1"))
		if n < 500 {
			b.Fatalf("only %d processes started", n)
		}
		b.StartTimer()
		resp, err := rpc.Call(r.Cfg.BrokerSocket(), &rpc.Request{Op: rpc.OpStopUser, StopUser: &rpc.StopUserRequest{Role: "lane-1"}})
		b.StopTimer()
		if err != nil || resp.StopUser.Stopped < 500 {
			b.Fatalf("%v %+v", err, resp)
		}
		if left := r.Procs("lane-1"); len(left) != 0 {
			b.Fatalf("%d processes left", len(left))
		}
		b.StartTimer()
	}
}

// BenchmarkSelftest is the whole isolation self-test over the default
// table: 16 lanes, 16 agents and the rest.
func BenchmarkSelftest(b *testing.B) {
	r := testrig.New(b, testrig.Options{Lanes: 16})
	req := &rpc.Request{Op: rpc.OpSelftest, Selftest: &rpc.SelftestRequest{}}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		resp, err := rpc.Call(r.Cfg.BrokerSocket(), req)
		if err != nil || !resp.Selftest.Holds {
			b.Fatalf("%v %+v", err, resp)
		}
	}
	b.ReportMetric(float64(len(r.Table.Roles)), "roles")
}

// BenchmarkFence is Run of /bin/true as a lane with the GPU fence (a
// pre-built rule set on a rig with 4 stand-in cards), beside the same on a
// rig whose fence is off (no GPU nodes, fence ABI set out of reach), in
// one run.
func BenchmarkFence(b *testing.B) {
	fenced := testrig.New(b, testrig.Options{GPUs: 4, TimingUsers: 4})
	unfenced := testrig.New(b, testrig.Options{GPUExtra: "fence_min_abi = 99", Extra: "[gpu]\nfence_min_abi = 99\n"})
	run := func(b *testing.B, r *testrig.Rig) {
		req := &rpc.Request{Op: rpc.OpRun, Run: &rpc.RunRequest{Role: "lane-1", Argv: []string{"/bin/true"}}}
		for i := 0; i < b.N; i++ {
			resp, err := rpc.Call(r.Cfg.BrokerSocket(), req)
			if err != nil || resp.Run.ExitCode != 0 {
				b.Fatalf("%v %+v", err, resp)
			}
		}
	}
	b.Run("unfenced", func(b *testing.B) { run(b, unfenced) })
	b.Run("fenced", func(b *testing.B) { run(b, fenced) })
}
