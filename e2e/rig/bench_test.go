package rig

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"thermite/controller"
	"thermite/controller/ledger"
	"thermite/internal/copytree"
	"thermite/internal/cpuset"
	"thermite/internal/rpc"
	"thermite/internal/testrig"
)

// BenchmarkRunTrue is the round trip of `/bin/true` as a lane through the
// broker, beside the same program started directly with os/exec, through
// setpriv (a uid switch) and through bwrap (namespaces), and `thermite
// run-as lane-1 -- /bin/true` as an operator types it (the CLI's own start
// included), and the same through the light client thermite-run-as, in one
// run. scripts/bench.sh prints each as a ratio to os/exec, and run-as and
// run-as-light to setpriv.
func BenchmarkRunTrue(b *testing.B) {
	r := testrig.New(b, testrig.Options{})
	lane := r.Role("lane-1")
	lightBin := testrig.RunAsBinary(b)
	// runAsLight runs thermite-run-as as run-as is run (r.Thermite): with
	// the rig's configuration, its output taken.
	runAsLight := func() error {
		cmd := exec.Command(lightBin, "--config", r.Config, "lane-1", "--", "/bin/true")
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("thermite-run-as: %w: %s", err, e.String())
		}
		return nil
	}
	b.Run("exec", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := exec.Command("/bin/true").Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
	// broker-lane is a Run as the controller makes it: on a connection
	// kept from the last answered Run.
	// It reports the broker's own CPU time and its threads' context
	// switches per Run (the command's are its own): figures a loaded
	// machine moves less than the wall time.
	b.Run("broker-lane", func(b *testing.B) {
		run := keptRun(b, r.Cfg.BrokerSocket())
		cpu0, cs0 := processCost(b, r.Status().BrokerPID)
		for i := 0; i < b.N; i++ {
			if err := run(); err != nil {
				b.Fatal(err)
			}
		}
		cpu1, cs1 := processCost(b, r.Status().BrokerPID)
		b.ReportMetric(float64(cpu1-cpu0)/1e3/float64(b.N), "broker-cpu-µs/run")
		b.ReportMetric(float64(cs1-cs0)/float64(b.N), "broker-switches/run")
	})
	// broker-lane-dial is a Run on a connection of its own (rpc.Call, as
	// thermite run-as makes it): the connect, accept and peer check too.
	b.Run("broker-lane-dial", func(b *testing.B) {
		req := &rpc.Request{Op: rpc.OpRun, Run: &rpc.RunRequest{Role: "lane-1", Argv: []string{"/bin/true"}}}
		for i := 0; i < b.N; i++ {
			resp, err := rpc.Call(r.Cfg.BrokerSocket(), req)
			if err != nil || resp.Run.ExitCode != 0 {
				b.Fatalf("%v %+v", err, resp)
			}
		}
	})
	// broker-ping is the RPC alone: a connection, the peer check, one
	// request and its answer, with no command.
	b.Run("broker-ping", func(b *testing.B) {
		req := &rpc.Request{Op: rpc.OpPing}
		for i := 0; i < b.N; i++ {
			if _, err := rpc.Call(r.Cfg.BrokerSocket(), req); err != nil {
				b.Fatal(err)
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
	// interleaved takes one of each in turn, so that a shared machine's
	// drift falls on all alike, and reports the medians' ratios.
	b.Run("interleaved", func(b *testing.B) {
		uid := strconv.Itoa(lane.UID)
		req := &rpc.Request{Op: rpc.OpRun, Run: &rpc.RunRequest{Role: "lane-1", Argv: []string{"/bin/true"}}}
		var ex, br, bd, sp, ra, rl []int64
		run := keptRun(b, r.Cfg.BrokerSocket())
		timed := func(into *[]int64, f func() error) {
			t0 := time.Now()
			if err := f(); err != nil {
				b.Fatal(err)
			}
			*into = append(*into, time.Since(t0).Nanoseconds())
		}
		for i := 0; i < b.N; i++ {
			timed(&ex, func() error { return exec.Command("/bin/true").Run() })
			timed(&br, run)
			timed(&bd, func() error {
				resp, err := rpc.Call(r.Cfg.BrokerSocket(), req)
				if err == nil && resp.Run.ExitCode != 0 {
					err = fmt.Errorf("%+v", resp)
				}
				return err
			})
			timed(&sp, func() error {
				return exec.Command("setpriv", "--reuid", uid, "--regid", uid, "--clear-groups", "/bin/true").Run()
			})
			timed(&ra, func() error {
				if _, stderr, code := r.Thermite("run-as", "lane-1", "--", "/bin/true"); code != 0 {
					return fmt.Errorf("run-as: exit %d: %s", code, stderr)
				}
				return nil
			})
			timed(&rl, runAsLight)
		}
		e, bl, s, a, l := medianNS(ex), medianNS(br), medianNS(sp), medianNS(ra), medianNS(rl)
		b.ReportMetric(bl/e, "broker-lane/exec")
		b.ReportMetric(medianNS(bd)/e, "broker-lane-dial/exec")
		b.ReportMetric(s/e, "setpriv/exec")
		b.ReportMetric(a/s, "run-as/setpriv")
		b.ReportMetric(l/s, "run-as-light/setpriv")
	})
	b.Run("run-as", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, stderr, code := r.Thermite("run-as", "lane-1", "--", "/bin/true"); code != 0 {
				b.Fatalf("run-as: exit %d: %s", code, stderr)
			}
		}
	})
	b.Run("run-as-light", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := runAsLight(); err != nil {
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
	// broker-lane-no-cgroup is the same round trip on a rig without
	// cgroups, beside os/exec: what placing the child in its groups costs
	// where that is a write per cgroup v1 hierarchy (on v2 the child is
	// born in its group by clone3).
	b.Run("broker-lane-no-cgroup", func(b *testing.B) {
		nc := testrig.New(b, testrig.Options{Extra: "[cgroup]\nenabled = false\n"})
		run := keptRun(b, nc.Cfg.BrokerSocket())
		var ex, br []int64
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			if err := exec.Command("/bin/true").Run(); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if err := run(); err != nil {
				b.Fatal(err)
			}
			ex, br = append(ex, t1.Sub(t0).Nanoseconds()), append(br, time.Since(t1).Nanoseconds())
		}
		b.ReportMetric(medianNS(br)/medianNS(ex), "no-cgroup/exec")
	})
}

// processCost is a process's own CPU time (all its threads, in ns) and
// its threads' context switches so far, from /proc.
func processCost(b *testing.B, pid int) (cpuNS, switches int64) {
	b.Helper()
	f, err := statFields(pid)
	if err != nil {
		b.Fatal(err)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	cpuNS = (ut + st) * 1e9 / 100 // USER_HZ
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	for _, t := range tasks {
		data, err := os.ReadFile(t)
		if err != nil {
			continue // a thread that ended
		}
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.HasSuffix(k, "ctxt_switches") {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				switches += n
			}
		}
	}
	return cpuNS, switches
}

// keptRun is a Run of /bin/true as lane-1 on one connection kept for the
// benchmark's life, as the controller keeps its connections between Runs.
func keptRun(b *testing.B, socket string) func() error {
	b.Helper()
	c, err := rpc.Dial(socket)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	req := &rpc.Request{Op: rpc.OpRun, Run: &rpc.RunRequest{Role: "lane-1", Argv: []string{"/bin/true"}}}
	return func() error {
		resp, err := c.Call(req)
		if err == nil && resp.Run.ExitCode != 0 {
			err = fmt.Errorf("%+v", resp.Run)
		}
		return err
	}
}

// BenchmarkStopUser500 is StopUser of a lane running 500 processes: with
// its cgroup (cgroup.kill on v2, the freezer on v1, then the helper finds
// nothing left) beside the helper's kill(-1) loop alone (cgroups off), in
// one run. scripts/bench.sh prints the ratio.
func BenchmarkStopUser500(b *testing.B) {
	for _, c := range []struct{ name, cgroup string }{
		{"helper", "[cgroup]\nenabled = false\n"},
		{"cgroup", "[cgroup]\nenabled = true\npids = 4000\n"},
	} {
		b.Run(c.name, func(b *testing.B) {
			r := testrig.New(b, testrig.Options{Extra: "[limits]\nprocesses = 2000\n" + c.cgroup})
			if st := r.Status(); c.name == "cgroup" && strings.HasPrefix(st.Cgroup, "none") {
				b.Skipf("needs a writable cgroup tree: %s", st.Cgroup)
			} else {
				b.Logf("cgroup: %s", st.Cgroup)
			}
			stopUser500(b, r)
		})
	}
}

func stopUser500(b *testing.B, r *testrig.Rig) {
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

// BenchmarkSelftest is the whole isolation self-test on a rig of 10 roles
// (2 lanes, 2 agents and the rest) and on the default table of 38 (16
// lanes, 16 agents and the rest). Each reports its roles, the self-test's
// own wall time (its WallMS, the median of the runs) and the CPU the broker
// and every process it started spent on one self-test: a figure a loaded
// machine moves less than the wall time.
func BenchmarkSelftest(b *testing.B) {
	for _, lanes := range []int{2, 16} {
		r := testrig.New(b, testrig.Options{Lanes: lanes})
		b.Run(fmt.Sprintf("roles-%d", len(r.Table.Roles)), func(b *testing.B) {
			req := &rpc.Request{Op: rpc.OpSelftest, Selftest: &rpc.SelftestRequest{}}
			pid := r.Status().BrokerPID
			var walls []int64
			var cpu time.Duration
			for i := 0; i < b.N; i++ {
				cpu0 := treeCPU(pid)
				resp, err := rpc.Call(r.Cfg.BrokerSocket(), req)
				if err != nil || !resp.Selftest.Holds {
					b.Fatalf("%v %+v", err, resp)
				}
				cpu += treeCPU(pid) - cpu0
				walls = append(walls, resp.Selftest.WallMS*1e6)
			}
			b.ReportMetric(float64(len(r.Table.Roles)), "roles")
			b.ReportMetric(medianNS(walls)/1e6, "wall-ms")
			b.ReportMetric(msOf(cpu)/float64(b.N), "cpu-ms")
		})
	}
}

// runTrue is Run of /bin/true as lane-1 on a rig, b.N times.
func runTrue(b *testing.B, r *testrig.Rig) {
	req := &rpc.Request{Op: rpc.OpRun, Run: &rpc.RunRequest{Role: "lane-1", Argv: []string{"/bin/true"}}}
	for i := 0; i < b.N; i++ {
		resp, err := rpc.Call(r.Cfg.BrokerSocket(), req)
		if err != nil || resp.Run.ExitCode != 0 {
			b.Fatalf("%v %+v", err, resp)
		}
	}
}

// weakened is a rig of the test build with one protection off.
func weakened(b *testing.B, what string, gpus int) *testrig.Rig {
	return testrig.New(b, testrig.Options{GPUs: gpus, TimingUsers: max(gpus, 1), Tags: "thermite_weaken", Env: []string{"THERMITE_WEAKEN=" + what}, Extra: `startup_selftest = "warn"`})
}

// BenchmarkFence is Run of /bin/true as a lane with the GPU fence alone (a
// pre-built rule set leaving out 3 of 4 stand-in cards), beside the same
// with no rule set at all, in one run.
func BenchmarkFence(b *testing.B) {
	fenced := weakened(b, "fence-only", 4)
	unfenced := weakened(b, "no-landlock", 4)
	b.Run("unfenced", func(b *testing.B) { runTrue(b, unfenced) })
	b.Run("fenced", func(b *testing.B) { runTrue(b, fenced) })
}

// BenchmarkPolicy is Run of /bin/true as a lane under the full policy
// (rule set with the filesystem, network and scoping, seccomp filter,
// cgroup placement) beside the GPU-fence-only spawn, in one run.
func BenchmarkPolicy(b *testing.B) {
	full := testrig.New(b, testrig.Options{GPUs: 4, TimingUsers: 4})
	fenceOnly := weakened(b, "fence-only", 4)
	b.Run("fence-only", func(b *testing.B) { runTrue(b, fenceOnly) })
	b.Run("full", func(b *testing.B) { runTrue(b, full) })
}

// latencies runs op n times on each of conc goroutines and reports the
// p50 and p99 of one call, in microseconds.
func latencies(b *testing.B, conc int, op func(worker int) error) {
	var mu sync.Mutex
	var all []time.Duration
	var wg sync.WaitGroup
	b.ResetTimer()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			mine := make([]time.Duration, 0, b.N)
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				if err := op(w); err != nil {
					b.Error(err)
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		}(w)
	}
	wg.Wait()
	b.StopTimer()
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	if len(all) == 0 {
		return
	}
	b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkAPI is the harness API against the same operation done directly
// by a local process: a read of a 4 KiB file, and an exec of /bin/true,
// with one client and with 16 lanes at once.
func BenchmarkAPI(b *testing.B) {
	r := testrig.New(b, testrig.Options{Lanes: 16})
	p := filepath.Join(r.Dir, "project")
	os.MkdirAll(p, 0o755)
	os.WriteFile(filepath.Join(p, "f4k"), bytes.Repeat([]byte("x"), 4096), 0o644)
	var clients []*http.Client
	var tokens []string
	var workspace string
	for lane := 1; lane <= 16; lane++ {
		out, stderr, code := r.Thermite("trial", "start", "--lane", strconv.Itoa(lane), "--project", p, "--json")
		if code != 0 {
			b.Fatalf("trial start: %s", stderr)
		}
		var info controller.TrialInfo
		testrig.JSON(b, out, &info)
		tok, _ := os.ReadFile(info.TokenFile)
		tokens = append(tokens, strings.TrimSpace(string(tok)))
		sock := r.Cfg.APISocket() // the bench runs as root: the operator's socket
		clients = append(clients, &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}}})
		if lane == 1 {
			workspace = info.Workspace
		}
	}
	call := func(w int, route, body string) error {
		req, _ := http.NewRequest("POST", "http://api"+route, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tokens[w])
		resp, err := clients[w].Do(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("%s: %s", route, resp.Status)
		}
		return nil
	}
	direct := filepath.Join(workspace, "f4k")
	b.Run("read/direct", func(b *testing.B) {
		latencies(b, 1, func(int) error { _, err := os.ReadFile(direct); return err })
	})
	b.Run("read/api-1", func(b *testing.B) {
		latencies(b, 1, func(w int) error { return call(w, "/v1/fs/read", `{"path":"f4k"}`) })
	})
	b.Run("read/api-16", func(b *testing.B) {
		latencies(b, 16, func(w int) error { return call(w, "/v1/fs/read", `{"path":"f4k"}`) })
	})
	run := &rpc.Request{Op: rpc.OpRun, Run: &rpc.RunRequest{Role: "lane-1", Argv: []string{"/bin/true"}}}
	b.Run("exec/direct", func(b *testing.B) {
		latencies(b, 1, func(int) error { return exec.Command("/bin/true").Run() })
	})
	b.Run("exec/bare-run", func(b *testing.B) {
		latencies(b, 1, func(int) error { _, err := rpc.Call(r.Cfg.BrokerSocket(), run); return err })
	})
	b.Run("exec/api-1", func(b *testing.B) {
		latencies(b, 1, func(w int) error { return call(w, "/v1/exec", `{"argv":["/bin/true"]}`) })
	})
	b.Run("exec/api-16", func(b *testing.B) {
		latencies(b, 16, func(w int) error { return call(w, "/v1/exec", `{"argv":["/bin/true"]}`) })
	})
}

// BenchmarkTimingNoise is the coefficient of variation of 20 repeats of
// the example kit's CPU-bound program while a lane loads the other CPU:
// pinned to the judge's CPU (the load pinned to the other), against
// unpinned (the run and the load free to share both CPUs).
func BenchmarkTimingNoise(b *testing.B) {
	if _, err := exec.LookPath("cc"); err != nil {
		b.Skip("needs cc for the example kit")
	}
	online, _ := cpuset.Online()
	if len(online) < 2 {
		b.Skip("needs two CPUs")
	}
	measure := func(b *testing.B, judge string, kitCPUs int, loadCPUs string) float64 {
		r := testrig.New(b, testrig.Options{Extra: fmt.Sprintf("judge_cpus = %q\n", judge)})
		kitDir := filepath.Join(r.Dir, "kit")
		copytree.Copy(filepath.Join(testrig.ModuleRoot(), "examples", "kits", "sum"), kitDir, copytree.Options{UID: -1, GID: -1})
		manifest, _ := os.ReadFile(filepath.Join(kitDir, "kit.toml"))
		text := strings.Replace(string(manifest), "repeats = 5", "repeats = 20", 1)
		text = strings.Replace(text, "cpus = 1", fmt.Sprintf("cpus = %d", kitCPUs), 1)
		os.WriteFile(filepath.Join(kitDir, "kit.toml"), []byte(text), 0o644)
		if _, stderr, code := r.Thermite("kit", "import", kitDir); code != 0 {
			b.Fatal(stderr)
		}
		out, stderr, code := r.Thermite("judge", "build", "--kit", "sum", "--project", filepath.Join(testrig.ModuleRoot(), "examples", "projects", "sum"), "--json")
		if code != 0 {
			b.Fatal(stderr)
		}
		var bld ledger.Build
		testrig.JSON(b, out, &bld)
		flags := []string{"--timeout", "5m"}
		if loadCPUs != "" {
			flags = append(flags, "--cpus", loadCPUs)
		}
		go r.RunAs("lane-1", flags, "sh", "-c", "exec >/dev/null 2>&1; while :; do :; done")
		time.Sleep(200 * time.Millisecond)
		out, stderr, code = r.Thermite("judge", "time", bld.ID, "--kit", "sum", "--json")
		r.Thermite("stop", "lane-1")
		if code != 0 {
			b.Fatal(stderr)
		}
		var tr ledger.TimedRun
		testrig.JSON(b, out, &tr)
		return tr.CVPercent
	}
	last := online[len(online)-1]
	var pinned, unpinned float64
	for i := 0; i < b.N; i++ {
		pinned = measure(b, strconv.Itoa(last), 1, strconv.Itoa(online[0]))
		unpinned = measure(b, online.String(), len(online), "")
	}
	b.ReportMetric(pinned, "cv%-pinned")
	b.ReportMetric(unpinned, "cv%-unpinned")
}
