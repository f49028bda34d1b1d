package cgroup

import (
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"thermite/internal/cpuset"
)

// cgroup v2 where the broker's group is offered cpuset: it is enabled next
// to memory and pids, every group has it, and SetCPUs writes the group's
// cpuset.cpus (the kernel then moves its tasks).
func TestFakeV2CPUSet(t *testing.T) {
	f, self, mi := containerFake()
	f.offered = append(f.offered, "cpuset")
	f.files[filepath.Join(fakeMount, "cgroup.controllers")] = strings.Join(f.offered, " ")
	tr, err := detect(f.system(), fakeMount, "thermite", Required, self, mi)
	if err != nil {
		t.Fatal(err)
	}
	if !tr.HasCPUSet() || tr.CPUSetWhy() != "" {
		t.Fatalf("no cpuset: %s", tr.CPUSetWhy())
	}
	if got := f.get(t, "thermite/cgroup.subtree_control"); !strings.Contains(got, "cpuset") {
		t.Errorf("parent enables %q, want cpuset too", got)
	}
	g, err := tr.Create("lane-1", Limits{MemoryBytes: 1 << 20, Pids: 5})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.SetCPUs(cpuset.Set{0, 2}); err != nil {
		t.Fatal(err)
	}
	if got := f.get(t, "thermite/lane-1/cpuset.cpus"); got != "0,2" {
		t.Errorf("cpuset.cpus %q, want 0,2", got)
	}
	if err := g.SetCPUs(nil); err == nil || !strings.Contains(err.Error(), "no CPU to give it") {
		t.Errorf("empty set on v2: %v", err)
	}
	if s, err := g.CPUs(); err != nil || s.String() != "0-3" {
		t.Errorf("CPUs %v %v", s, err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
}

// cgroup v2 without cpuset offered: the tree works for memory and pids and
// says why it cannot hold CPUs; SetCPUs refuses with that reason.
func TestFakeV2NoCPUSet(t *testing.T) {
	f, self, mi := containerFake()
	tr, err := detect(f.system(), fakeMount, "thermite", Required, self, mi)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if tr.HasCPUSet() || !strings.Contains(tr.CPUSetWhy(), "offers no cpuset controller") {
		t.Fatalf("cpuset %v: %q", tr.HasCPUSet(), tr.CPUSetWhy())
	}
	g, err := tr.Create("lane-1", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.SetCPUs(cpuset.Set{1}); err == nil || !strings.Contains(err.Error(), "offers no cpuset controller") {
		t.Errorf("SetCPUs without cpuset: %v", err)
	}
}

// cgroup v1 with a cpuset hierarchy: the parent group and each group get
// their parent's cpuset.cpus and cpuset.mems before any task joins, Add
// places a task there too, and SetCPUs narrows the group.
func TestFakeV1CPUSet(t *testing.T) {
	f := &fakeV1{fakeV2: newFakeV2("/fake")}
	f.magic = map[string]int64{"/fake/cg": unix.TMPFS_MAGIC}
	for _, h := range []string{"memory", "pids", "cpuset"} {
		f.dirs["/fake/cg/"+h] = true
		f.magic["/fake/cg/"+h] = unix.CGROUP_SUPER_MAGIC
	}
	f.files["/fake/cg/cpuset/cpuset.cpus"] = "0-1\n"
	f.files["/fake/cg/cpuset/cpuset.mems"] = "0\n"
	f.dirs["/fake/cg"] = true
	mi := strings.Join([]string{
		"25 1 0:22 / /fake/cg rw - tmpfs tmpfs rw,mode=755",
		"26 25 0:23 / /fake/cg/memory rw - cgroup cgroup rw,memory",
		"27 25 0:24 / /fake/cg/pids rw - cgroup cgroup rw,pids",
		"28 25 0:25 / /fake/cg/cpuset rw - cgroup cgroup rw,cpuset",
	}, "\n")
	self := "3:cpuset:/\n2:pids:/\n1:memory:/\n"
	tr, err := detect(&system{fs: f, kill: f.system().kill}, "/fake/cg", "thermite", Required, self, mi)
	if err != nil {
		t.Fatal(err)
	}
	if !tr.HasCPUSet() {
		t.Fatalf("no cpuset: %s", tr.CPUSetWhy())
	}
	if f.files["/fake/cg/cpuset/thermite/cpuset.cpus"] != "0-1" || f.files["/fake/cg/cpuset/thermite/cpuset.mems"] != "0" {
		t.Errorf("parent cpuset: %q %q", f.files["/fake/cg/cpuset/thermite/cpuset.cpus"], f.files["/fake/cg/cpuset/thermite/cpuset.mems"])
	}
	g, err := tr.Create("lane-1", Limits{Pids: 3})
	if err != nil {
		t.Fatal(err)
	}
	if f.files["/fake/cg/cpuset/thermite/lane-1/cpuset.cpus"] != "0-1" || f.files["/fake/cg/cpuset/thermite/lane-1/cpuset.mems"] != "0" {
		t.Errorf("group cpuset not copied from its parent")
	}
	f.procs[42] = "/fake/cg/memory"
	f.writes = nil
	if err := g.Add(42); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(f.writes, " "), "cpuset/thermite/lane-1/cgroup.procs=42") {
		t.Errorf("Add did not place the task in its cpuset: %v", f.writes)
	}
	if err := g.SetCPUs(cpuset.Set{0}); err != nil {
		t.Fatal(err)
	}
	if f.files["/fake/cg/cpuset/thermite/lane-1/cpuset.cpus"] != "0" {
		t.Errorf("SetCPUs wrote %q", f.files["/fake/cg/cpuset/thermite/lane-1/cpuset.cpus"])
	}
	delete(f.procs, 42)
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
}
