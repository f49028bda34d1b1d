package broker

import (
	"fmt"
	"strings"

	"thermite/internal/cgroup"
	"thermite/internal/weaken"
	"thermite/roles"
)

// initCgroups finds a writable cgroup tree and makes the broker's parent
// group in it. Where there is none, commands run under their rlimits
// alone, and the status and the self-test say why.
func (b *Broker) initCgroups() {
	b.cgGroups = map[int]*cgroup.Group{}
	if !b.cfg.Cgroup.Enabled {
		b.cgWhy = "cgroups are off in the configuration (cgroup.enabled = false)"
		b.note("no per-role cgroups: " + b.cgWhy + "; rlimits are the floor")
		return
	}
	parent := "thermite"
	if p := strings.TrimSuffix(b.cfg.RolePrefix, "-"); p != "" {
		parent += "-" + p
	}
	t, err := cgroup.Detect("/sys/fs/cgroup", parent)
	if err != nil {
		b.cgWhy = "no writable cgroup tree: " + err.Error()
		b.note("no per-role cgroups: " + b.cgWhy + "; rlimits are the floor")
		return
	}
	b.cg = t
	b.log.Info("cgroups", "tree", t.String())
}

// groupFor is the cgroup every command of a role runs in: memory (no swap)
// and pids limits over everything the role's user runs. nil when there is
// no writable tree.
func (b *Broker) groupFor(r roles.Role) (*cgroup.Group, error) {
	if b.cg == nil || weaken.Enabled && (weaken.Has("fence-only") || weaken.Has("no-landlock")) {
		return nil, nil
	}
	// A new group gets the CPUs the holds leave its role before any task
	// joins it, and no hold changes while it is made.
	b.cpusetMu.Lock()
	defer b.cpusetMu.Unlock()
	b.mu.Lock()
	g := b.cgGroups[r.UID]
	b.mu.Unlock()
	if g != nil {
		return g, nil
	}
	g, err := b.cg.Create(r.Name, cgroup.Limits{MemoryBytes: b.cfg.Cgroup.MemoryMB << 20, Pids: b.cfg.Cgroup.Pids})
	if err != nil {
		return nil, fmt.Errorf("cgroup for %s: %w", r.Name, err)
	}
	if b.cg.HasCPUSet() && !advisoryCPUs() {
		if err := b.setGroupCPUs(r, g); err != nil {
			g.Remove()
			return nil, err
		}
	}
	b.mu.Lock()
	b.cgGroups[r.UID] = g
	b.mu.Unlock()
	return g, nil
}

// oomKills is how many processes the OOM killer has ended in a group.
func oomKills(g *cgroup.Group) int64 {
	if g == nil {
		return -1
	}
	return g.OOMKillCount()
}

func (b *Broker) closeCgroups() {
	if b.cg == nil {
		return
	}
	b.mu.Lock()
	for _, g := range b.cgGroups {
		g.Remove()
	}
	b.cgGroups = map[int]*cgroup.Group{}
	if b.ctlGroup != nil {
		b.ctlGroup.Remove()
		b.ctlGroup = nil
	}
	b.mu.Unlock()
	b.cg.Close()
}

func (b *Broker) cgroupStatus() string {
	if b.cg == nil {
		return "none: " + b.cgWhy + " (rlimits only; timed runs refused: judge CPUs cannot be held in the kernel)"
	}
	judge := "judge CPUs held in the kernel (cpuset)"
	if why := b.cpusetWhy(); why != "" {
		judge = "judge CPUs cannot be held in the kernel, so timed runs are refused: " + why
	}
	return fmt.Sprintf("%s; per role: memory %d MiB (no swap), %d tasks; controller: memory %d MiB, %d tasks; %s",
		b.cg.String(), b.cfg.Cgroup.MemoryMB, b.cfg.Cgroup.Pids, b.cfg.Cgroup.ControllerMemoryMB, b.cfg.Cgroup.ControllerPids, judge)
}
