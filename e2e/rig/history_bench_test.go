package rig

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
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
//	HISTORY_TRIALS=1000 go test ./e2e/rig -run '^$' -bench History -benchtime 1x -timeout 60m
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
	// Each operation's median wall time, and the median CPU time in it of
	// the broker with the commands it started and reaped (the self-test's
	// probes, the stop helpers) and of the controller: where the time goes, less
	// swayed than wall time by whatever else runs on the machine.
	type cost struct{ wall, broker, ctl time.Duration }
	median := func(f func()) cost {
		var d, bc, cc []time.Duration
		for i := 0; i < 5; i++ {
			st := r.Status()
			b0 := treeCPU(st.BrokerPID)
			c0, _ := procUsage(st.ControllerPID)
			t0 := time.Now()
			f()
			d = append(d, time.Since(t0))
			if st2 := r.Status(); st2.BrokerPID == st.BrokerPID {
				c1, _ := procUsage(st.ControllerPID)
				bc, cc = append(bc, treeCPU(st.BrokerPID)-b0), append(cc, c1-c0)
			}
		}
		ms := func(p float64) time.Duration { return time.Duration(p * float64(time.Millisecond)) }
		return cost{ms(pct(d, 50)), ms(pct(bc, 50)), ms(pct(cc, 50))}
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
	fresh := make([]cost, len(ops))
	for i, op := range ops {
		fresh[i] = median(op.f)
	}
	grewFrom := grewSnapshot(r)
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
	grewTo := grewSnapshot(r)
	fmt.Printf("the broker's descriptors after %d trials, by what they name:\n", trials)
	for k, n := range fdKinds(r.Status().BrokerPID) {
		fmt.Printf("  %5d  %s\n", n, k)
	}
	fmt.Printf("after %d trials against a fresh rig (median of 5; CPU in it of the broker with its reaped children, and of the controller):\n", trials)
	for i, op := range ops {
		after := median(op.f)
		f := fresh[i]
		fmt.Printf("  %-24s fresh %8.1f ms  after %8.1f ms  %5.2fx   broker+children CPU %6.1f -> %6.1f ms, controller CPU %6.1f -> %6.1f ms\n", op.name,
			msOf(f.wall), msOf(after.wall), float64(after.wall)/float64(f.wall), msOf(f.broker), msOf(after.broker), msOf(f.ctl), msOf(after.ctl))
	}
	// The broker's start clears scratch (the kept trial folders) but not
	// the ledger: the self-test once more tells which of the two costs.
	again := median(ops[1].f)
	fmt.Printf("  %-24s fresh %8.1f ms  after %8.1f ms  %5.2fx   (again after the broker's restart: scratch cleared, the ledger kept)\n", ops[1].name,
		msOf(fresh[1].wall), msOf(again.wall), float64(again.wall)/float64(fresh[1].wall))
	fmt.Println("what grew with the trials (fresh -> after):")
	for _, k := range grewKeys {
		fmt.Printf("  %-40s %10d -> %10d\n", k, grewFrom[k], grewTo[k])
	}
}

// fdKinds counts a process's descriptors by what they name, with the
// numbers in names taken out (a trial's id, an inode).
func fdKinds(pid int) map[string]int {
	out := map[string]int{}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		out[digits.ReplaceAllString(l, "N")]++
	}
	return out
}

var digits = regexp.MustCompile(`[0-9a-f]{6,}|[0-9]+`)

// treeCPU is a process's CPU time with that of its children it reaped.
func treeCPU(pid int) time.Duration {
	f, err := statFields(pid)
	if err != nil {
		return 0
	}
	var ticks int64
	for _, i := range []int{11, 12, 13, 14} { // utime stime cutime cstime
		n, _ := strconv.ParseInt(f[i], 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

var grewKeys = []string{"entries in scratch/trials", "ledger.db bytes", "processes on the host", "broker threads", "broker open descriptors", "broker RSS KiB", "controller threads", "controller open descriptors", "controller RSS anon KiB", "controller RSS file KiB"}

// grewSnapshot counts what could grow with a rig's history.
func grewSnapshot(r *testrig.Rig) map[string]int64 {
	st := r.Status()
	m := map[string]int64{}
	count := func(dir string) int64 {
		ents, _ := os.ReadDir(dir)
		return int64(len(ents))
	}
	m["entries in scratch/trials"] = count(filepath.Join(r.Cfg.ScratchDir(), "trials"))
	if fi, err := os.Stat(filepath.Join(r.Cfg.ControllerDir(), "ledger.db")); err == nil {
		m["ledger.db bytes"] = fi.Size()
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err == nil {
			m["processes on the host"]++
		}
	}
	for _, who := range []struct {
		name string
		pid  int
	}{{"broker", st.BrokerPID}, {"controller", st.ControllerPID}} {
		base := fmt.Sprintf("/proc/%d", who.pid)
		m[who.name+" threads"] = count(base + "/task")
		m[who.name+" open descriptors"] = count(base + "/fd")
		anon, file := rssKinds(who.pid)
		if who.name == "broker" {
			m["broker RSS KiB"] = (anon + file) >> 10
		} else {
			m["controller RSS anon KiB"], m["controller RSS file KiB"] = anon>>10, file>>10
		}
	}
	return m
}
