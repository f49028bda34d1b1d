package rig

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/testrig"
)

// BenchmarkIdleTrialsDiskCheck is the rig's CPU per disk_check interval
// (the broker's and the controller's together) with 1, 4 and 16 open,
// idle trials of IDLE_FILES files each (default 10,000), against one
// `du -s` of one such workspace: an idle trial's check reuses its last
// walk, so the aim is that 16 idle trials cost less than one du. The
// quota case runs the same on a scratch with user quotas, where each
// check is one quotactl per role (it skips where no such file system
// mounts).
//
//	go test ./e2e/rig -run '^$' -bench IdleTrialsDiskCheck -benchtime 1x -timeout 30m
func BenchmarkIdleTrialsDiskCheck(b *testing.B) {
	b.Run("walk", func(b *testing.B) { idleTrialsDiskCheck(b, false) })
	b.Run("quota", func(b *testing.B) { idleTrialsDiskCheck(b, true) })
}

func idleTrialsDiskCheck(b *testing.B, onQuota bool) {
	files := envCount(b, "IDLE_FILES", 10000)
	r := testrig.New(b, testrig.Options{Lanes: 16, Extra: "[trial]\ndisk_check = \"1s\"\n", NoStart: onQuota})
	if onQuota {
		mountWithUserQuotas(b, r.Cfg.StateDir, 4096)
		if err := r.Start(); err != nil {
			b.Fatalf("start: %v\n%s", err, r.LogText())
		}
		if st := r.Status(); !strings.HasPrefix(st.DiskCheck, "quota") {
			b.Fatalf("disk check %q on a file system with user quotas", st.DiskCheck)
		}
	}
	project := filepath.Join(r.Dir, "project")
	for i := 0; i < files; i++ {
		d := filepath.Join(project, fmt.Sprintf("d%03d", i/100))
		if i%100 == 0 {
			os.MkdirAll(d, 0o755)
		}
		os.WriteFile(filepath.Join(d, fmt.Sprintf("f%03d", i%100)), []byte("x"), 0o644)
	}
	var du time.Duration
	var ws string
	rigCPU := func() time.Duration {
		st := r.Status()
		a, _ := procUsage(st.BrokerPID)
		c, _ := procUsage(st.ControllerPID)
		return a + c
	}
	open := 0
	b.ResetTimer()
	for _, n := range []int{1, 4, 16} {
		for ; open < n; open++ {
			info := benchTrial(b, r, open+1, project)
			ws = info.Workspace
		}
		// Let every trial have its first walks, then measure 10 intervals.
		time.Sleep(3 * time.Second)
		before := rigCPU()
		time.Sleep(10 * time.Second)
		per := (rigCPU() - before) / 10
		if du == 0 {
			du = duCPU(b, ws)
		}
		fmt.Printf("%s: %2d idle trials of %d files: rig CPU per 1s interval %6.1f ms; one du -s of one workspace %6.1f ms; ratio %.2f\n",
			map[bool]string{false: "walk", true: "quota"}[onQuota], n, files, float64(per.Microseconds())/1000, float64(du.Microseconds())/1000, float64(per)/float64(du))
		b.ReportMetric(float64(per)/float64(du), fmt.Sprintf("cpu-per-interval/du-%dtrials", n))
	}
}

// BenchmarkBusyTrialsDiskCheck is the rig's CPU per disk_check interval
// (broker and controller, with the helpers they reaped) with 1, 4 and 16
// (BUSY_TRIALS, e.g. "1,4") open trials of BUSY_FILES files each (default
// 10,000), each trial's
// lane rewriting 5 files every second, against one `du -s` of one such
// workspace. A busy trial's check cannot reuse its last measure: the
// incremental walk revisits what changed; the full-walk peer is the same
// run in a thermite_weaken build without Landlock (no-landlock), where
// every check walks every tree. Aim: 16 busy trials cost less than one
// du per interval.
//
//	go test ./e2e/rig -run '^$' -bench BusyTrialsDiskCheck -benchtime 1x -timeout 30m
func BenchmarkBusyTrialsDiskCheck(b *testing.B) {
	b.Run("incremental", func(b *testing.B) { busyTrialsDiskCheck(b, false) })
	b.Run("full-walk", func(b *testing.B) { busyTrialsDiskCheck(b, true) })
}

func busyTrialsDiskCheck(b *testing.B, fullWalk bool) {
	files := envCount(b, "BUSY_FILES", 10000)
	counts := []int{1, 4, 16}
	if v := os.Getenv("BUSY_TRIALS"); v != "" {
		counts = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n < 1 || n > 16 {
				b.Fatalf("BUSY_TRIALS: %q is not a list of counts from 1 to 16", v)
			}
			counts = append(counts, n)
		}
	}
	opts := testrig.Options{Lanes: 16, Extra: "[trial]\ndisk_check = \"1s\"\ndisk_cap_mb = 100000\n"}
	mode := "incremental"
	if fullWalk {
		opts.Tags, opts.Env, mode = "thermite_weaken", []string{"THERMITE_WEAKEN=no-landlock"}, "full walk"
		opts.Extra = "startup_selftest = \"warn\"\n" + opts.Extra
	}
	r := testrig.New(b, opts)
	if st := r.Status(); !strings.HasPrefix(st.DiskCheck, map[bool]string{false: "incremental", true: "full walk"}[fullWalk]) {
		b.Fatalf("disk check %q, want the %s", st.DiskCheck, mode)
	}
	project := filepath.Join(r.Dir, "project")
	for i := 0; i < files; i++ {
		d := filepath.Join(project, fmt.Sprintf("d%03d", i/100))
		if i%100 == 0 {
			os.MkdirAll(d, 0o755)
		}
		os.WriteFile(filepath.Join(d, fmt.Sprintf("f%03d", i%100)), []byte("x"), 0o644)
	}
	// ticks are a process's own CPU and that of the children it reaped
	// (the broker's helpers, which run as the role).
	ticks := func(pid int) (own, children time.Duration) {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, 0
		}
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
		var t [4]int64
		for i := range t {
			t[i], _ = strconv.ParseInt(f[11+i], 10, 64)
		}
		// Clock ticks are 100 a second on Linux.
		return time.Duration(t[0]+t[1]) * 10 * time.Millisecond, time.Duration(t[2]+t[3]) * 10 * time.Millisecond
	}
	// rigCPU is the broker's own, its reaped helpers', and the
	// controller's (with its children).
	rigCPU := func() [3]time.Duration {
		st := r.Status()
		bo, bc := ticks(st.BrokerPID)
		co, cc := ticks(st.ControllerPID)
		return [3]time.Duration{bo, bc, co + cc}
	}
	writer := `setsid -f sh -c 'while :; do for i in 1 2 3 4 5; do head -c 5000 /dev/zero >d00$i/f00$i; done; sleep 1; done' </dev/null >/dev/null 2>&1`
	var du time.Duration
	var ws string
	open := 0
	b.ResetTimer()
	for _, n := range counts {
		for ; open < n; open++ {
			info := benchTrial(b, r, open+1, project)
			ws = info.Workspace
			if _, stderr, code := r.Thermite("trial", "exec", info.ID, "--", "sh", "-c", writer); code != 0 {
				b.Fatalf("trial exec: %s", stderr)
			}
		}
		// Let every trial have its first walks, then measure 10 intervals.
		time.Sleep(3 * time.Second)
		before := rigCPU()
		time.Sleep(10 * time.Second)
		after := rigCPU()
		var parts [3]time.Duration
		for i := range parts {
			parts[i] = (after[i] - before[i]) / 10
		}
		per := parts[0] + parts[1] + parts[2]
		if du == 0 {
			du = duCPU(b, ws)
		}
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		fmt.Printf("%s: %2d busy trials of %d files: rig CPU per 1s interval %6.1f ms (broker %.1f, its helpers %.1f, controller %.1f); one du -s of one workspace %6.1f ms; ratio %.2f\n",
			mode, n, files, ms(per), ms(parts[0]), ms(parts[1]), ms(parts[2]), ms(du), float64(per)/float64(du))
		b.ReportMetric(float64(per)/float64(du), fmt.Sprintf("cpu-per-interval/du-%dtrials", n))
	}
}

// envCount is the count the variable name gives, or def where it is unset.
func envCount(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s: %q is not a count", name, v)
	}
	return n
}

// duCPU is the CPU time (user and system) of one `du -s dir`, the mean of
// three.
func duCPU(b *testing.B, dir string) time.Duration {
	b.Helper()
	var ru0, ru1 unix.Rusage
	unix.Getrusage(unix.RUSAGE_CHILDREN, &ru0)
	for i := 0; i < 3; i++ {
		if err := exec.Command("du", "-s", dir).Run(); err != nil {
			b.Fatal(err)
		}
	}
	unix.Getrusage(unix.RUSAGE_CHILDREN, &ru1)
	return time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) / 3
}
