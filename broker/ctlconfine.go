package broker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"golang.org/x/sys/unix"

	"thermite/fence"
	"thermite/internal/cgroup"
	"thermite/internal/seccomp"
	"thermite/internal/weaken"
)

// controllerGroup is the controller daemon's cgroup, beside the roles'
// groups: no role's name holds a dot, so none can be called the same.
const controllerGroup = "controller.daemon"

// systemPrograms are the folders whose programs the controller (a kit's
// check: sh, awk, python) may run and whose libraries it loads.
var systemPrograms = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt"}

// systemReadable are the folders it reads besides: /etc for resolv.conf,
// hosts and certificates, /proc and /sys for the Go runtime and fetch's
// view of the host's addresses.
var systemReadable = []string{"/etc", "/proc", "/sys"}

// confineController decides the controller daemon's confinement, and the
// self-test's probe of it gets the very same: its Landlock rule set
// (ControllerSpecFor), its seccomp filter (seccomp.ControllerOptions) and
// its cgroup (controllerGroupFor). A flaw in what it parses then reaches
// no further than its own folders, and a flood no further than its own
// memory and tasks. Where Landlock or the filter cannot be set up it is
// refused, naming why; where no writable cgroup tree exists it runs
// without one, as role commands do, and the status says so.
func (b *Broker) confineController(argv []string, stdio [3]*os.File) (*command, error) {
	ctl := b.table.Controller()
	home := b.homeOf(ctl)
	env, err := planEnv(&b.cfg, ctl, home, nil, nil)
	if err != nil {
		return nil, err
	}
	c := &command{role: ctl, argv: argv, env: env, stdio: stdio}
	if c.cwd, err = os.OpenFile(home, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0); err != nil {
		return nil, fmt.Errorf("controller: its HOME: %w", err)
	}
	if weaken.Enabled && weaken.Has(weaken.ControllerBare) {
		return c, nil
	}
	if err := b.ensureControllerFiles(); err != nil {
		c.release()
		return nil, err
	}
	p := fence.ControllerPolicy(b.controllerSpec())
	abi := fence.PolicyABI
	if k := b.kernel.ABI; k < abi {
		// The start got past the kernel policy, so the operator accepted
		// what this kernel lacks: the controller's rule set keeps what the
		// kernel has, as the roles' do, and there is none without Landlock.
		abi = k
		p.Fit(k)
	}
	if abi > 0 {
		rs, err := p.Build(abi)
		if err != nil {
			c.release()
			return nil, fmt.Errorf("controller: landlock rule set (%s): %w", p.Describe(), err)
		}
		c.landlock = rs
		c.unland = func() { rs.Close() }
	}
	o := seccomp.ControllerOptions()
	if _, err := seccomp.Program(o); err != nil {
		c.release()
		return nil, fmt.Errorf("controller: %w", err)
	}
	c.seccomp = &o
	if c.cgroup, err = b.controllerGroupFor(); err != nil {
		c.release()
		return nil, err
	}
	return c, nil
}

// controllerSpec is where the controller may read, run programs and
// write: the system's programs and configuration, its own binary, the kits
// (a kit's check may be a program of the kit), and as its own folders
// the store, the research folder, scratch's trials, runs and builds, its
// HOME and TMPDIR, and the image's outbox where there is one. In its private folder it makes its socket, and
// writes its ledger and nothing else: it reads the kits the operator's
// commands import there, and moves the projects they import out. Likewise it only makes the API's
// socket in that socket's folder.
func (b *Broker) controllerSpec() fence.ControllerSpec {
	ctl := b.table.Controller()
	s := b.cfg.ScratchDir()
	spec := fence.ControllerSpec{
		Read:   append([]string(nil), systemReadable...),
		Exec:   append(append([]string(nil), systemPrograms...), filepath.Join(b.cfg.ControllerDir(), "kits")),
		Binary: b.exe,
		Writable: []string{
			b.cfg.StoreDir(), b.cfg.ResearchDir(),
			filepath.Join(s, "trials"), filepath.Join(s, "runs"), filepath.Join(s, "builds"),
			b.homeOf(ctl), b.tmpOf(ctl),
			// A trial's import is moved from here into its workspace:
			// Landlock lets a rename through only with REFER on both
			// sides and no right gained at the destination.
			filepath.Join(b.cfg.ControllerDir(), "projects"),
		},
		Sockets: []string{b.cfg.ControllerDir(), b.cfg.APIDir(), filepath.Dir(b.cfg.APISocket())},
		Files:   []string{b.ledgerPath()},
	}
	// The one-container image's exchange folders (docs/container.md): the
	// controller reads the inbox and fills the outbox.
	if b.cfg.Image.Inbox != "" {
		spec.Read = append(spec.Read, b.cfg.Image.Inbox)
	}
	if b.cfg.Image.Outbox != "" {
		spec.Writable = append(spec.Writable, b.cfg.Image.Outbox)
	}
	// A resolver file that is a symlink out of /etc (systemd-resolved's
	// stub in /run) is read in its target's folder: a rule holds an inode,
	// and the file there is replaced whenever the resolver rewrites it.
	for _, f := range []string{"/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf"} {
		if t, err := filepath.EvalSymlinks(f); err == nil && t != f {
			spec.Read = append(spec.Read, filepath.Dir(t))
		}
	}
	sort.Strings(spec.Sockets)
	return spec
}

func (b *Broker) ledgerPath() string { return filepath.Join(b.cfg.ControllerDir(), "ledger.db") }

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
// cgroup.controller_memory_mb and cgroup.controller_pids and kept across
// its restarts: nil where no writable tree exists (the status says why),
// an error where the tree exists and the group cannot be made.
func (b *Broker) controllerGroupFor() (*cgroup.Group, error) {
	if b.cg == nil {
		return nil, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ctlGroup != nil {
		return b.ctlGroup, nil
	}
	g, err := b.cg.Create(controllerGroup, cgroup.Limits{MemoryBytes: b.cfg.Cgroup.ControllerMemoryMB << 20, Pids: b.cfg.Cgroup.ControllerPids})
	if err != nil {
		return nil, fmt.Errorf("controller: cgroup %s (cgroup.controller_memory_mb, cgroup.controller_pids; cgroup.enabled = false runs without): %w", controllerGroup, err)
	}
	b.ctlGroup = g
	return g, nil
}
