package broker

import (
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"thermite/internal/confined"
	"thermite/internal/posixacl"
	"thermite/internal/procs"
	"thermite/internal/rpc"
)

// RetireFolder takes an ended trial's folder from every role at once. The
// folder itself becomes root's and 0700: no role can reach its workspace
// or agent folder again, and the controller cannot open it back up, with
// one change instead of a walk that gives every entry back. The roles stop
// holding the folders beneath it, so their later commands neither sweep
// nor measure them. With Remove the folder and everything in it go too.
//
// Only a folder directly in scratch/trials, and only once its lane's
// processes are stopped: while a role's command runs, a folder handed to
// that role is not retired.
func (b *Broker) RetireFolder(req *rpc.RetireRequest) (*rpc.RetireResult, error) {
	trials := filepath.Join(b.cfg.ScratchDir(), "trials")
	p := filepath.Clean(req.Path)
	name := filepath.Base(p)
	if filepath.Dir(p) != trials || name == "." || name == ".." {
		return nil, fmt.Errorf("retire_folder: %s: not a folder directly in %s", req.Path, trials)
	}
	uids, err := b.forgetBeneath(p)
	if err != nil {
		return nil, fmt.Errorf("retire_folder: %w", err)
	}
	// Where quotas measure roles, the folder's share of each user's quota
	// is taken off before it is out of their measure (quota.go).
	b.chargeRetired(p, uids)
	parent, err := confined.OpenRoot(trials)
	if err != nil {
		return nil, fmt.Errorf("retire_folder: %w", err)
	}
	defer parent.Close()
	fd, err := unix.Openat(int(parent.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if req.Remove && err == unix.ENOENT {
			return &rpc.RetireResult{}, nil
		}
		return nil, fmt.Errorf("retire_folder: %s: %w", p, err)
	}
	// Owner first, then mode: in between the folder is root's and still
	// lets through no more than it did. The mode's 0700 empties the ACL's
	// mask, and the ACL itself (TrialFolder's) goes last.
	err = unix.Fchown(fd, 0, 0)
	if err == nil {
		err = unix.Fchmod(fd, 0o700)
	}
	if err == nil {
		err = posixacl.Remove(fd)
	}
	unix.Close(fd)
	if err != nil {
		return nil, fmt.Errorf("retire_folder: %s: %w", p, err)
	}
	res := &rpc.RetireResult{}
	if req.Remove {
		done := b.removingRetired(p)
		n, err := confined.RemoveTree(parent, name)
		done()
		res.Removed = n
		if err != nil {
			return res, fmt.Errorf("retire_folder: remove %s: %w", p, err)
		}
		b.log.Info("trial folder removed", "path", p, "entries", n)
	}
	return res, nil
}

// forgetBeneath drops every handed folder at or beneath p from every role,
// refusing while a role whose folder it is has a command running. It
// returns the users that held one.
func (b *Broker) forgetBeneath(p string) ([]int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var uids []int
	for uid, m := range b.handed {
		held := false
		for h := range m {
			if h != p && !strings.HasPrefix(h, p+"/") {
				continue
			}
			if pids, err := procs.ByUID("/proc", uid); err != nil || len(pids) > 0 {
				return nil, fmt.Errorf("%s: %s is still handed to uid %d, which has %d processes: end its trial first", p, h, uid, len(pids))
			}
			held = true
		}
		if held {
			uids = append(uids, uid)
		}
	}
	for _, m := range b.handed {
		for h := range m {
			if h == p || strings.HasPrefix(h, p+"/") {
				delete(m, h)
			}
		}
	}
	b.dropWatchedLocked(func(_ int, h string) bool { return h == p || strings.HasPrefix(h, p+"/") })
	b.bumpAllLocked()
	return uids, nil
}
