package broker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"thermite/internal/cgroup"
	"thermite/internal/landlock"
	"thermite/internal/seccomp"
)

// confineController carries out the controller daemon's plan
// (PlanController), which the self-test's probe of it gets too. A flaw in
// what it parses then reaches no further than its own folders, and a
// flood no further than its own memory and tasks. Where Landlock or the
// filter cannot be set up it is refused, naming why; where no writable
// cgroup tree exists it runs without one, as role commands do, and the
// status says so.
func (b *Broker) confineController(argv []string, stdio [3]*os.File) (*command, error) {
	now := &Snapshot{Cgroups: b.cgroups.tree != nil, CPUWeights: b.hasCPUWeights(), Kernel: b.kernel, Weakened: weakenedNow()}
	p, err := PlanController(&b.cfg, b.table, argv, b.exe, resolverDirs(), now)
	if err != nil {
		return nil, err
	}
	c := &command{role: p.Role, uid: p.UID, gid: p.GID, argv: p.Argv, env: p.Env, stdio: stdio, groups: p.Groups, ownBinary: p.OwnBinary}
	if c.cwd, err = os.OpenFile(p.Cwd, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0); err != nil {
		return nil, fmt.Errorf("controller: its HOME: %w", err)
	}
	if p.Controller == nil {
		return c, nil
	}
	if err := b.ensureControllerFiles(); err != nil {
		c.release()
		return nil, err
	}
	rules := landlock.ControllerPolicy(*p.Controller)
	abi := p.LandlockABI
	if abi < landlock.PolicyABI {
		// Less than the policy's, as planLandlockABI decided: the rule
		// set keeps what the kernel has, and there is none at 0.
		rules.Fit(abi)
	}
	if abi > 0 {
		rs, err := rules.Build(abi)
		if err != nil {
			c.release()
			return nil, fmt.Errorf("controller: landlock rule set (%s): %w", rules.Describe(), err)
		}
		c.landlock = rs
		c.unland = func() { rs.Close() }
	}
	if _, err := seccomp.Program(*p.Seccomp); err != nil {
		c.release()
		return nil, fmt.Errorf("controller: %w", err)
	}
	c.seccomp = p.Seccomp
	if p.Cgroup != nil {
		if c.cgroup, err = b.controllerGroupFor(); err != nil {
			c.release()
			return nil, err
		}
	}
	return c, nil
}

// resolverDirs are the folders of the resolver files that are symlinks
// out of /etc (systemd-resolved's stub in /run): a rule holds an inode,
// and the file there is replaced whenever the resolver rewrites it, so the
// controller reads the target's folder.
func resolverDirs() []string {
	var out []string
	for _, f := range []string{"/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf"} {
		if t, err := filepath.EvalSymlinks(f); err == nil && t != f {
			out = append(out, filepath.Dir(t))
		}
	}
	return out
}

func (b *Broker) ledgerPath() string { return ledgerPath(&b.cfg) }

// ensureControllerFiles makes, where they are not yet, the controller's
// ledger file (empty: the ledger fills it on open) and its kits and
// projects folders, all its own: its rule set grants writing that one file
// in its private folder and reading or running those folders, and a rule
// needs its path to exist.
func (b *Broker) ensureControllerFiles() error {
	ctl := b.table.Controller()
	dir, err := os.OpenFile(b.cfg.ControllerDir(), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	defer dir.Close()
	dfd := int(dir.Fd())
	for _, sub := range []string{"kits", "projects"} {
		err := unix.Mkdirat(dfd, sub, 0o700)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if err == nil {
			err = unix.Fchownat(dfd, sub, ctl.UID, ctl.GID, unix.AT_SYMLINK_NOFOLLOW)
		}
		if err != nil {
			return fmt.Errorf("controller: make its folder %s: %w", filepath.Join(b.cfg.ControllerDir(), sub), err)
		}
	}
	fd, err := unix.Openat(dfd, "ledger.db", unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("controller: make its ledger file %s: %w", b.ledgerPath(), err)
	}
	defer unix.Close(fd)
	if err := unix.Fchown(fd, ctl.UID, ctl.GID); err != nil {
		return fmt.Errorf("controller: chown its ledger file %s: %w", b.ledgerPath(), err)
	}
	return nil
}

// controllerGroupFor is the controller daemon's cgroup, made once with
// cgroup.controller_memory_mb, cgroup.controller_pids and the rig's CPU
// weight (controllerCgroup) and kept across
// its restarts: nil where no writable tree exists (the status says why),
// an error where the tree exists and the group cannot be made.
func (b *Broker) controllerGroupFor() (*cgroup.Group, error) {
	if b.cgroups.tree == nil {
		return nil, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cgroups.ctl != nil {
		return b.cgroups.ctl, nil
	}
	p := controllerCgroup(&b.cfg, b.hasCPUWeights(), weakenedNow())
	g, err := b.cgroups.tree.Create(p.Name, p.Limits)
	if err != nil {
		return nil, fmt.Errorf("controller: cgroup %s (cgroup.controller_memory_mb, cgroup.controller_pids; cgroup.enabled = false runs without): %w", controllerGroup, err)
	}
	b.cgroups.ctl = g
	return g, nil
}
