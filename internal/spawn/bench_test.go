package spawn

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"testing"
	"time"

	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"

	"thermite/internal/seccomp"
	"thermite/internal/testrig"
)

// BenchmarkStart is a start of /bin/true to its exit, in one run: os/exec
// (the peer, unconfined and as root), Start with a lane's whole start
// (credentials and groups, rlimits, affinity, a Landlock rule set, the
// seccomp filter, a cgroup where one is writable), setpriv (a uid switch
// only) and bwrap (namespaces only). scripts/bench.sh prints each as a
// ratio to exec.
func BenchmarkStart(b *testing.B) {
	testrig.RequireRoot(b)
	base := testrig.FreeUIDs(b)
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer null.Close()

	b.Run("exec", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := exec.Command("/bin/true").Run(); err != nil {
				b.Fatal(err)
			}
		}
	})

	b.Run("spawn-lane-full", func(b *testing.B) {
		c := laneCommand(b, base, null)
		for i := 0; i < b.N; i++ {
			ch, err := Start(c)
			if err != nil {
				b.Fatal(err)
			}
			ws, _, err := ch.Wait()
			if err != nil || ws.ExitStatus() != 0 {
				b.Fatalf("%v %v", err, ws)
			}
		}
	})

	b.Run("setpriv", func(b *testing.B) {
		if _, err := exec.LookPath("setpriv"); err != nil {
			b.Skip("needs setpriv (util-linux)")
		}
		uid := strconv.Itoa(base + 1)
		for i := 0; i < b.N; i++ {
			if err := exec.Command("setpriv", "--reuid", uid, "--regid", uid, "--clear-groups", "/bin/true").Run(); err != nil {
				b.Fatal(err)
			}
		}
	})

	// interleaved takes one of each start in turn, so that a shared
	// machine's drift falls on all of them alike, and reports the median
	// of each and spawn-lane-full's and setpriv's ratio to exec.
	b.Run("interleaved", func(b *testing.B) {
		c := laneCommand(b, base, null)
		uid := strconv.Itoa(base + 1)
		_, noSetpriv := exec.LookPath("setpriv")
		var execT, fullT, setprivT []time.Duration
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			if err := exec.Command("/bin/true").Run(); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			ch, err := Start(c)
			if err != nil {
				b.Fatal(err)
			}
			if ws, _, err := ch.Wait(); err != nil || ws.ExitStatus() != 0 {
				b.Fatalf("%v %v", err, ws)
			}
			t2 := time.Now()
			execT, fullT = append(execT, t1.Sub(t0)), append(fullT, t2.Sub(t1))
			if noSetpriv == nil {
				if err := exec.Command("setpriv", "--reuid", uid, "--regid", uid, "--clear-groups", "/bin/true").Run(); err != nil {
					b.Fatal(err)
				}
				setprivT = append(setprivT, time.Since(t2))
			}
		}
		e, f := median(execT), median(fullT)
		b.ReportMetric(float64(e.Microseconds()), "exec-p50-µs")
		b.ReportMetric(float64(f.Microseconds()), "full-p50-µs")
		b.ReportMetric(float64(f)/float64(e), "full/exec")
		if len(setprivT) > 0 {
			b.ReportMetric(float64(median(setprivT))/float64(e), "setpriv/exec")
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

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// laneCommand is /bin/true with what a lane's command gets: its own user
// and group, rlimits, every online CPU, a rule set over the system's
// folders and a scratch folder, the lane's filter, and a cgroup in each
// writable v1 hierarchy (on v2, the group's directory).
func laneCommand(b testing.TB, base int, null *os.File) *Command {
	scratch, err := os.MkdirTemp("", "spawn-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(scratch) })
	os.Chown(scratch, base+1, base+1)
	dir, err := os.OpenFile(scratch, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { dir.Close() })
	var cache seccomp.Cache
	filter, err := cache.Get(seccomp.Options{Network: seccomp.NetworkAPI})
	if err != nil {
		b.Fatal(err)
	}
	var cpus []int
	for i := 0; i < runtime.NumCPU(); i++ {
		cpus = append(cpus, i)
	}
	c := &Command{
		Argv:  []string{"/bin/true"},
		Env:   []string{"PATH=/usr/bin:/bin", "HOME=" + scratch, "TMPDIR=" + scratch, "USER=bench", "LOGNAME=bench"},
		Stdin: null, Stdout: null, Stderr: null,
		Dir: dir,
		UID: base + 1, GID: base + 1, Groups: []int{base + 2},
		CPUs: cpus,
		Rlimits: []Rlimit{
			{Resource: unix.RLIMIT_CORE},
			{Resource: unix.RLIMIT_NOFILE, Cur: 4096, Max: 4096},
			{Resource: unix.RLIMIT_AS, Cur: 8 << 30, Max: 8 << 30},
			{Resource: unix.RLIMIT_FSIZE, Cur: 1 << 30, Max: 1 << 30},
			{Resource: unix.RLIMIT_CPU, Cur: 3600, Max: 3601},
			{Resource: unix.RLIMIT_NPROC, Cur: 512, Max: 512},
		},
		Seccomp: filter,
	}
	if ruleset, err := benchRuleset(scratch); err == nil {
		b.Cleanup(func() { ruleset.Close() })
		c.Landlock = ruleset
	} else {
		b.Logf("no Landlock rule set: %v", err)
	}
	name := fmt.Sprintf("thermite-spawn-bench-%d", os.Getpid())
	for _, h := range []string{"pids", "memory", "freezer", "cpuset"} {
		d := filepath.Join("/sys/fs/cgroup", h, name)
		if os.Mkdir(d, 0o755) != nil {
			continue
		}
		if h == "cpuset" {
			// A v1 cpuset group starts empty; it takes its parent's.
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup", h, f))
				os.WriteFile(filepath.Join(d, f), v, 0)
			}
		}
		f, err := os.OpenFile(filepath.Join(d, "cgroup.procs"), os.O_WRONLY, 0)
		if err != nil {
			os.Remove(d)
			continue
		}
		c.CgroupProcs = append(c.CgroupProcs, f)
		b.Cleanup(func() {
			f.Close()
			os.Remove(d)
		})
	}
	b.Logf("cgroup v1 hierarchies: %d", len(c.CgroupProcs))
	return c
}

// benchRuleset is a rule set like a lane's: every file system right
// handled, reading and executing the system's folders, writing scratch.
func benchRuleset(scratch string) (*os.File, error) {
	abi, err := llsys.LandlockGetABIVersion()
	if err != nil {
		return nil, err
	}
	all := uint64(1<<13 - 1) // ABI 1's rights
	if abi >= 2 {
		all |= llsys.AccessFSRefer
	}
	if abi >= 3 {
		all |= llsys.AccessFSTruncate
	}
	fd, err := llsys.LandlockCreateRuleset(&llsys.RulesetAttr{HandledAccessFS: all}, 0)
	if err != nil {
		return nil, err
	}
	read := uint64(llsys.AccessFSExecute | llsys.AccessFSReadFile | llsys.AccessFSReadDir)
	for d, access := range map[string]uint64{
		"/usr": read, "/bin": read, "/lib": read, "/lib64": read, "/etc": read, "/proc": read,
		"/dev/null": llsys.AccessFSReadFile | llsys.AccessFSWriteFile, scratch: all,
	} {
		pfd, err := unix.Open(d, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		if st, _ := os.Stat(d); st != nil && !st.IsDir() {
			access &= llsys.AccessFSReadFile | llsys.AccessFSWriteFile | llsys.AccessFSExecute | llsys.AccessFSTruncate
		}
		err = llsys.LandlockAddPathBeneathRule(fd, &llsys.PathBeneathAttr{AllowedAccess: access, ParentFd: pfd}, 0)
		unix.Close(pfd)
		if err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("rule for %s: %w", d, err)
		}
	}
	return os.NewFile(uintptr(fd), "ruleset"), nil
}

// BenchmarkStartSteps says where a lane's start goes beyond a bare exec,
// step by step: one start of each variant in turn, each adding one step of
// a lane's start to the last (the uid switch alone; then rlimits and
// affinity; then the Landlock rule set; then the seccomp filter; then the
// cgroups, the whole start), with os/exec of /bin/true beside them. It
// reports each variant's median and each step's cost as the difference of
// medians, in µs: what holds Run's ratio to an exec is the kernel's own
// cost of these steps (scripts/bench.sh prints them).
func BenchmarkStartSteps(b *testing.B) {
	testrig.RequireRoot(b)
	base := testrig.FreeUIDs(b)
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer null.Close()
	full := laneCommand(b, base, null)
	uidOnly := &Command{Argv: full.Argv, Env: full.Env, Stdin: null, Stdout: null, Stderr: null, Dir: full.Dir, UID: full.UID, GID: full.GID, Groups: full.Groups}
	limits := *uidOnly
	limits.Rlimits, limits.CPUs = full.Rlimits, full.CPUs
	landlocked := limits
	landlocked.Landlock = full.Landlock
	filtered := landlocked
	filtered.Seccomp = full.Seccomp
	steps := []struct {
		name string
		c    *Command
	}{{"uid", uidOnly}, {"rlimits-cpus", &limits}, {"landlock", &landlocked}, {"seccomp", &filtered}, {"cgroups", full}}
	times := make([][]time.Duration, len(steps)+1)
	for b.Loop() {
		t0 := time.Now()
		if err := exec.Command("/bin/true").Run(); err != nil {
			b.Fatal(err)
		}
		times[0] = append(times[0], time.Since(t0))
		for i, s := range steps {
			t := time.Now()
			ch, err := Start(s.c)
			if err != nil {
				b.Fatalf("%s: %v", s.name, err)
			}
			if ws, _, err := ch.Wait(); err != nil || ws.ExitStatus() != 0 {
				b.Fatalf("%s: %v %v", s.name, err, ws)
			}
			times[i+1] = append(times[i+1], time.Since(t))
		}
	}
	prev := median(times[0])
	b.ReportMetric(float64(prev.Microseconds()), "exec-µs")
	b.ReportMetric(float64(median(times[1])-prev)/1e3, "uid-vs-exec-µs")
	prev = median(times[1])
	for i, s := range steps[1:] {
		m := median(times[i+2])
		b.ReportMetric(float64(m-prev)/1e3, s.name+"-µs")
		prev = m
	}
	b.ReportMetric(float64(prev)/float64(median(times[0])), "full/exec")
}
