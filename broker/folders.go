package broker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"thermite/internal/confined"
	"thermite/internal/rpc"
	"thermite/internal/weaken"
	"thermite/roles"
)

// handableRoots are the folders beneath which HandFolder may give a folder
// away: never scratch itself, a role's HOME or TMPDIR, or the store.
func (b *Broker) handableRoots() []string {
	s := b.cfg.ScratchDir()
	return []string{
		filepath.Join(s, "trials"),
		filepath.Join(s, "runs"),
		filepath.Join(s, "builds"),
		b.cfg.ResearchDir(),
	}
}

// HandFolder gives a folder beneath one of the handable roots, and
// everything in it, to a role.
func (b *Broker) HandFolder(req *rpc.HandFolderRequest) (*rpc.HandFolderResult, error) {
	r, err := b.role(req.Role)
	if err != nil {
		return nil, fmt.Errorf("hand_folder: %w", err)
	}
	req.Path = filepath.Clean(req.Path)
	if req.Mode&^0o777 != 0 {
		return nil, fmt.Errorf("hand_folder: mode %04o has bits beyond 0777", req.Mode)
	}
	var top *os.File
	for _, root := range b.handableRoots() {
		if !strings.HasPrefix(req.Path, root+"/") {
			continue
		}
		top, err = confined.Open(root, req.Path, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW)
		if err != nil {
			return nil, fmt.Errorf("hand_folder: %w", err)
		}
		break
	}
	if top == nil {
		return nil, fmt.Errorf("hand_folder: %s: not inside %s", req.Path, strings.Join(b.handableRoots(), ", "))
	}
	defer top.Close()
	if req.TopOnly {
		if err := b.handTop(top, r, req); err != nil {
			return nil, fmt.Errorf("hand_folder: %s: %w", req.Path, err)
		}
		b.recordHanded(r, req.Path)
		return &rpc.HandFolderResult{Changed: 1}, nil
	}
	uids := b.uidSet()
	h := confined.Hand{UID: r.UID, GID: r.GID, TopUID: r.UID, Allowed: func(uid int) bool { return uids[uid] },
		ReadOnly: req.ReadOnly, Publish: req.Publish, TopMode: req.Mode}
	if req.GroupTop {
		keep, err := b.groupTop(r, req)
		if err != nil {
			return nil, fmt.Errorf("hand_folder: %s: %w", req.Path, err)
		}
		if keep {
			h.TopUID, h.TopMode = b.table.Controller().UID, GroupTopMode
		}
	}
	res, err := confined.ChownTree(top, h)
	if err != nil {
		return nil, fmt.Errorf("hand_folder: %w", err)
	}
	if len(res.Removed) > 0 {
		b.log.Warn("publish removed FIFOs, sockets and device nodes", "path", req.Path, "removed", firstOf(res.Removed, 100))
	}
	b.recordHanded(r, req.Path)
	return &rpc.HandFolderResult{Changed: res.Changed, Skipped: res.Skipped, Removed: firstOf(res.Removed, 100)}, nil
}

// GroupTopMode is a lane's research area's top while its trial runs: the
// controller's, for the lane's group (no other user is in it), so that the
// lane writes there as in a folder of its own but cannot chmod it open, as
// its HOME (root:role 0770).
const GroupTopMode = 0o770

// groupTop decides whether a folder may be handed with its top kept from
// the role: a lane's research area (research/<run>/lanes/lane-N), to that
// lane, writable. It says whether the top is kept: where a thermite_weaken
// build says so, the lane gets the top as before issue 27.
func (b *Broker) groupTop(r roles.Role, req *rpc.HandFolderRequest) (bool, error) {
	rel, err := filepath.Rel(b.cfg.ResearchDir(), req.Path)
	parts := strings.Split(rel, "/")
	if err != nil || r.Kind != roles.Lane || len(parts) != 3 || parts[1] != "lanes" || parts[2] != r.Name || req.ReadOnly || req.Publish {
		return false, fmt.Errorf("group_top is for a lane's own research area (research/<run>/lanes/%s), handed writable", r.Name)
	}
	return !(weaken.Enabled && weaken.Has(weaken.LaneFoldersOpen)), nil
}

// firstOf is at most n of xs, and how many more there were: a role
// decides how long these lists are.
func firstOf(xs []string, n int) []string {
	if len(xs) <= n {
		return xs
	}
	return append(xs[:n:n], fmt.Sprintf("… and %d more", len(xs)-n))
}

// handTop gives a folder, and not what it holds, to a role: a trial's
// workspace that the operator's import made the lane's entry by entry,
// whose top the controller moved into place. Only beneath scratch/trials,
// only a folder the controller or the role already owns (never another
// role's), and never read-only or published.
func (b *Broker) handTop(top *os.File, r roles.Role, req *rpc.HandFolderRequest) error {
	if !strings.HasPrefix(req.Path, filepath.Join(b.cfg.ScratchDir(), "trials")+"/") || req.ReadOnly || req.Publish {
		return fmt.Errorf("top_only is for a trial's workspace beneath scratch/trials, handed writable")
	}
	fd, err := unix.Openat(int(top.Fd()), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if int(st.Uid) != b.table.Controller().UID && int(st.Uid) != r.UID {
		return fmt.Errorf("owned by uid %d, neither the controller's nor %s's", st.Uid, r.Name)
	}
	mode := req.Mode
	if mode == 0 {
		mode = 0o700
	}
	if err := unix.Fchown(fd, r.UID, r.GID); err != nil {
		return err
	}
	return unix.Fchmod(fd, mode)
}

// recordHanded notes that path now belongs to r, and no longer to any
// other role. A folder given back to the controller is not recorded: it is
// the controller's own again, and its role's commands (a kit's check) need
// no write right there nor a sweep of it, so the cost of each command never
// grows with the trials, builds and runs of the rig's history.
func (b *Broker) recordHanded(r roles.Role, path string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.bumpAllLocked()
	b.dropWatchedLocked(func(_ int, p string) bool { return p == path })
	for _, m := range b.handed {
		delete(m, path)
	}
	if r.Kind == roles.Controller {
		return
	}
	if b.handed[r.UID] == nil {
		b.handed[r.UID] = map[string]bool{}
	}
	b.handed[r.UID][path] = true
}

// forgetHanded drops a handed folder that is gone.
func (b *Broker) forgetHanded(r roles.Role, path string) {
	b.mu.Lock()
	delete(b.handed[r.UID], path)
	b.dropWatchedLocked(func(uid int, p string) bool { return uid == r.UID && p == path })
	b.bumpAllLocked()
	b.mu.Unlock()
}

// eachOwnedFolder opens every folder a role owns (its HOME, its TMPDIR and
// the folders handed to it), beneath scratch or the research folder, and
// hands each to f. A folder that is gone is passed over; one that cannot be
// opened is reported to fail.
func (b *Broker) eachOwnedFolder(r roles.Role, f func(top *os.File), fail func(error)) {
	b.mu.Lock()
	dirs := []string{b.homeOf(r), b.tmpOf(r)}
	for p := range b.handed[r.UID] {
		dirs = append(dirs, p)
	}
	b.mu.Unlock()
	// Each root is opened once for all its folders (a lane's sweep after
	// every command opens two beneath scratch).
	roots := map[string]*os.File{}
	defer func() {
		for _, f := range roots {
			f.Close()
		}
	}()
	open := func(root, d string) (*os.File, error) {
		rel, err := confined.Rel(root, d)
		if err != nil {
			return nil, err
		}
		rf := roots[root]
		if rf == nil {
			if rf, err = confined.OpenRoot(root); err != nil {
				return nil, err
			}
			roots[root] = rf
		}
		return confined.OpenAt(rf, rel, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW, d)
	}
	for _, d := range dirs {
		root := b.cfg.ScratchDir()
		if strings.HasPrefix(d, b.cfg.ResearchDir()+"/") {
			root = b.cfg.ResearchDir()
		}
		top, err := open(root, d)
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				b.forgetHanded(r, d)
			} else {
				fail(err)
			}
			continue
		}
		f(top)
		top.Close()
	}
}

// ClearSetID sweeps every folder a role owns in scratch (its HOME, its
// TMPDIR and the folders handed to it) for set-user and set-group bits.
func (b *Broker) ClearSetID(r roles.Role) *rpc.SetIDReport {
	rep := &rpc.SetIDReport{}
	skip := func(err error) { rep.Skipped = append(rep.Skipped, err.Error()) }
	b.eachOwnedFolder(r, func(top *os.File) {
		cleared, skipped, n, err := confined.ClearSetID(top, r.UID)
		rep.Cleared = append(rep.Cleared, cleared...)
		rep.Skipped = append(rep.Skipped, skipped...)
		rep.Scanned += n
		if err != nil {
			skip(err)
		}
	}, skip)
	// A role decides how long these lists are: the answer and the log
	// carry the first hundred of each.
	if len(rep.Cleared) > 100 {
		rep.Cleared = append(rep.Cleared[:100], fmt.Sprintf("… and %d more", len(rep.Cleared)-100))
	}
	if len(rep.Skipped) > 100 {
		rep.Skipped = append(rep.Skipped[:100], fmt.Sprintf("… and %d more", len(rep.Skipped)-100))
	}
	if len(rep.Cleared) > 0 || len(rep.Skipped) > 0 {
		b.log.Warn("set-id sweep", "role", r.Name, "cleared", rep.Cleared, "skipped", rep.Skipped)
	}
	return rep
}
