package cgroup

// The cgroup v2 code paths on a machine that has only v1: a small fake
// kernel stands in for cgroupfs (files and folders in memory) and enforces
// the v2 rules the layout depends on: the no-internal-processes rule for
// cgroup.subtree_control and for moving a process, controllers offered to a
// child only when its parent enables them, cgroup.kill, cgroup.freeze, rmdir
// refused while a group has processes or children. It is checked by the
// real v2 core tests (TestV2CoreOnUnified) only as far as a controller-less
// hierarchy goes; memory and pids on real v2 are not exercised here.

import (
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

type fakeV2 struct {
	mu      sync.Mutex
	mount   string            // the mount point
	exempt  string            // the real root (exempt from the no-internal-processes rule); "" for a container's namespace root
	dirs    map[string]bool   // group folders
	files   map[string]string // stored values
	procs   map[int]string    // pid to its group folder
	ro      bool
	noSwap  bool // no memory.swap.max (swap accounting off)
	noKill  bool // no cgroup.kill (before Linux 5.14)
	writes  []string
	killed  []int
	offered []string // controllers the mount's top offers
	// refuseEnable is the error a write of +controller to any
	// cgroup.subtree_control gets (cpu: EINVAL with a realtime task below).
	refuseEnable map[string]error
}

func newFakeV2(mount string, offered ...string) *fakeV2 {
	f := &fakeV2{mount: mount, exempt: mount, dirs: map[string]bool{}, files: map[string]string{}, procs: map[int]string{}, offered: offered}
	f.dirs[mount] = true
	f.files[filepath.Join(mount, "cgroup.controllers")] = strings.Join(offered, " ")
	f.files[filepath.Join(mount, "cgroup.subtree_control")] = ""
	return f
}

func (f *fakeV2) system() *system {
	return &system{fs: f, kill: func(pid int) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, ok := f.procs[pid]; !ok {
			return unix.ESRCH
		}
		delete(f.procs, pid)
		f.killed = append(f.killed, pid)
		return nil
	}}
}

// mkdirAll makes a chain of groups as a kernel would, each enabling
// ctrls for its children.
func (f *fakeV2) mkdirAll(dir string, ctrls ...string) {
	rel, _ := filepath.Rel(f.mount, dir)
	cur := f.mount
	for _, part := range strings.Split(rel, "/") {
		f.files[filepath.Join(cur, "cgroup.subtree_control")] = strings.Join(ctrls, " ")
		cur = filepath.Join(cur, part)
		if err := f.mkdir(cur); err != nil && err != unix.EEXIST {
			panic(err)
		}
	}
}

func (f *fakeV2) lockedEnabled(dir string) []string {
	return strings.Fields(f.files[filepath.Join(dir, "cgroup.subtree_control")])
}

func (f *fakeV2) mkdir(p string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ro {
		return unix.EROFS
	}
	if f.dirs[p] {
		return unix.EEXIST
	}
	parent := filepath.Dir(p)
	if !f.dirs[parent] {
		return unix.ENOENT
	}
	f.dirs[p] = true
	ctrls := f.lockedEnabled(parent)
	set := func(name, v string) { f.files[filepath.Join(p, name)] = v }
	set("cgroup.controllers", strings.Join(ctrls, " "))
	set("cgroup.subtree_control", "")
	set("cgroup.freeze", "0")
	if !f.noKill {
		set("cgroup.kill", "")
	}
	for _, c := range ctrls {
		switch c {
		case "memory":
			set("memory.max", "max")
			set("memory.current", "0")
			set("memory.peak", "0")
			set("memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n")
			set("memory.oom.group", "0")
			if !f.noSwap {
				set("memory.swap.max", "max")
			}
		case "pids":
			set("pids.max", "max")
			set("pids.peak", "0")
			set("pids.events", "max 0\n")
		case "cpuset":
			set("cpuset.cpus", "")
			set("cpuset.cpus.effective", "0-3")
		case "cpu":
			set("cpu.weight", "100")
		}
	}
	return nil
}

func (f *fakeV2) rmdir(p string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ro {
		return unix.EROFS
	}
	if !f.dirs[p] {
		return unix.ENOENT
	}
	for d := range f.dirs {
		if filepath.Dir(d) == p {
			return unix.EBUSY
		}
	}
	for _, d := range f.procs {
		if d == p {
			return unix.EBUSY
		}
	}
	delete(f.dirs, p)
	for k := range f.files {
		if filepath.Dir(k) == p {
			delete(f.files, k)
		}
	}
	return nil
}

func (f *fakeV2) hasProcs(dir string) bool {
	for _, d := range f.procs {
		if d == dir {
			return true
		}
	}
	return false
}

func (f *fakeV2) write(p, data string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ro {
		return unix.EROFS
	}
	dir, name := filepath.Dir(p), filepath.Base(p)
	if !f.dirs[dir] {
		return unix.ENOENT
	}
	f.writes = append(f.writes, strings.TrimPrefix(p, f.mount+"/")+"="+data)
	switch name {
	case "cgroup.procs":
		pid, err := strconv.Atoi(strings.TrimSpace(data))
		if err != nil {
			return unix.EINVAL
		}
		if _, ok := f.procs[pid]; !ok {
			return unix.ESRCH
		}
		if dir != f.exempt && len(f.lockedEnabled(dir)) > 0 {
			return unix.EBUSY // no internal processes
		}
		f.procs[pid] = dir
		return nil
	case "cgroup.subtree_control":
		cur := f.lockedEnabled(dir)
		offered := strings.Fields(f.files[filepath.Join(dir, "cgroup.controllers")])
		for _, tok := range strings.Fields(data) {
			c := tok[1:]
			switch tok[0] {
			case '+':
				if !contains(offered, c) {
					return unix.ENOENT
				}
				if err := f.refuseEnable[c]; err != nil {
					return err
				}
				if dir != f.exempt && f.hasProcs(dir) {
					return unix.EBUSY // no internal processes
				}
				if !contains(cur, c) {
					cur = append(cur, c)
				}
			case '-':
				var out []string
				for _, x := range cur {
					if x != c {
						out = append(out, x)
					}
				}
				cur = out
			default:
				return unix.EINVAL
			}
		}
		f.files[p] = strings.Join(cur, " ")
		return nil
	case "cgroup.kill":
		if _, ok := f.files[p]; !ok {
			return unix.ENOENT
		}
		for pid, d := range f.procs {
			if d == dir || strings.HasPrefix(d, dir+"/") {
				delete(f.procs, pid)
				f.killed = append(f.killed, pid)
			}
		}
		return nil
	}
	if _, ok := f.files[p]; !ok {
		return unix.ENOENT
	}
	switch name {
	case "memory.max", "memory.swap.max", "pids.max":
		if v := strings.TrimSpace(data); v != "max" {
			if _, err := strconv.ParseInt(v, 10, 64); err != nil {
				return unix.EINVAL
			}
		}
	case "cpu.weight", "cpu.shares":
		n, err := strconv.ParseInt(strings.TrimSpace(data), 10, 64)
		lo, hi := int64(WeightMin), int64(WeightMax)
		if name == "cpu.shares" {
			lo, hi = sharesMin, sharesMax
		}
		if err != nil || n < lo || n > hi {
			return unix.EINVAL
		}
	case "memory.oom.group", "cgroup.freeze":
		if v := strings.TrimSpace(data); v != "0" && v != "1" {
			return unix.EINVAL
		}
	}
	f.files[p] = data
	return nil
}

func (f *fakeV2) read(p string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	dir, name := filepath.Dir(p), filepath.Base(p)
	if f.dirs[dir] {
		switch name {
		case "cgroup.procs":
			var pids []int
			for pid, d := range f.procs {
				if d == dir {
					pids = append(pids, pid)
				}
			}
			sort.Ints(pids)
			var b strings.Builder
			for _, pid := range pids {
				fmt.Fprintf(&b, "%d\n", pid)
			}
			return []byte(b.String()), nil
		case "cgroup.events":
			frozen := strings.TrimSpace(f.files[filepath.Join(dir, "cgroup.freeze")])
			pop := 0
			if f.hasProcs(dir) {
				pop = 1
			}
			return []byte(fmt.Sprintf("populated %d\nfrozen %s\n", pop, frozen)), nil
		case "pids.current":
			if _, ok := f.files[filepath.Join(dir, "pids.max")]; ok {
				n := 0
				for _, d := range f.procs {
					if d == dir {
						n++
					}
				}
				return []byte(fmt.Sprintf("%d\n", n)), nil
			}
		}
	}
	v, ok := f.files[p]
	if !ok {
		return nil, unix.ENOENT
	}
	return []byte(v), nil
}

func (f *fakeV2) exists(p string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dirs[p] {
		return true
	}
	if _, ok := f.files[p]; ok {
		return true
	}
	name := filepath.Base(p)
	return f.dirs[filepath.Dir(p)] && (name == "cgroup.procs" || name == "cgroup.events" || name == "pids.current" && f.files[filepath.Join(filepath.Dir(p), "pids.max")] != "")
}

func (f *fakeV2) subdirs(p string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.dirs[p] {
		return nil, unix.ENOENT
	}
	var out []string
	for d := range f.dirs {
		if filepath.Dir(d) == p && d != p {
			out = append(out, filepath.Base(d))
		}
	}
	sort.Strings(out)
	return out, nil
}

func (f *fakeV2) statfs(p string) (int64, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.dirs[p] {
		return 0, false, unix.ENOENT
	}
	return unix.CGROUP2_SUPER_MAGIC, f.ro, nil
}

func (f *fakeV2) get(t *testing.T, rel string) string {
	t.Helper()
	b, err := f.read(filepath.Join(f.mount, rel))
	if err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	return strings.TrimSpace(string(b))
}

const fakeMount = "/fake/cgroup"

// A container: its cgroup namespace root is the mount's top, which is not
// the real root, so the no-internal-processes rule applies to it; the
// broker (100) and the container's init (1) are in it.
func containerFake() (*fakeV2, string, string) {
	f := newFakeV2(fakeMount, "cpu", "io", "memory", "pids")
	f.exempt = ""
	f.procs[1] = fakeMount
	f.procs[100] = fakeMount
	mi := "30 25 0:26 / " + fakeMount + " rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate\n"
	return f, "0::/\n", mi
}

func TestFakeV2ContainerLeafLayout(t *testing.T) {
	f, self, mi := containerFake()
	tr, err := detect(f.system(), fakeMount, "thermite", Required, self, mi)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Version != 2 {
		t.Fatalf("Version %d", tr.Version)
	}
	t.Logf("%s", tr)
	leaf := filepath.Join(fakeMount, "thermite.init")
	if tr.leaf != leaf || f.procs[1] != leaf || f.procs[100] != leaf {
		t.Errorf("leaf %q; processes %v: want both moved to %s", tr.leaf, f.procs, leaf)
	}
	if got := f.get(t, "cgroup.subtree_control"); got != "memory pids cpu" {
		t.Errorf("top subtree_control %q", got)
	}
	if got := f.get(t, "thermite/cgroup.subtree_control"); got != "memory pids cpu" {
		t.Errorf("parent subtree_control %q", got)
	}
	if !tr.SwapAccounted() || len(tr.Notes) != 0 {
		t.Errorf("swap %v notes %v", tr.SwapAccounted(), tr.Notes)
	}

	g, err := tr.Create("trial-1", Limits{MemoryBytes: 64 << 20, Pids: 20, OOMGroup: true})
	if err != nil {
		t.Fatal(err)
	}
	for rel, want := range map[string]string{
		"thermite/trial-1/memory.max":       "67108864",
		"thermite/trial-1/memory.swap.max":  "0",
		"thermite/trial-1/pids.max":         "20",
		"thermite/trial-1/memory.oom.group": "1",
	} {
		if got := f.get(t, rel); got != want {
			t.Errorf("%s = %q, want %q", rel, got, want)
		}
	}
	if g.Path() != filepath.Join(fakeMount, "thermite/trial-1") {
		t.Errorf("Path %s", g.Path())
	}

	// Counters, in the kernel's formats.
	f.procs[200] = g.Path()
	f.procs[201] = g.Path()
	f.files[g.Path()+"/memory.current"] = "1234\n"
	f.files[g.Path()+"/memory.peak"] = "67100000\n"
	f.files[g.Path()+"/memory.events"] = "low 0\nhigh 0\nmax 17\noom 2\noom_kill 1\noom_group_kill 1\n"
	f.files[g.Path()+"/pids.peak"] = "20\n"
	f.files[g.Path()+"/pids.events"] = "max 3\n"
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	want := Stats{MemoryCurrent: 1234, MemoryPeak: 67100000, MemoryMaxHits: 17, OOMEvents: 2, OOMKills: 1, PidsCurrent: 2, PidsPeak: 20, PidsMaxHits: 3}
	if st != want {
		t.Errorf("Stats %+v, want %+v", st, want)
	}
	if oom, err := g.OOMKilled(); err != nil || !oom {
		t.Errorf("OOMKilled %v %v", oom, err)
	}

	// Kill by cgroup.kill.
	if err := g.Kill(); err != nil {
		t.Fatal(err)
	}
	if p, _ := g.Procs(); len(p) != 0 || !contains(f.writes, "thermite/trial-1/cgroup.kill=1") {
		t.Errorf("after Kill: procs %v, writes %v", p, f.writes)
	}

	// A second group whose processes outlive Close: Close kills and removes it.
	g2, err := tr.Create("trial-2", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	f.procs[300] = g2.Path()
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.procs[300]; ok {
		t.Errorf("Close left process 300")
	}
	if f.dirs[filepath.Join(fakeMount, "thermite")] || f.dirs[g.Path()] || f.dirs[g2.Path()] {
		t.Errorf("Close left folders: %v", f.dirs)
	}
	if !f.dirs[leaf] || f.procs[100] != leaf {
		t.Errorf("the leaf with the broker in it should stay")
	}

	// The broker starts again, now in the leaf: it uses the top again,
	// with no leaf inside the leaf.
	tr2, err := detect(f.system(), fakeMount, "thermite", Required, "0::/thermite.init\n", mi)
	if err != nil {
		t.Fatal(err)
	}
	if tr2.leaf != "" || tr2.Path() != filepath.Join(fakeMount, "thermite") {
		t.Errorf("second start: leaf %q path %s", tr2.leaf, tr2.Path())
	}
	if err := tr2.Close(); err != nil {
		t.Fatal(err)
	}
}

// On the real root (exempt from the rule), nothing moves.
func TestFakeV2HostRoot(t *testing.T) {
	f := newFakeV2(fakeMount, "memory", "pids")
	f.procs[1] = fakeMount
	tr, err := detect(f.system(), fakeMount, "thermite", Required, "0::/\n", "")
	if err != nil {
		t.Fatal(err)
	}
	if tr.leaf != "" || f.procs[1] != fakeMount {
		t.Errorf("leaf %q, init moved to %s", tr.leaf, f.procs[1])
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
}

// A systemd unit with Delegate=yes: the parent group goes under the unit's
// group, found through /proc/self/cgroup.
func TestFakeV2DelegatedUnit(t *testing.T) {
	f := newFakeV2(fakeMount, "memory", "pids", "cpu")
	unit := filepath.Join(fakeMount, "system.slice/thermite.service")
	f.mkdirAll(unit, "memory", "pids")
	f.procs[100] = unit
	mi := "30 25 0:26 / " + fakeMount + " rw - cgroup2 cgroup2 rw\n"
	tr, err := detect(f.system(), fakeMount, "thermite", Required, "0::/system.slice/thermite.service\n", mi)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Path() != unit+"/thermite" || f.procs[100] != unit+"/thermite.init" {
		t.Errorf("path %s; broker in %s", tr.Path(), f.procs[100])
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
}

// Kill where cgroup.kill is missing (before 5.14): freeze, signal, thaw.
func TestFakeV2KillByFreeze(t *testing.T) {
	f, self, mi := containerFake()
	f.noKill = true
	tr, err := detect(f.system(), fakeMount, "thermite", Required, self, mi)
	if err != nil {
		t.Fatal(err)
	}
	g, err := tr.Create("t", Limits{Pids: 5})
	if err != nil {
		t.Fatal(err)
	}
	f.procs[500] = g.Path()
	f.procs[501] = g.Path()
	if err := g.Kill(); err != nil {
		t.Fatal(err)
	}
	sort.Ints(f.killed)
	if fmt.Sprint(f.killed) != "[500 501]" {
		t.Errorf("killed %v", f.killed)
	}
	var freezes []string
	for _, w := range f.writes {
		if strings.HasSuffix(strings.SplitN(w, "=", 2)[0], "cgroup.freeze") {
			freezes = append(freezes, strings.SplitN(w, "=", 2)[1])
		}
	}
	if fmt.Sprint(freezes) != "[1 0]" {
		t.Errorf("cgroup.freeze writes %v, want [1 0]", freezes)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestFakeV2Refusals(t *testing.T) {
	t.Run("read-only", func(t *testing.T) {
		f, self, mi := containerFake()
		f.ro = true
		_, err := detect(f.system(), fakeMount, "thermite", Required, self, mi)
		if err == nil || !strings.Contains(err.Error(), "cgroup v2 is mounted read-only") {
			t.Errorf("%v", err)
		}
	})
	t.Run("read-only mount option", func(t *testing.T) {
		f, self, _ := containerFake()
		mi := "30 25 0:26 / " + fakeMount + " ro,nosuid - cgroup2 cgroup2 rw\n"
		_, err := detect(f.system(), fakeMount, "thermite", Required, self, mi)
		if err == nil || !strings.Contains(err.Error(), "read-only") {
			t.Errorf("%v", err)
		}
	})
	t.Run("no pids", func(t *testing.T) {
		f := newFakeV2(fakeMount, "cpu", "memory")
		_, err := detect(f.system(), fakeMount, "thermite", Required, "0::/\n", "")
		if err == nil || !strings.Contains(err.Error(), "no pids controller") {
			t.Errorf("%v", err)
		}
		t.Logf("%v", err)
	})
	t.Run("swap not accounted", func(t *testing.T) {
		f, self, mi := containerFake()
		f.noSwap = true
		tr, err := detect(f.system(), fakeMount, "thermite", Required, self, mi)
		if err != nil {
			t.Fatal(err)
		}
		if tr.SwapAccounted() || !strings.Contains(strings.Join(tr.Notes, ";"), "swap is not accounted") {
			t.Errorf("swap %v notes %v", tr.SwapAccounted(), tr.Notes)
		}
		g, err := tr.Create("t", Limits{MemoryBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if len(g.Notes) == 0 {
			t.Errorf("no note on the group")
		}
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("bad values", func(t *testing.T) {
		f, self, mi := containerFake()
		tr, err := detect(f.system(), fakeMount, "thermite", Required, self, mi)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"", "..", "a/b", ".hidden", "cgroup.procs", "x y"} {
			if _, err := tr.Create(n, Limits{}); err == nil {
				t.Errorf("Create(%q) worked", n)
			}
		}
		if _, err := tr.Create("neg", Limits{Pids: -1}); err == nil {
			t.Errorf("a negative limit was taken")
		}
		if !f.dirs[tr.Path()] || len(f.dirs) != 3 {
			t.Errorf("folders %v", f.dirs)
		}
		if _, err := tr.Create("fd", Limits{}); err != nil {
			t.Fatal(err)
		}
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("create fails half way", func(t *testing.T) {
		f, self, mi := containerFake()
		tr, err := detect(f.system(), fakeMount, "thermite", Required, self, mi)
		if err != nil {
			t.Fatal(err)
		}
		// Memory no longer offered to new groups: pids.max is written,
		// memory.max is not there. The group goes again, and the error
		// names the file and the value.
		f.files[filepath.Join(tr.Path(), "cgroup.subtree_control")] = "pids"
		_, err = tr.Create("half", Limits{Pids: 5, MemoryBytes: 1 << 20})
		want := "cgroup: " + fakeMount + "/thermite/half/memory.max: write 1048576: no such file or directory"
		if err == nil || err.Error() != want {
			t.Errorf("%v\nwant %s", err, want)
		}
		if f.dirs[filepath.Join(tr.Path(), "half")] {
			t.Errorf("the half-made group is left")
		}
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// The error names the file and the value, in the form the broker logs.
func TestFileErrorText(t *testing.T) {
	err := error(&FileError{Op: "write", Path: "/sys/fs/cgroup/memory/thermite/x/memory.limit_in_bytes", Data: "100000", Err: unix.EBUSY})
	want := "cgroup: /sys/fs/cgroup/memory/thermite/x/memory.limit_in_bytes: write 100000: device or resource busy"
	if err.Error() != want {
		t.Errorf("%q\nwant %q", err.Error(), want)
	}
	if !errors.Is(err, unix.EBUSY) {
		t.Errorf("errors.Is EBUSY is false")
	}
	f, self, mi := containerFake()
	tr, err := detect(f.system(), fakeMount, "thermite", Required, self, mi)
	if err != nil {
		t.Fatal(err)
	}
	f.ro = true
	_, err = tr.Create("x", Limits{})
	if want := "cgroup: " + fakeMount + "/thermite/x: mkdir: read-only file system"; err == nil || err.Error() != want {
		t.Errorf("%v\nwant %s", err, want)
	}
}

// A v1 machine with swap accounting off and no freezer hierarchy, from
// mountinfo alone: the notes say what is missing and Create sets
// memory.swappiness 0 instead of memsw.
func TestFakeV1Notes(t *testing.T) {
	f := &fakeV1{fakeV2: newFakeV2("/fake")}
	f.magic = map[string]int64{"/fake/cg": unix.TMPFS_MAGIC}
	for _, h := range []string{"memory", "pids", "cpu x"} {
		f.dirs["/fake/cg/"+h] = true
		f.files["/fake/cg/"+h+"/cgroup.procs"] = ""
		f.magic["/fake/cg/"+h] = unix.CGROUP_SUPER_MAGIC
	}
	f.dirs["/fake/cg"] = true
	f.dirs["/fake/cg/memory/user"] = true
	mi := strings.Join([]string{
		"25 1 0:22 / /fake/cg rw - tmpfs tmpfs rw,mode=755",
		"26 25 0:23 / /fake/cg/memory rw,nosuid - cgroup cgroup rw,memory",
		"27 25 0:24 / /fake/cg/pids rw,nosuid - cgroup cgroup rw,pids",
		"28 25 0:25 / /fake/cg/cpu\\040x rw,nosuid - cgroup cgroup rw,cpu,cpuacct",
	}, "\n")
	self := "3:cpu,cpuacct:/\n2:pids:/\n1:memory:/user\n"
	tr, err := detect(&system{fs: f, kill: f.system().kill}, "/fake/cg", "thermite", Required, self, mi)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", tr)
	if tr.Version != 1 || tr.ctl["memory"].dir != "/fake/cg/memory/user/thermite" || tr.ctl["pids"].dir != "/fake/cg/pids/thermite" {
		t.Fatalf("%s", tr)
	}
	notes := strings.Join(tr.Notes, ";")
	if !strings.Contains(notes, "no freezer hierarchy") || !strings.Contains(notes, "swap is not accounted") {
		t.Errorf("notes %q", notes)
	}
	g, err := tr.Create("t", Limits{MemoryBytes: 1 << 20, Pids: 7, CPUWeight: 3200})
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(f.writes, " ")
	for _, w := range []string{"memory/user/thermite/t/memory.limit_in_bytes=1048576", "memory/user/thermite/t/memory.swappiness=0", "memory/user/thermite/t/memory.oom_control=0", "pids/thermite/t/pids.max=7", "cpu x/thermite/t/cpu.shares=32768"} {
		if !strings.Contains(got, w) {
			t.Errorf("no write %s in %s", w, got)
		}
	}
	if _, err := g.FD(); err != ErrNoFD {
		t.Errorf("FD on v1: %v", err)
	}
	// Add writes the pid to every hierarchy.
	f.procs[42] = "/fake/cg/memory"
	f.writes = nil
	if err := g.Add(42); err != nil {
		t.Fatal(err)
	}
	if len(f.writes) != 3 {
		t.Errorf("Add wrote %v, want the memory, pids and cpu hierarchies' cgroup.procs", f.writes)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}

	// A hierarchy missing: the error lists what is mounted.
	mi2 := strings.Replace(mi, "rw,pids", "rw,blkio", 1)
	_, err = detect(&system{fs: f, kill: f.system().kill}, "/fake/cg", "thermite", Required, self, mi2)
	if err == nil || !strings.Contains(err.Error(), "has no pids hierarchy") {
		t.Errorf("%v", err)
	}
	t.Logf("%v", err)
}

// fakeV1 is the fake with v1 files: groups get the v1 memory and pids
// files, and statfs answers per mount.
type fakeV1 struct {
	*fakeV2
	magic map[string]int64
	// mkdirErr is the error a mkdir of the path gets.
	mkdirErr map[string]error
}

func (f *fakeV1) mkdir(p string) error {
	if err := f.mkdirErr[p]; err != nil {
		return err
	}
	if err := f.fakeV2.mkdir(p); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	set := func(name, v string) { f.files[filepath.Join(p, name)] = v }
	if strings.Contains(p, "/memory/") {
		set("memory.limit_in_bytes", "9223372036854771712")
		set("memory.usage_in_bytes", "0")
		set("memory.max_usage_in_bytes", "0")
		set("memory.failcnt", "0")
		set("memory.swappiness", "60")
		set("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
	}
	if strings.Contains(p, "/cpuset/") {
		set("cpuset.cpus", "")
		set("cpuset.mems", "")
	}
	if strings.Contains(p, "/cpu/") || strings.Contains(p, "/cpu x/") {
		set("cpu.shares", "1024")
	}
	if strings.Contains(p, "/pids/") {
		set("pids.max", "max")
		set("pids.events", "max 0\n")
	}
	return nil
}

func (f *fakeV1) statfs(p string) (int64, bool, error) {
	m, ok := f.magic[p]
	if !ok {
		return 0, false, unix.ENOENT
	}
	return m, false, nil
}

func TestParse(t *testing.T) {
	mi := parseMountinfo(`36 35 98:0 /docker/abc /sys/fs/cgroup/my\040mem rw,noatime master:1 shared:2 - cgroup cgroup rw,memory,release_agent=/x
40 35 0:30 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw,nsdelegate
bad line`)
	if len(mi) != 2 {
		t.Fatalf("%+v", mi)
	}
	m := mi[0]
	if m.root != "/docker/abc" || m.point != "/sys/fs/cgroup/my mem" || m.fstype != "cgroup" || fmt.Sprint(m.v1Controllers()) != "[memory]" || m.readOnly() {
		t.Errorf("%+v %v", m, m.v1Controllers())
	}
	if !mi[1].readOnly() {
		t.Errorf("ro not seen")
	}
	for _, c := range []struct{ self, want string }{
		{"/docker/abc", "/sys/fs/cgroup/my mem"},
		{"/docker/abc/x", "/sys/fs/cgroup/my mem/x"},
		{"/docker/abcd", ""},
		{"/", ""},
	} {
		got, ok := ownDir(m, c.self)
		if (c.want == "") == ok || ok && got != c.want {
			t.Errorf("ownDir(%s) = %s %v, want %q", c.self, got, ok, c.want)
		}
	}
	lines := parseSelfCgroup("12:pids:/a\n4:cpu,cpuacct:/b\n1:name=systemd:/c\n0::/d\n")
	for ctl, want := range map[string]string{"pids": "/a", "cpuacct": "/b", "name=systemd": "/c", "": "/d"} {
		if got, ok := selfPath(lines, ctl); !ok || got != want {
			t.Errorf("selfPath(%q) = %q %v", ctl, got, ok)
		}
	}
	if _, ok := selfPath(lines, "memory"); ok {
		t.Errorf("memory found")
	}
	if v, err := parseValue("max\n"); err != nil || v != -1 {
		t.Errorf("max: %d %v", v, err)
	}
	if _, err := parseValue("12x"); err == nil {
		t.Errorf("12x parsed")
	}
	if p, err := parsePids("3\n1\n"); err != nil || fmt.Sprint(p) != "[3 1]" {
		t.Errorf("%v %v", p, err)
	}
	if _, err := parsePids("3\n-1\n"); err == nil {
		t.Errorf("-1 parsed")
	}
	k := keyed("oom 1\noom_kill 2\nbad\n")
	if k["oom"] != 1 || k["oom_kill"] != 2 || len(k) != 2 {
		t.Errorf("%v", k)
	}
}
