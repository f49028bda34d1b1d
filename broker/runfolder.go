package broker

import (
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"

	"thermite/internal/confined"
	"thermite/internal/rpc"
	"thermite/internal/weaken"
	"thermite/roles"
)

// RunFolderMode is a timed run's folder once it is opened to its timing
// user: the controller's, readable and searchable by the timing user's
// group only.
const RunFolderMode = 0o750

// RunFolder opens a timed run's folder to its timing user and to no other
// role. It is the one place the broker sets a group that is not the
// owner's own, so it is as narrow as it can be: only a folder directly in
// scratch/runs, only one the controller owns, only a timing user's own
// group, only that folder (not what it holds), and only mode 0750. Every
// other role, knowing every path inside, then gets EACCES on the folder,
// its kit copy, its out/ and its build link.
func (b *Broker) RunFolder(req *rpc.RunFolderRequest) error {
	r, err := b.role(req.Role)
	if err != nil {
		return fmt.Errorf("run_folder: %w", err)
	}
	if r.Kind != roles.Timing {
		return fmt.Errorf("run_folder: %s is not a timing user", r.Name)
	}
	runs := filepath.Join(b.cfg.ScratchDir(), "runs")
	p := filepath.Clean(req.Path)
	if filepath.Dir(p) != runs || filepath.Base(p) == "." || filepath.Base(p) == ".." {
		return fmt.Errorf("run_folder: %s: not a folder directly in %s", req.Path, runs)
	}
	f, err := confined.Open(runs, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
	if err != nil {
		return fmt.Errorf("run_folder: %w", err)
	}
	defer f.Close()
	fd := int(f.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("run_folder: %s: %w", p, err)
	}
	ctl := b.table.Controller()
	if int(st.Uid) != ctl.UID {
		return fmt.Errorf("run_folder: %s: owned by uid %d, not the controller's", p, st.Uid)
	}
	gid, mode := r.GID, uint32(RunFolderMode)
	if weaken.Enabled && weaken.Has(weaken.RunFolder0711) {
		// The self-test's breakage test: the folder as it once was, the
		// controller's and searchable by every user.
		gid, mode = ctl.GID, 0o711
	}
	if err := unix.Fchown(fd, ctl.UID, gid); err != nil {
		return fmt.Errorf("run_folder: %s: %w", p, err)
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return fmt.Errorf("run_folder: %s: %w", p, err)
	}
	return nil
}
