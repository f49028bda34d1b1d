// Package cgroup gives each trial (or command) its own cgroup: a memory
// limit with no swap and a pids limit that cover every process the trial's
// commands start, an OOM kill that ends only that group's processes and is
// reported, and a race-free kill of the whole group. It works on cgroup v2
// (the unified tree most containers have) and on cgroup v1 (per-controller
// hierarchies, as on the rig's VMs). Where no writable tree exists, Detect
// says exactly why, so the broker can report "no writable cgroup tree: <why>"
// and keep rlimits as the floor.
//
// The broker holds CAP_DAC_OVERRIDE but not CAP_SYS_ADMIN: everything here
// is plain mkdir, rmdir, and writes to root-owned cgroup files, which file
// permissions allow; moving a process (v1 cgroup.procs) needs the writer's
// euid to be root or the process's uid, which the broker's is.
//
// # Layout, cgroup v1
//
// One group per needed hierarchy, each made under the broker's own group in
// that hierarchy (from /proc/self/cgroup, mapped through the mount's root as
// /proc/self/mountinfo gives it), or at the hierarchy's top when the own group
// is not visible:
//
//	<memory mount>/<own memory path>/<parent>/<trial>    memory.limit_in_bytes, memory.memsw.limit_in_bytes, memory.oom_control
//	<pids mount>/<own pids path>/<parent>/<trial>        pids.max
//	<freezer mount>/<own freezer path>/<parent>/<trial>  freezer.state (for Kill; optional)
//
// v1 has no "no internal processes" rule, so nothing else moves. Where a
// cpuset hierarchy is mounted, each group has one there too (optional:
// CPUSetWhy says why not): the parent group and every group get cpuset.cpus
// and cpuset.mems copied from their parent before a task may join, and
// SetCPUs narrows a group, moving its tasks off CPUs it loses. Where a cpu
// hierarchy is mounted and writable, each group has one there too
// (optional: CPUWhy says why not), with its Limits.CPUWeight as cpu.shares.
// A task in a cpu group other than the hierarchy's root is weighed by its
// group's weight, no longer by its session's autogroup.
// v1 has no CLONE_INTO_CGROUP, so spawn.Start's child writes itself into
// each hierarchy's cgroup.procs (ProcsFiles, opened by the broker) while
// still root, before it execs the command.
//
// # Layout, cgroup v2
//
// The rule that shapes v2: a non-root group that has processes cannot enable
// controllers for its children. The broker's own group C (a container's
// root in its cgroup namespace, or a systemd unit with Delegate=yes) holds
// the broker, so:
//
//	C/                       cgroup.subtree_control += memory pids (cpuset cpu)
//	C/<parent>.init/         leaf: every process that was in C, the broker too
//	C/<parent>/              the broker's parent group; subtree_control += memory pids (cpuset cpu)
//	C/<parent>/<trial>/      one trial: memory.max, memory.swap.max 0, pids.max, cpu.weight
//
// cpuset and cpu are enabled where C is offered them (optional: CPUSetWhy
// and CPUWhy say why not); a kernel that refuses to enable cpu (a realtime
// task in a group below) leaves the tree without it, saying why.
//
// Detect first tries to enable memory and pids in C as it is (that works
// when C is the real root, which is exempt, or already empty); only when the
// kernel refuses with EBUSY does it make the <parent>.init leaf and move C's
// processes there (what docker-in-docker and systemd do), then enable. The
// leaf then is a sibling of the parent group. A broker that starts again in
// the same container finds itself in C/<parent>.init and uses C again.
// Close removes C/<parent> but leaves the leaf: the broker is in it, and a
// group with a live process cannot be removed.
//
// Role processes are started inside their group: on v2 by clone3 with
// CLONE_INTO_CGROUP (FD, for spawn.Command's CgroupDir), on v1 by the
// child's own write to ProcsFiles before it execs. They are never moved in
// after they ran.
package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Required are the controllers a Tree must have: memory and pids.
var Required = []string{"memory", "pids"}

// leafSuffix names the v2 leaf group the processes of the broker's own group
// are moved to: C/<parent>.init.
const leafSuffix = ".init"

// killTimeout bounds Kill: processes that do not go in this long (stuck in
// the kernel, uninterruptible) are named in its error.
const killTimeout = 10 * time.Second

// ErrNoFD is FD's answer on cgroup v1, which has no CLONE_INTO_CGROUP: use
// ProcsFiles (the child writes itself in) or Add instead.
var ErrNoFD = errors.New("cgroup: cgroup v1 has no CLONE_INTO_CGROUP; place the process with Add before it execs")

// Tree is the writable cgroup hierarchy the broker manages its groups under.
type Tree struct {
	Version int    // 1 or 2
	Parent  string // the broker's parent group's name
	// Notes says what this tree cannot do that a full one could (swap not
	// accounted, no freezer), one short sentence each, for thermite status.
	Notes []string

	sys  *system
	hier []*hier          // v1: one per hierarchy used (memory, pids, freezer, cpuset, cpu); v2: one
	ctl  map[string]*hier // controller name to its hierarchy
	swap bool             // v1 memory.memsw.*, v2 memory.swap.max exist
	leaf string           // v2: the leaf C's processes were moved to, "" if none
	// cpusetWhy says why the tree has no cpuset controller ("" when it has).
	cpusetWhy string
	// cpuWhy says why the tree has no cpu controller ("" when it has).
	cpuWhy string
	mu     sync.Mutex
	closed bool
	live   map[string]*Group // the groups Create made and Remove has not removed
}

// hier is one hierarchy the tree uses (v2: the only one).
type hier struct {
	controllers []string // the needed controllers it carries
	mount       string   // its mount point
	base        string   // the broker's own group in it (or the mount point)
	dir         string   // base/<parent>: the broker's parent group
}

// Limits are one group's limits; 0 is unlimited.
type Limits struct {
	MemoryBytes int64 // memory, with no swap on top
	Pids        int64 // tasks (threads count) the group may hold at once
	// OOMGroup makes an OOM kill end every process of the group together
	// (v2 memory.oom.group). v1 has no such switch: its OOM killer ends one
	// process at a time, and a Note on the group says so.
	OOMGroup bool
	// CPUWeight is the group's share of the CPU against its siblings, on
	// cgroup v2's scale (cpu.weight, WeightMin..WeightMax), written as
	// cpu.shares (SharesOf) on v1; 0 leaves the kernel's default. It needs
	// the cpu controller (HasCPU).
	CPUWeight int64
}

// Stats are a group's counters. A value the kernel does not keep here is
// -1.
type Stats struct {
	MemoryCurrent int64 // bytes charged now (v2 memory.current, v1 memory.usage_in_bytes)
	MemoryPeak    int64 // most bytes charged since creation (v2 memory.peak, v1 memory.max_usage_in_bytes)
	MemoryMaxHits int64 // times a charge hit the limit (v2 memory.events max, v1 memory.failcnt + memory.memsw.failcnt)
	OOMEvents     int64 // times the group's OOM killer was invoked (v2 memory.events oom; v1 keeps no count)
	OOMKills      int64 // processes the OOM killer ended (v2 memory.events oom_kill, v1 memory.oom_control oom_kill)
	PidsCurrent   int64 // tasks now (pids.current)
	PidsPeak      int64 // most tasks at once (pids.peak)
	PidsMaxHits   int64 // forks refused at the limit (pids.events max)
}

// Detect finds a writable tree under root ("/sys/fs/cgroup") and makes the
// broker's parent group, named parent, under the broker's own cgroup (read
// from /proc/self/cgroup), or at the top where that is not visible. A parent
// group left by an earlier broker of the same name is adopted and emptied:
// its child groups are killed and removed. When no tree is writable the
// error says exactly why (not a cgroup filesystem, read-only mount, memory
// or pids controller missing, a mkdir refused), so the broker can say "no
// writable cgroup tree: <why>" and keep rlimits as the floor.
func Detect(root, parent string) (*Tree, error) {
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	return detect(hostSystem(), root, parent, Required, string(self), string(mi))
}

func detect(sys *system, root, parent string, need []string, selfCg, mountinfo string) (*Tree, error) {
	if err := checkName(parent); err != nil {
		return nil, err
	}
	root = filepath.Clean(root)
	magic, ro, err := sys.fs.statfs(root)
	if err != nil {
		return nil, &FileError{Op: "statfs", Path: root, Err: err}
	}
	mounts := parseMountinfo(mountinfo)
	self := parseSelfCgroup(selfCg)
	switch magic {
	case unix.CGROUP2_SUPER_MAGIC:
		m := mount{root: "/", point: root, fstype: "cgroup2"}
		for _, mm := range mounts {
			if mm.point == root && mm.fstype == "cgroup2" {
				m = mm // the last one: mounts over earlier ones
			}
		}
		return detectV2(sys, m, ro, self, parent, need)
	case unix.CGROUP_SUPER_MAGIC:
		return nil, fmt.Errorf("cgroup: %s is one cgroup v1 hierarchy, not the folder the hierarchies are mounted in (/sys/fs/cgroup)", root)
	}
	var v1 []mount
	var unified *mount
	var names []string
	for i, m := range mounts {
		if !strings.HasPrefix(m.point, root+"/") {
			continue
		}
		switch m.fstype {
		case "cgroup":
			v1 = append(v1, m)
			names = append(names, strings.Join(m.v1Controllers(), ","))
		case "cgroup2":
			unified = &mounts[i]
		}
	}
	if len(v1) == 0 && unified == nil {
		return nil, fmt.Errorf("cgroup: %s is not a cgroup filesystem (filesystem type %#x) and no cgroup hierarchy is mounted under it", root, magic)
	}
	byCtl := map[string]mount{}
	for _, m := range v1 {
		for _, c := range m.v1Controllers() {
			if _, dup := byCtl[c]; !dup {
				byCtl[c] = m
			}
		}
	}
	var missing []string
	for _, c := range need {
		if _, ok := byCtl[c]; !ok {
			missing = append(missing, c)
		}
	}
	if len(v1) > 0 && len(missing) == 0 {
		return detectV1(sys, byCtl, self, parent, need)
	}
	why := fmt.Sprintf("cgroup: cgroup v1 at %s has no %s hierarchy (mounted: %s)", root, strings.Join(missing, " or "), strings.Join(names, " "))
	if len(v1) == 0 {
		why = fmt.Sprintf("cgroup: no cgroup v1 hierarchy is mounted under %s", root)
	}
	if unified != nil {
		// Hybrid: the unified hierarchy may carry what v1 lacks.
		_, uro, err := sys.fs.statfs(unified.point)
		if err != nil {
			return nil, fmt.Errorf("%s; %w", why, &FileError{Op: "statfs", Path: unified.point, Err: err})
		}
		t, err := detectV2(sys, *unified, uro, self, parent, need)
		if err != nil {
			return nil, fmt.Errorf("%s; %w", why, err)
		}
		return t, nil
	}
	return nil, errors.New(why)
}

func detectV1(sys *system, byCtl map[string]mount, self []selfCgroup, parent string, need []string) (*Tree, error) {
	t := &Tree{Version: 1, Parent: parent, sys: sys, ctl: map[string]*hier{}}
	seen := map[string]*hier{}
	for _, c := range append(append([]string(nil), need...), "freezer", "cpuset", "cpu") {
		m, ok := byCtl[c]
		if !ok {
			switch c {
			case "freezer":
				t.Notes = append(t.Notes, "no freezer hierarchy: Kill signals the group's processes in rounds, which a fast fork loop can outrun until its pids limit stops it")
			case "cpuset":
				t.cpusetWhy = "no cgroup v1 cpuset hierarchy is mounted"
			case "cpu":
				t.cpuWhy = "no cgroup v1 cpu hierarchy is mounted"
			}
			continue
		}
		h := seen[m.point]
		if h == nil {
			_, ro, err := sys.fs.statfs(m.point)
			if c == "cpu" && (err != nil || ro || m.readOnly()) {
				// CPU weights are fairness, not access: the tree
				// goes on without them and says why.
				t.cpuWhy = fmt.Sprintf("%s: the cpu hierarchy is mounted read-only", m.point)
				if err != nil {
					t.cpuWhy = (&FileError{Op: "statfs", Path: m.point, Err: err}).Error()
				}
				continue
			}
			if err != nil {
				return nil, &FileError{Op: "statfs", Path: m.point, Err: err}
			}
			if ro || m.readOnly() {
				return nil, fmt.Errorf("cgroup: %s: the %s hierarchy is mounted read-only", m.point, c)
			}
			base := m.point
			if p, ok := selfPath(self, c); ok {
				if d, ok := ownDir(m, p); ok && sys.fs.exists(d) {
					base = d
				} else {
					t.Notes = append(t.Notes, fmt.Sprintf("own %s group %s is not visible under %s: groups made at its top", c, p, m.point))
				}
			}
			h = &hier{mount: m.point, base: base, dir: filepath.Join(base, parent)}
			seen[m.point] = h
			t.hier = append(t.hier, h)
		}
		h.controllers = append(h.controllers, c)
		t.ctl[c] = h
	}
	var cpuOnly *hier
	for i, h := range t.hier {
		if len(h.controllers) == 1 && h.controllers[0] == "cpu" {
			cpuOnly = h // made below: it may fail alone
			continue
		}
		if err := t.makeParent(h); err != nil {
			for _, done := range t.hier[:i] {
				_ = sys.rmdir(done.dir)
			}
			return nil, err
		}
	}
	if cpuOnly != nil {
		if err := t.makeParent(cpuOnly); err != nil {
			t.cpuWhy = fmt.Sprintf("cpu hierarchy %s: %v", cpuOnly.mount, err)
			t.dropController(cpuOnly, "cpu")
		}
	}
	if cs := t.ctl["cpuset"]; cs != nil {
		if err := t.initCPUSetV1(cs); err != nil {
			t.dropCPUSet(cs, err)
		}
	}
	if mem := t.ctl["memory"]; mem != nil {
		t.swap = sys.fs.exists(filepath.Join(mem.dir, "memory.memsw.limit_in_bytes"))
		if !t.swap {
			t.Notes = append(t.Notes, "swap is not accounted (no memory.memsw.limit_in_bytes: swapaccount off): the memory limit covers RAM only; memory.swappiness 0 is set instead")
		}
	}
	if err := t.sweep(); err != nil {
		return nil, err
	}
	return t, nil
}

func detectV2(sys *system, m mount, ro bool, self []selfCgroup, parent string, need []string) (*Tree, error) {
	if ro || m.readOnly() {
		return nil, fmt.Errorf("cgroup: %s: cgroup v2 is mounted read-only", m.point)
	}
	t := &Tree{Version: 2, Parent: parent, sys: sys, ctl: map[string]*hier{}}
	base := m.point
	if p, ok := selfPath(self, ""); ok {
		if d, ok := ownDir(m, p); ok && sys.fs.exists(d) {
			base = d
		} else {
			t.Notes = append(t.Notes, fmt.Sprintf("own group %s is not visible under %s: groups made at its top", p, m.point))
		}
	}
	// A broker started again in the same container is in the leaf an
	// earlier one made: its group is the leaf's parent.
	if filepath.Base(base) == parent+leafSuffix && base != m.point {
		base = filepath.Dir(base)
	}
	if len(need) > 0 {
		avail, err := sys.read(filepath.Join(base, "cgroup.controllers"))
		if err != nil {
			return nil, err
		}
		have := strings.Fields(avail)
		var missing []string
		for _, c := range need {
			if !contains(have, c) {
				missing = append(missing, c)
			}
		}
		if len(missing) > 0 {
			return nil, fmt.Errorf("cgroup: %s has no %s controller (cgroup.controllers: %q): it is not delegated to this group", base, strings.Join(missing, " or "), strings.TrimSpace(avail))
		}
	}
	// cpuset is optional: enabled where the group is offered it, so judge
	// CPUs can be held in the kernel; without it timed runs are refused.
	if avail, err := sys.read(filepath.Join(base, "cgroup.controllers")); err == nil && contains(strings.Fields(avail), "cpuset") && len(need) > 0 {
		need = append(append([]string(nil), need...), "cpuset")
	} else {
		t.cpusetWhy = fmt.Sprintf("%s offers no cpuset controller (cgroup.controllers)", base)
	}
	// cpu is optional too: its weights keep the rig's own work ahead of
	// the lanes', but a tree without it still limits memory and tasks.
	if avail, err := sys.read(filepath.Join(base, "cgroup.controllers")); err == nil && contains(strings.Fields(avail), "cpu") && len(need) > 0 {
		need = append(append([]string(nil), need...), "cpu")
	} else {
		t.cpuWhy = fmt.Sprintf("%s offers no cpu controller (cgroup.controllers)", base)
	}
	h := &hier{controllers: need, mount: m.point, base: base, dir: filepath.Join(base, parent)}
	t.hier = []*hier{h}
	for _, c := range need {
		t.ctl[c] = h
	}
	if err := t.enableV2(h, base); err != nil {
		if !errors.Is(err, unix.EBUSY) {
			return nil, err
		}
		// The no-internal-processes rule: base has processes. Move
		// them all into a leaf, then enable.
		leaf := filepath.Join(base, parent+leafSuffix)
		if err := sys.mkdir(leaf); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("%w (making a leaf for the processes of %s, which has processes and so cannot enable controllers for its children)", err, base)
		}
		if err := t.moveAll(base, leaf); err != nil {
			return nil, err
		}
		if err := t.enableV2(h, base); err != nil {
			return nil, err
		}
		t.leaf = leaf
	}
	if err := t.makeParent(h); err != nil {
		return nil, err
	}
	if err := t.enableV2(h, h.dir); err != nil {
		_ = sys.rmdir(h.dir)
		return nil, err
	}
	if contains(need, "memory") {
		t.swap = sys.fs.exists(filepath.Join(h.dir, "memory.swap.max"))
		if !t.swap {
			t.Notes = append(t.Notes, "swap is not accounted (no memory.swap.max): the memory limit covers RAM only")
		}
	}
	if err := t.sweep(); err != nil {
		return nil, err
	}
	return t, nil
}

// enableV2 enables the v2 tree's controllers in dir's
// cgroup.subtree_control. Where the kernel refuses the lot for a reason
// other than EBUSY (the caller's to handle) and cpu is among them, it tries
// again without cpu, which the tree then goes without, saying why: the
// kernel refuses cpu, for one, where a realtime task is in a group below.
func (t *Tree) enableV2(h *hier, dir string) error {
	err := t.enable(dir, h.controllers)
	if err == nil || errors.Is(err, unix.EBUSY) || !contains(h.controllers, "cpu") {
		return err
	}
	var rest []string
	for _, c := range h.controllers {
		if c != "cpu" {
			rest = append(rest, c)
		}
	}
	if err2 := t.enable(dir, rest); err2 != nil {
		return err2
	}
	t.cpuWhy = fmt.Sprintf("the cpu controller could not be enabled: %v", err)
	t.dropController(h, "cpu")
	return nil
}

// enable makes sure dir's cgroup.subtree_control has every controller of
// need, writing only those missing ("+memory +pids").
func (t *Tree) enable(dir string, need []string) error {
	if len(need) == 0 {
		return nil
	}
	p := filepath.Join(dir, "cgroup.subtree_control")
	cur, err := t.sys.read(p)
	if err != nil {
		return err
	}
	var add []string
	for _, c := range need {
		if !contains(strings.Fields(cur), c) {
			add = append(add, "+"+c)
		}
	}
	if len(add) == 0 {
		return nil
	}
	return t.sys.write(p, strings.Join(add, " "))
}

// moveAll moves every process of from into to (v2), until from is empty:
// processes may fork while they are moved.
func (t *Tree) moveAll(from, to string) error {
	src := filepath.Join(from, "cgroup.procs")
	dst := filepath.Join(to, "cgroup.procs")
	for round := 0; round < 100; round++ {
		s, err := t.sys.read(src)
		if err != nil {
			return err
		}
		pids, err := parsePids(s)
		if err != nil {
			return fmt.Errorf("cgroup: %s: %w", src, err)
		}
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			if err := t.sys.write(dst, strconv.Itoa(pid)); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("%w (moving the processes of %s to a leaf, since a group with processes cannot enable controllers for its children)", err, from)
			}
		}
	}
	return fmt.Errorf("cgroup: %s: processes keep appearing; could not empty it into %s", from, to)
}

// makeParent makes the broker's parent group in h, or adopts one an earlier
// broker left.
func (t *Tree) makeParent(h *hier) error {
	if err := t.sys.mkdir(h.dir); err != nil {
		if errors.Is(err, unix.EEXIST) {
			t.Notes = append(t.Notes, fmt.Sprintf("adopted %s left by an earlier broker", h.dir))
			return nil
		}
		return err
	}
	return nil
}

// sweep kills and removes the child groups an earlier broker of the same
// parent name left.
func (t *Tree) sweep() error {
	names, err := t.children()
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range names {
		t.mu.Lock()
		g := t.live[n]
		t.mu.Unlock()
		if g == nil {
			g = t.group(n)
		}
		if err := g.Remove(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// children lists the child groups of the parent group, in every hierarchy.
func (t *Tree) children() ([]string, error) {
	set := map[string]bool{}
	for _, h := range t.hier {
		names, err := t.sys.fs.subdirs(h.dir)
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return nil, &FileError{Op: "read", Path: h.dir, Err: err}
		}
		for _, n := range names {
			set[n] = true
		}
	}
	var out []string
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

// Path is the broker's parent group: in v1, the one in the memory
// hierarchy.
func (t *Tree) Path() string {
	if h := t.ctl["memory"]; h != nil {
		return h.dir
	}
	return t.hier[0].dir
}

// String describes the tree in one line, for thermite status and the
// self-test.
func (t *Tree) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cgroup v%d:", t.Version)
	for _, h := range t.hier {
		if t.Version == 1 {
			fmt.Fprintf(&b, " %s %s", strings.Join(h.controllers, ","), h.dir)
		} else {
			fmt.Fprintf(&b, " %s (%s)", h.dir, strings.Join(h.controllers, " "))
		}
	}
	if t.leaf != "" {
		fmt.Fprintf(&b, "; the broker's group's processes moved to %s", t.leaf)
	}
	for _, n := range t.Notes {
		b.WriteString("; ")
		b.WriteString(n)
	}
	return b.String()
}

// SwapAccounted reports whether the memory limit covers swap too (no swap
// at all for a group's processes); when false, a Note says so.
func (t *Tree) SwapAccounted() bool { return t.swap }

// Create makes one group under the broker's parent group with the limits l.
// Everything it made is removed again when a step fails.
func (t *Tree) Create(name string, l Limits) (*Group, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if l.MemoryBytes < 0 || l.Pids < 0 {
		return nil, fmt.Errorf("cgroup: group %s: negative limit (memory %d, pids %d)", name, l.MemoryBytes, l.Pids)
	}
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("cgroup: group %s: the tree %s is closed", name, t.Path())
	}
	g := t.group(name)
	t.mu.Lock()
	_, dup := t.live[name]
	t.mu.Unlock()
	if dup {
		return nil, &FileError{Op: "mkdir", Path: g.Path(), Err: unix.EEXIST}
	}
	var made []string
	for _, d := range g.dirs {
		if err := t.sys.mkdir(d); err != nil {
			for i := len(made) - 1; i >= 0; i-- {
				_ = t.sys.rmdir(made[i])
			}
			return nil, err
		}
		made = append(made, d)
	}
	if err := g.setup(l); err != nil {
		if rerr := g.Remove(); rerr != nil {
			return nil, errors.Join(err, rerr)
		}
		return nil, err
	}
	t.mu.Lock()
	if t.live == nil {
		t.live = map[string]*Group{}
	}
	t.live[name] = g
	t.mu.Unlock()
	return g, nil
}

// group is the Group named name under the parent group, made or not.
func (t *Tree) group(name string) *Group {
	g := &Group{Name: name, tree: t, fd: -1, oomFD: -1, ctl: map[string]string{}}
	for _, h := range t.hier {
		d := filepath.Join(h.dir, name)
		g.dirs = append(g.dirs, d)
		for _, c := range h.controllers {
			g.ctl[c] = d
		}
		if t.Version == 2 {
			g.ctl["freezer"] = d // cgroup.freeze is a core file
		}
	}
	if h := t.ctl["freezer"]; h != nil {
		g.ctl["freezer"] = filepath.Join(h.dir, name)
	}
	return g
}

// Close removes the broker's parent group, after killing and removing every
// group still in it. On v2 the leaf holding the broker stays (see the
// package comment).
func (t *Tree) Close() error {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	if err := t.sweep(); err != nil {
		return err
	}
	var errs []error
	for i := len(t.hier) - 1; i >= 0; i-- {
		if err := rmdirRetry(t.sys, t.hier[i].dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Group is one trial's (or one command's) cgroup.
type Group struct {
	Name string
	// Notes says what this group's limits cannot do here (swap not
	// accounted, no memory.oom.group on v1).
	Notes []string

	tree    *Tree
	dirs    []string          // every directory of the group (v2: one)
	ctl     map[string]string // controller (and "freezer") to its directory
	oomBase int64             // the OOM kill count at creation; -1 unknown
	mu      sync.Mutex
	fd      int
	// procs are the v1 cgroup.procs files, opened once for writing, and
	// oomFD the OOM counter's file, opened once for reading: every command
	// of the role uses both, and cgroupfs's path lookup is the dear part.
	// Remove closes them.
	procs   []*os.File
	oomFD   int
	removed bool
	// noKillFile makes Kill take the freeze path even where cgroup.kill
	// exists (tests).
	noKillFile bool
}

func (g *Group) setup(l Limits) error {
	t := g.tree
	mem, hasMem := g.ctl["memory"]
	if !hasMem && l.MemoryBytes > 0 {
		return fmt.Errorf("cgroup: group %s: a memory limit, but the tree has no memory controller", g.Name)
	}
	if pids, ok := g.ctl["pids"]; ok && l.Pids > 0 {
		if err := t.sys.write(filepath.Join(pids, "pids.max"), strconv.FormatInt(l.Pids, 10)); err != nil {
			return err
		}
	} else if !ok && l.Pids > 0 {
		return fmt.Errorf("cgroup: group %s: a pids limit, but the tree has no pids controller", g.Name)
	}
	if l.CPUWeight != 0 {
		if err := g.setCPUWeight(l.CPUWeight); err != nil {
			return err
		}
	}
	if cs, ok := g.ctl["cpuset"]; ok && t.Version == 1 {
		if err := t.initCPUSetGroupV1(cs); err != nil {
			return err
		}
	}
	g.oomBase = -1
	if !hasMem {
		return nil
	}
	v := strconv.FormatInt(l.MemoryBytes, 10)
	switch t.Version {
	case 1:
		if l.MemoryBytes > 0 {
			// memsw must stay >= the RAM limit: RAM first, then
			// RAM+swap at the same value, so no swap on top.
			if err := t.sys.write(filepath.Join(mem, "memory.limit_in_bytes"), v); err != nil {
				return err
			}
			if t.swap {
				if err := t.sys.write(filepath.Join(mem, "memory.memsw.limit_in_bytes"), v); err != nil {
					return err
				}
			} else {
				if err := t.sys.write(filepath.Join(mem, "memory.swappiness"), "0"); err != nil {
					return err
				}
				g.Notes = append(g.Notes, "swap not accounted: the memory limit covers RAM only (memory.swappiness 0)")
			}
		}
		// The OOM killer acts within the group (oom_kill_disable 0),
		// rather than leaving its tasks hung at the limit.
		if err := t.sys.write(filepath.Join(mem, "memory.oom_control"), "0"); err != nil {
			return err
		}
		if l.OOMGroup {
			g.Notes = append(g.Notes, "cgroup v1 has no memory.oom.group: the OOM killer ends one process at a time")
		}
	case 2:
		if l.MemoryBytes > 0 {
			if err := t.sys.write(filepath.Join(mem, "memory.max"), v); err != nil {
				return err
			}
		}
		if t.swap {
			if err := t.sys.write(filepath.Join(mem, "memory.swap.max"), "0"); err != nil {
				return err
			}
		} else {
			g.Notes = append(g.Notes, "swap not accounted: the memory limit covers RAM only")
		}
		if l.OOMGroup {
			if err := t.sys.write(filepath.Join(mem, "memory.oom.group"), "1"); err != nil {
				return err
			}
		}
	}
	st, err := g.stats()
	if err != nil {
		return err
	}
	g.oomBase = st.OOMKills
	return nil
}

// Path is the group's directory: on v1, the one in the memory hierarchy.
func (g *Group) Path() string {
	if d, ok := g.ctl["memory"]; ok {
		return d
	}
	return g.dirs[0]
}

// Paths are the group's directories, one per hierarchy (v2: one).
func (g *Group) Paths() []string { return append([]string(nil), g.dirs...) }

// FD returns an O_DIRECTORY descriptor of the group for clone3's
// CLONE_INTO_CGROUP (spawn.Command's CgroupDir, or syscall.SysProcAttr's
// CgroupFD):
// the child starts inside the group. v2 only (ErrNoFD on v1). The group owns
// the descriptor and closes it in Remove; callers must not close it.
func (g *Group) FD() (int, error) {
	if g.tree.Version != 2 {
		return -1, ErrNoFD
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.removed {
		return -1, fmt.Errorf("cgroup: %s: removed", g.dirs[0])
	}
	if g.fd >= 0 {
		return g.fd, nil
	}
	fd, err := unix.Open(g.dirs[0], unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &FileError{Op: "open", Path: g.dirs[0], Err: err}
	}
	g.fd = fd
	return fd, nil
}

// ProcsFiles returns the group's cgroup.procs files open for writing (v1:
// one per hierarchy), for a child that writes itself in before its exec.
// The group opens them once and hands out duplicates, which the caller
// closes: a Remove while a child still uses them closes nothing of its.
// The kernel checks a write against the credentials the file was opened
// with, here always the broker's.
func (g *Group) ProcsFiles() ([]*os.File, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.removed {
		return nil, fmt.Errorf("cgroup: %s: removed", g.dirs[0])
	}
	if g.procs == nil {
		var fs []*os.File
		for _, d := range g.dirs {
			p := filepath.Join(d, "cgroup.procs")
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				closeFiles(fs)
				return nil, &FileError{Op: "open", Path: p, Err: err}
			}
			fs = append(fs, f)
		}
		g.procs = fs
	}
	out := make([]*os.File, 0, len(g.procs))
	for _, f := range g.procs {
		fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			closeFiles(out)
			return nil, &FileError{Op: "open", Path: f.Name(), Err: err}
		}
		out = append(out, os.NewFile(uintptr(fd), f.Name()))
	}
	return out, nil
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// readHeld reads a cgroup file of the group through a descriptor opened
// once: a read at offset 0 of a cgroupfs (seq_file) file makes its text
// anew. Where the package stands a fake kernel in (tests), a plain read.
func (g *Group) readHeld(p string) (string, error) {
	if _, real := g.tree.sys.fs.(osFS); !real {
		return g.tree.sys.read(p)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.removed {
		return "", &FileError{Op: "read", Path: p, Err: unix.ENOENT}
	}
	if g.oomFD < 0 {
		fd, err := retryEINTR(func() (int, error) { return unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0) })
		if err != nil {
			return "", &FileError{Op: "open", Path: p, Err: err}
		}
		g.oomFD = fd
	}
	var buf [512]byte
	n, err := retryEINTR(func() (int, error) { return unix.Pread(g.oomFD, buf[:], 0) })
	if err != nil {
		return "", &FileError{Op: "read", Path: p, Err: err}
	}
	return string(buf[:n]), nil
}

// closeHeldLocked closes the descriptors the group keeps (g.mu held).
func (g *Group) closeHeldLocked() {
	closeFiles(g.procs)
	g.procs = nil
	if g.oomFD >= 0 {
		unix.Close(g.oomFD)
		g.oomFD = -1
	}
}

// Add puts the process pid (all its threads) in the group, in every
// hierarchy: writes it to each cgroup.procs. It is for a process that has
// not yet run what it is placed for (the tests' helpers wait on stdin; the
// broker's commands place themselves through ProcsFiles instead); on an
// error the caller must kill it, which may be in some hierarchies and not
// others.
func (g *Group) Add(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("cgroup: group %s: bad pid %d", g.Name, pid)
	}
	for _, d := range g.dirs {
		if err := g.tree.sys.write(filepath.Join(d, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			return err
		}
	}
	return nil
}

// Stats reads the group's counters.
func (g *Group) Stats() (Stats, error) { return g.stats() }

func (g *Group) stats() (Stats, error) {
	s := Stats{-1, -1, -1, -1, -1, -1, -1, -1}
	t := g.tree
	var errs []error
	// one reads a single-value file; a file that is not there leaves -1.
	one := func(dst *int64, p string) {
		v, err := t.sys.read(p)
		if err != nil {
			if !errors.Is(err, unix.ENOENT) {
				errs = append(errs, err)
			}
			return
		}
		n, err := parseValue(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("cgroup: %s: %w", p, err))
			return
		}
		*dst = n
	}
	// keys reads a flat keyed file; a file that is not there is nil.
	keys := func(p string) map[string]int64 {
		v, err := t.sys.read(p)
		if err != nil {
			if !errors.Is(err, unix.ENOENT) {
				errs = append(errs, err)
			}
			return nil
		}
		return keyed(v)
	}
	set := func(dst *int64, m map[string]int64, k string) {
		if v, ok := m[k]; ok {
			*dst = v
		}
	}
	if mem, ok := g.ctl["memory"]; ok {
		if t.Version == 1 {
			one(&s.MemoryCurrent, filepath.Join(mem, "memory.usage_in_bytes"))
			one(&s.MemoryPeak, filepath.Join(mem, "memory.max_usage_in_bytes"))
			// A charge is tried against RAM+swap first, then RAM:
			// each refusal counts in one of the two failcnts.
			one(&s.MemoryMaxHits, filepath.Join(mem, "memory.failcnt"))
			if t.swap && s.MemoryMaxHits >= 0 {
				var sw int64 = -1
				one(&sw, filepath.Join(mem, "memory.memsw.failcnt"))
				if sw > 0 {
					s.MemoryMaxHits += sw
				}
			}
			oc := keys(filepath.Join(mem, "memory.oom_control"))
			set(&s.OOMKills, oc, "oom_kill")
		} else {
			one(&s.MemoryCurrent, filepath.Join(mem, "memory.current"))
			one(&s.MemoryPeak, filepath.Join(mem, "memory.peak"))
			ev := keys(filepath.Join(mem, "memory.events"))
			set(&s.MemoryMaxHits, ev, "max")
			set(&s.OOMEvents, ev, "oom")
			set(&s.OOMKills, ev, "oom_kill")
		}
	}
	if pids, ok := g.ctl["pids"]; ok {
		one(&s.PidsCurrent, filepath.Join(pids, "pids.current"))
		one(&s.PidsPeak, filepath.Join(pids, "pids.peak"))
		set(&s.PidsMaxHits, keys(filepath.Join(pids, "pids.events")), "max")
	}
	return s, errors.Join(errs...)
}

// OOMKilled reports whether the kernel's OOM killer ended a process of this
// group since it was made. It is an error where the kernel does not count
// OOM kills per group (v1 before Linux 4.13), or the tree has no memory
// controller.
func (g *Group) OOMKilled() (bool, error) {
	st, err := g.stats()
	if err != nil {
		return false, err
	}
	if st.OOMKills < 0 || g.oomBase < 0 {
		return false, fmt.Errorf("cgroup: %s: the kernel keeps no OOM kill count for this group", g.Path())
	}
	return st.OOMKills > g.oomBase, nil
}

// Procs lists the processes in the group (in any of its hierarchies).
func (g *Group) Procs() ([]int, error) {
	var out []int
	for _, d := range g.dirs {
		p := filepath.Join(d, "cgroup.procs")
		s, err := g.tree.sys.read(p)
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return nil, err
		}
		pids, err := parsePids(s)
		if err != nil {
			return nil, fmt.Errorf("cgroup: %s: %w", p, err)
		}
		out = append(out, pids...)
	}
	return sortedUnique(out), nil
}

// Kill ends every process in the group and returns when none is left (or
// names those still there after killTimeout). On v2 with cgroup.kill it
// writes 1 there: the kernel kills the group, forks in flight included.
// Otherwise it freezes the group (v2 cgroup.freeze, v1 freezer.state),
// sends SIGKILL to every pid in cgroup.procs, thaws, and repeats until
// cgroup.procs is empty: frozen tasks cannot fork, and a task with SIGKILL
// pending cannot either, so each round leaves no new process behind. The
// group stays usable.
func (g *Group) Kill() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.kill()
}

func (g *Group) kill() error {
	t := g.tree
	deadline := time.Now().Add(killTimeout)
	if t.Version == 2 && !g.noKillFile {
		p := filepath.Join(g.dirs[0], "cgroup.kill")
		if t.sys.fs.exists(p) {
			if err := t.sys.write(p, "1"); err != nil {
				return err
			}
			return g.waitEmpty(deadline)
		}
	}
	for {
		pids, err := g.Procs()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		frozen, err := g.freeze(true)
		if err != nil {
			return err
		}
		if frozen {
			// Waiting for the freeze to take is bounded: a task in an
			// uninterruptible sleep may hold it in FREEZING; kill
			// what is listed anyway and go round again.
			_, _ = pollUntil(time.Now().Add(time.Second), g.isFrozen)
		}
		if pids, err = g.Procs(); err != nil {
			return err
		}
		for _, pid := range pids {
			if err := t.sys.kill(pid); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("cgroup: %s: kill %d: %w", g.Path(), pid, err)
			}
		}
		if frozen {
			if _, err := g.freeze(false); err != nil {
				return err
			}
		}
		empty, err := pollUntil(time.Now().Add(100*time.Millisecond), g.empty)
		if err != nil || empty {
			return err
		}
		if time.Now().After(deadline) {
			left, _ := g.Procs()
			return fmt.Errorf("cgroup: %s: processes still there after %v: %v", g.Path(), killTimeout, left)
		}
	}
}

// freeze freezes (on) or thaws the group; false when it has no freezer.
func (g *Group) freeze(on bool) (bool, error) {
	t := g.tree
	d, ok := g.ctl["freezer"]
	if !ok {
		return false, nil
	}
	if t.Version == 2 {
		p := filepath.Join(d, "cgroup.freeze")
		if !t.sys.fs.exists(p) {
			return false, nil
		}
		v := "0"
		if on {
			v = "1"
		}
		return true, t.sys.write(p, v)
	}
	v := "THAWED"
	if on {
		v = "FROZEN"
	}
	return true, t.sys.write(filepath.Join(d, "freezer.state"), v)
}

func (g *Group) isFrozen() (bool, error) {
	t := g.tree
	d := g.ctl["freezer"]
	if t.Version == 2 {
		s, err := t.sys.read(filepath.Join(d, "cgroup.events"))
		if err != nil {
			return false, err
		}
		return keyed(s)["frozen"] == 1, nil
	}
	s, err := t.sys.read(filepath.Join(d, "freezer.state"))
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(s) == "FROZEN", nil
}

func (g *Group) empty() (bool, error) {
	pids, err := g.Procs()
	return len(pids) == 0, err
}

func (g *Group) waitEmpty(deadline time.Time) error {
	empty, err := pollUntil(deadline, g.empty)
	if err != nil {
		return err
	}
	if !empty {
		left, _ := g.Procs()
		return fmt.Errorf("cgroup: %s: processes still there after %v: %v", g.Path(), killTimeout, left)
	}
	return nil
}

// Remove kills what is left in the group and removes its directories. A
// group already removed is not an error.
func (g *Group) Remove() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.removed {
		return nil
	}
	if err := g.kill(); err != nil {
		return err
	}
	if g.fd >= 0 {
		unix.Close(g.fd)
		g.fd = -1
	}
	g.closeHeldLocked()
	var errs []error
	for i := len(g.dirs) - 1; i >= 0; i-- {
		if err := rmdirRetry(g.tree.sys, g.dirs[i]); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		g.removed = true
		t := g.tree
		t.mu.Lock()
		if t.live[g.Name] == g {
			delete(t.live, g.Name)
		}
		t.mu.Unlock()
	}
	return errors.Join(errs...)
}

// rmdirRetry removes a group directory; it is not an error when it is
// gone. EBUSY is retried for a while: the last task of a group leaves it a
// moment after cgroup.procs stops listing it.
func rmdirRetry(sys *system, d string) error {
	var last error
	ok, _ := pollUntil(time.Now().Add(2*time.Second), func() (bool, error) {
		err := sys.rmdir(d)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return true, nil
		}
		last = err
		return false, nil
	})
	if ok {
		return nil
	}
	return last
}

// pollUntil calls f until it says true, fails, or deadline passes.
func pollUntil(deadline time.Time, f func() (bool, error)) (bool, error) {
	d := 100 * time.Microsecond
	for {
		ok, err := f()
		if err != nil || ok {
			return ok, err
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		time.Sleep(d)
		if d < 10*time.Millisecond {
			d *= 2
		}
	}
}

// checkName accepts a group name: one path component of letters, digits,
// '.', '_' and '-', not starting with '.' and not a cgroup file's prefix.
func checkName(name string) error {
	if name == "" || len(name) > 200 || name[0] == '.' || strings.HasPrefix(name, "cgroup.") {
		return fmt.Errorf("cgroup: bad group name %q", name)
	}
	for _, r := range name {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
		if !ok {
			return fmt.Errorf("cgroup: bad group name %q: only letters, digits, '.', '_' and '-'", name)
		}
	}
	return nil
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// OOMKillCount is how many processes the OOM killer has ended in the group
// (v2 memory.events oom_kill, v1 memory.oom_control oom_kill), or -1 where
// the kernel keeps no count: one file read, cheap enough for every command.
func (g *Group) OOMKillCount() int64 {
	mem, ok := g.ctl["memory"]
	if !ok {
		return -1
	}
	name := "memory.events"
	if g.tree.Version == 1 {
		name = "memory.oom_control"
	}
	v, err := g.readHeld(filepath.Join(mem, name))
	if err != nil {
		return -1
	}
	if n, ok := keyed(v)["oom_kill"]; ok {
		return n
	}
	return -1
}
