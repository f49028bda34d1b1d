package cgroup

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// cgroup v2 where the broker's group is offered cpu: it is enabled next to
// memory and pids, each group gets its weight in cpu.weight, CPUWeight
// reads it back, and a weight out of the kernel's range is refused with
// nothing left behind.
func TestFakeV2CPUWeight(t *testing.T) {
	f, self, mi := containerFake()
	tr, err := detect(f.system(), fakeMount, "thermite", Required, self, mi)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if !tr.HasCPU() || tr.CPUWhy() != "" || tr.CPUWeightFile() != "cpu.weight" {
		t.Fatalf("cpu %v (%q), file %s", tr.HasCPU(), tr.CPUWhy(), tr.CPUWeightFile())
	}
	if got := f.get(t, "thermite/cgroup.subtree_control"); !contains(strings.Fields(got), "cpu") {
		t.Errorf("parent enables %q, want cpu too", got)
	}
	for name, w := range map[string]int64{"lane-1": 100, "controller.daemon": 3200} {
		g, err := tr.Create(name, Limits{Pids: 5, CPUWeight: w})
		if err != nil {
			t.Fatal(err)
		}
		if got := f.get(t, "thermite/"+name+"/cpu.weight"); got != strconv.FormatInt(w, 10) {
			t.Errorf("%s cpu.weight %q, want %d", name, got, w)
		}
		if got, file, err := g.CPUWeight(); err != nil || got != w || file != filepath.Join(fakeMount, "thermite", name, "cpu.weight") {
			t.Errorf("%s CPUWeight %d %s %v, want %d", name, got, file, err, w)
		}
	}
	// 0 leaves the kernel's default.
	g, err := tr.Create("planner", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if got, _, _ := g.CPUWeight(); got != WeightDefault {
		t.Errorf("a group with no weight has %d, want the default %d", got, WeightDefault)
	}
	for _, w := range []int64{-1, WeightMax + 1} {
		_, err := tr.Create("lane-2", Limits{CPUWeight: w})
		if err == nil || !strings.Contains(err.Error(), "out of range 1..10000") {
			t.Errorf("weight %d: %v", w, err)
		}
		if f.dirs[filepath.Join(fakeMount, "thermite", "lane-2")] {
			t.Errorf("weight %d refused, but its group is left", w)
		}
	}
}

// cgroup v2 where the broker's group is not offered cpu: the tree limits
// memory and tasks as before and says why it has no weights; a group asked
// for a weight is refused with that reason, never made without it.
func TestFakeV2NoCPUOffered(t *testing.T) {
	f := newFakeV2(fakeMount, "memory", "pids")
	tr, err := detect(f.system(), fakeMount, "thermite", Required, "0::/\n", "30 25 0:26 / "+fakeMount+" rw - cgroup2 cgroup2 rw\n")
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if tr.HasCPU() || !strings.Contains(tr.CPUWhy(), fakeMount+" offers no cpu controller") {
		t.Fatalf("cpu %v: %q", tr.HasCPU(), tr.CPUWhy())
	}
	_, err = tr.Create("lane-1", Limits{CPUWeight: 100})
	if err == nil || !strings.Contains(err.Error(), "a CPU weight, but "+fakeMount+" offers no cpu controller") {
		t.Errorf("a weight without cpu: %v", err)
	}
	if _, err := tr.Create("lane-1", Limits{Pids: 3}); err != nil {
		t.Errorf("a group with no weight: %v", err)
	}
}

// cgroup v2 whose kernel refuses to enable cpu (EINVAL: a realtime task in
// a group below): the tree is made with memory and pids alone, and CPUWhy
// names the refusal.
func TestFakeV2CPUEnableRefused(t *testing.T) {
	f, self, mi := containerFake()
	f.refuseEnable = map[string]error{"cpu": unix.EINVAL}
	tr, err := detect(f.system(), fakeMount, "thermite", Required, self, mi)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if tr.HasCPU() || !strings.Contains(tr.CPUWhy(), "the cpu controller could not be enabled") || !strings.Contains(tr.CPUWhy(), "invalid argument") {
		t.Fatalf("cpu %v: %q", tr.HasCPU(), tr.CPUWhy())
	}
	if got := f.get(t, "thermite/cgroup.subtree_control"); got != "memory pids" {
		t.Errorf("parent enables %q, want memory pids", got)
	}
	if strings.Contains(tr.String(), "cpu") {
		t.Errorf("the tree's line names cpu it lacks: %s", tr)
	}
}

// cgroup v1: a cpu hierarchy mounted read-only, or none, or one whose
// parent group cannot be made, leaves the tree without weights and says
// which; memory and pids are limited all the same.
func TestFakeV1CPUUnusable(t *testing.T) {
	for _, c := range []struct {
		name, cpuOpts, want string
		mkdirErr            error
	}{
		{name: "read-only", cpuOpts: "ro,nosuid", want: "/fake/cg/cpu: the cpu hierarchy is mounted read-only"},
		{name: "not mounted", want: "no cgroup v1 cpu hierarchy is mounted"},
		{name: "mkdir refused", cpuOpts: "rw", mkdirErr: unix.EACCES, want: "cpu hierarchy /fake/cg/cpu: cgroup: /fake/cg/cpu/thermite: mkdir: permission denied"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := &fakeV1{fakeV2: newFakeV2("/fake")}
			f.magic = map[string]int64{"/fake/cg": unix.TMPFS_MAGIC}
			lines := []string{"25 1 0:22 / /fake/cg rw - tmpfs tmpfs rw,mode=755"}
			hs := []string{"memory", "pids"}
			if c.cpuOpts != "" {
				hs = append(hs, "cpu")
			}
			for i, h := range hs {
				f.dirs["/fake/cg/"+h] = true
				f.magic["/fake/cg/"+h] = unix.CGROUP_SUPER_MAGIC
				opts := "rw"
				if h == "cpu" {
					opts = c.cpuOpts
				}
				lines = append(lines, strconv.Itoa(26+i)+" 25 0:"+strconv.Itoa(23+i)+" / /fake/cg/"+h+" "+opts+" - cgroup cgroup rw,"+h)
			}
			f.dirs["/fake/cg"] = true
			if c.mkdirErr != nil {
				f.mkdirErr = map[string]error{"/fake/cg/cpu/thermite": c.mkdirErr}
			}
			tr, err := detect(&system{fs: f, kill: f.system().kill}, "/fake/cg", "thermite", Required, "3:cpu:/\n2:pids:/\n1:memory:/\n", strings.Join(lines, "\n"))
			if err != nil {
				t.Fatal(err)
			}
			if tr.HasCPU() || tr.CPUWhy() != c.want {
				t.Errorf("cpu %v: %q, want %q", tr.HasCPU(), tr.CPUWhy(), c.want)
			}
			if len(tr.hier) != 2 || strings.Contains(tr.String(), "cpu") {
				t.Errorf("the tree keeps a hierarchy it cannot use: %s", tr)
			}
			if _, err := tr.Create("lane-1", Limits{MemoryBytes: 1 << 20, Pids: 3}); err != nil {
				t.Errorf("memory and pids without cpu: %v", err)
			}
			if err := tr.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A weight turns into v1's cpu.shares as the kernel turns a v2 cpu.weight
// into its own weight, and back to the same weight, for every weight; the
// shares stay within v1's bounds.
func TestSharesOfEveryWeight(t *testing.T) {
	for w := int64(WeightMin); w <= WeightMax; w++ {
		s := SharesOf(w)
		if s < sharesMin || s > sharesMax {
			t.Fatalf("weight %d: shares %d out of %d..%d", w, s, sharesMin, sharesMax)
		}
		if back := weightOfShares(s); back != w {
			t.Fatalf("weight %d: shares %d read back as %d", w, s, back)
		}
	}
	if SharesOf(WeightDefault) != 1024 {
		t.Errorf("the default weight is %d shares, want the kernel's 1024", SharesOf(WeightDefault))
	}
}

// On the host's own tree, as root: a group's weight is in the kernel's
// file (cpu.shares on v1, cpu.weight on v2), and a process placed in the
// group is in its cpu group, where its session's autogroup no longer
// weighs it.
func TestCPUWeightHost(t *testing.T) {
	tr := hostTree(t)
	if !tr.HasCPU() {
		t.Skipf("this machine's tree has no cpu controller: %s", tr.CPUWhy())
	}
	g := create(t, tr, "weighted", Limits{Pids: 10, CPUWeight: 3200})
	d := g.ctl["cpu"]
	want := "3200"
	if tr.Version == 1 {
		want = "32768"
	}
	if got := readFile(t, filepath.Join(d, tr.CPUWeightFile())); got != want {
		t.Errorf("%s/%s = %s, want %s", d, tr.CPUWeightFile(), got, want)
	}
	if w, _, err := g.CPUWeight(); err != nil || w != 3200 {
		t.Errorf("CPUWeight %d %v", w, err)
	}
	h := newHelper(t, "idle")
	h.start(g)
	own := parseSelfCgroup(readFile(t, "/proc/"+strconv.Itoa(h.cmd.Process.Pid)+"/cgroup"))
	ctl := "cpu"
	if tr.Version == 2 {
		ctl = ""
	}
	if path, ok := selfPath(own, ctl); !ok || filepath.Join(tr.ctl["cpu"].mount, path) != d {
		t.Errorf("the helper's cpu group is %q, want %s", path, d)
	}
	h.release()
	if l := h.line(5 * time.Second); l != "ready" {
		t.Errorf("the helper says %q, want ready", l)
	}
}
