package cgroup

import (
	"fmt"
	"path/filepath"
	"strings"

	"thermite/internal/cpuset"
)

// HasCPUSet reports whether the tree's groups carry the cpuset controller,
// so that SetCPUs holds CPUs in the kernel; CPUSetWhy says why not.
func (t *Tree) HasCPUSet() bool { return t.ctl["cpuset"] != nil }

// CPUSetWhy is why the tree has no cpuset controller, "" when it has one.
func (t *Tree) CPUSetWhy() string {
	if t.HasCPUSet() {
		return ""
	}
	if t.cpusetWhy == "" {
		return "the tree has no cpuset controller"
	}
	return t.cpusetWhy
}

// initCPUSetV1 gives the parent group in the v1 cpuset hierarchy its
// parent's CPUs and memory nodes: a v1 cpuset starts empty, and a task
// cannot join a cpuset with no CPUs or no memory nodes.
func (t *Tree) initCPUSetV1(h *hier) error {
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		cur, err := t.sys.read(filepath.Join(h.dir, f))
		if err != nil {
			return err
		}
		if strings.TrimSpace(cur) != "" {
			continue
		}
		v, err := t.sys.read(filepath.Join(h.base, f))
		if err != nil {
			return err
		}
		if err := t.sys.write(filepath.Join(h.dir, f), strings.TrimSpace(v)); err != nil {
			return err
		}
	}
	return nil
}

// initCPUSetGroupV1 copies the parent group's CPUs and memory nodes into a
// new v1 cpuset group (dir), for the same reason.
func (t *Tree) initCPUSetGroupV1(dir string) error {
	for _, f := range []string{"cpuset.mems", "cpuset.cpus"} {
		v, err := t.sys.read(filepath.Join(filepath.Dir(dir), f))
		if err != nil {
			return err
		}
		if err := t.sys.write(filepath.Join(dir, f), strings.TrimSpace(v)); err != nil {
			return err
		}
	}
	return nil
}

// dropCPUSet leaves the cpuset hierarchy out of the tree after it could
// not be set up, saying why in CPUSetWhy.
func (t *Tree) dropCPUSet(h *hier, err error) {
	t.cpusetWhy = fmt.Sprintf("cpuset hierarchy %s: %v", h.mount, err)
	t.dropController(h, "cpuset")
}

// SetCPUs makes s the only CPUs the group's tasks may run on. The kernel
// moves every task of the group off CPUs it loses, whenever it started,
// and a task's sched_setaffinity is cut to the group's CPUs (EINVAL when
// it asks for none of them). An empty s is refused by the kernel while
// the group has tasks (v1 ENOSPC); on v2 it would mean "the parent's", so
// it is refused here.
func (g *Group) SetCPUs(s cpuset.Set) error {
	d, ok := g.ctl["cpuset"]
	if !ok {
		return fmt.Errorf("cgroup: group %s: %s", g.Name, g.tree.CPUSetWhy())
	}
	if len(s) == 0 && g.tree.Version == 2 {
		return fmt.Errorf("cgroup: group %s: no CPU to give it (cgroup v2 reads an empty cpuset.cpus as its parent's)", g.Name)
	}
	return g.tree.sys.write(filepath.Join(d, "cpuset.cpus"), s.String())
}

// CPUs is the CPUs the group's tasks may run on now (v2
// cpuset.cpus.effective, v1 cpuset.effective_cpus).
func (g *Group) CPUs() (cpuset.Set, error) {
	d, ok := g.ctl["cpuset"]
	if !ok {
		return nil, fmt.Errorf("cgroup: group %s: %s", g.Name, g.tree.CPUSetWhy())
	}
	name := "cpuset.effective_cpus"
	if g.tree.Version == 2 {
		name = "cpuset.cpus.effective"
	}
	v, err := g.tree.sys.read(filepath.Join(d, name))
	if err != nil {
		return nil, err
	}
	return cpuset.Parse(v)
}
