package broker

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"thermite/internal/caps"
	"thermite/internal/confined"
	"thermite/internal/quota"
	"thermite/internal/rpc"
	"thermite/roles"
)

// Where scratch's file system keeps user quotas, a role's disk measure is
// one quotactl: the kernel charges each user for every block it owns there,
// files unlinked but still open included, so neither a walk nor the
// unlinked-file helper is needed for it. A user's quota counts everything
// it owns on that file system, not only its folders; what else it owns is
// the folders of its ended trials (retired: root's at the top, the entries
// still the user's until they are removed) and anything it was given
// outside the rig, which is counted (more, never less). Each retired
// folder's share is taken off: measured once at its retirement, when
// nothing of the user runs, and given back when the folder is removed.
// While one is being removed its share is between the two, so the user is
// measured by walking until the removal ends.

// quotaState is the quota path's bookkeeping (b.mu guards all but fs).
type quotaState struct {
	fs  *quota.FS // nil: the walk, as before
	why string    // why not, when fs is nil
	// retired is each retired folder's share of each user's quota,
	// charged their sum by user.
	retired map[string]map[int]quota.Usage
	charged map[int]quota.Usage
	// removing counts each user's retired folders being removed now; gen
	// moves on at each change of charged or removing.
	removing map[int]int
	gen      uint64
}

// probeQuota decides, once at start, how roles are measured: by the file
// system's user quotas where scratch's has them on, else by walking.
func (b *Broker) probeQuota() {
	q := &quotaState{retired: map[string]map[int]quota.Usage{}, charged: map[int]quota.Usage{}, removing: map[int]int{}}
	// A deleted file that only a mapping keeps is measured through
	// /proc/PID/map_files (statMapped): the broker tries it on itself.
	if c, err := mapFilesReadable(); err == nil {
		b.log.Info("disk check: a deleted file only a mapping keeps counts its blocks (read through /proc/PID/map_files)", "capability", caps.Names(1<<uint(c)))
	} else {
		// A note, so that `thermite status` says it as long as it holds.
		b.note("disk check: a deleted file only a mapping keeps cannot be measured, so a trial whose processes keep one (as bun, OpenCode's runtime, does) ends as hiding its files: " + err.Error())
	}
	fs, err := quota.Probe(b.cfg.ScratchDir())
	if err == nil {
		// A role's quota is read as the role's user, on a thread of its own.
		if _, rerr := fs.Of(b.table.Controller().UID); rerr != nil {
			fs.Close()
			fs, err = nil, fmt.Errorf("%s: reading a role's user quota: %w", b.cfg.ScratchDir(), rerr)
		}
	}
	if err != nil {
		q.why = err.Error()
		b.log.Info("disk check: walk (no user quotas on scratch's file system)", "why", q.why)
	} else {
		q.fs = fs
		b.log.Info("disk check: quota", "file_system", fs.String())
		// Scratch was just cleared: whatever a role's user still owns
		// there lies outside its folders, and counts against its caps.
		for _, r := range b.table.Roles {
			if r.Kind == roles.Controller {
				continue
			}
			if u, err := fs.Of(r.UID); err == nil && u.Bytes > 1<<20 {
				b.log.Warn("a role's user owns files on scratch's file system outside its folders; they count against its disk caps", "role", r.Name, "bytes", u.Bytes, "inodes", u.Inodes, "file_system", fs.String())
			}
		}
	}
	b.mu.Lock()
	b.measure.quota = q
	b.mu.Unlock()
}

// DiskCheckMethod is the status line's word on how disks are measured.
func (b *Broker) DiskCheckMethod() string {
	b.mu.Lock()
	q := b.measure.quota
	b.mu.Unlock()
	switch {
	case q == nil:
		return ""
	case q.fs != nil:
		return "quota (" + q.fs.String() + ")"
	}
	if ok, why := incrementalUsage(b.kernel, weakenedNow()); !ok {
		return "full walk (" + q.why + "; no incremental walk: " + why + ")"
	}
	return "incremental walk (" + q.why + ")"
}

// quotaFS is the file system whose quotas measure roles, or nil.
func (b *Broker) quotaFS() *quota.FS {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.measure.quota == nil {
		return nil
	}
	return b.measure.quota.fs
}

// quotaUsage measures a role by its quota: what its user owns on scratch's
// file system less its retired folders' shares, plus a walk of any of its
// folders on another file system and, where a process of it runs, what
// that holds unlinked on other file systems. ok is false where the quota
// cannot say now (a retired folder of the user is being removed): the
// caller walks.
func (b *Broker) quotaUsage(r roles.Role, fs *quota.FS) (u *rpc.DiskUsage, ok bool, err error) {
	var q quota.Usage
	for try := 0; ; try++ {
		b.mu.Lock()
		gen, removing, charged := b.measure.quota.gen, b.measure.quota.removing[r.UID], b.measure.quota.charged[r.UID]
		b.mu.Unlock()
		if removing > 0 || try == 3 {
			return nil, false, nil
		}
		all, err := fs.Of(r.UID)
		if err != nil {
			return &rpc.DiskUsage{Quota: true}, true, err
		}
		b.mu.Lock()
		same := b.measure.quota.gen == gen
		b.mu.Unlock()
		if same {
			q = all.Sub(charged)
			break
		}
	}
	u = &rpc.DiskUsage{Quota: true, Bytes: max(q.Bytes, 0), Entries: max(q.Inodes, 0)}
	b.addRootOwnedTops(r, fs.Dev, u)
	errs := b.measureFolders(r, fs.Dev, u)
	// Unlinked files on scratch's file system are in the quota; those
	// elsewhere (a memfd, another file system) only a process holds, so
	// with none running there are none.
	if !b.roleIdle(r.UID) {
		h, err := b.heldUnlinked(r, fs.Dev)
		u.Bytes += h.Bytes
		u.Unlinked, u.UnlinkedFiles = h.Bytes, h.Files
		if err != nil {
			errs = append(errs, err)
		}
	}
	return u, true, errors.Join(errs...)
}

// addRootOwnedTops adds the blocks of the role's HOME and TMPDIR
// themselves, which are root's, and of a lane's research area, the
// controller's (so that the role cannot open them to other roles): the
// quota charges a folder's own blocks to its owner, so a role that grows
// its HOME's directory with entries would be charged nothing.
func (b *Broker) addRootOwnedTops(r roles.Role, dev uint64, u *rpc.DiskUsage) {
	tops := []string{b.homeOf(r), b.tmpOf(r)}
	b.mu.Lock()
	for p := range b.handed[r.UID] {
		tops = append(tops, p)
	}
	b.mu.Unlock()
	for _, top := range tops {
		var st unix.Stat_t
		if unix.Lstat(top, &st) == nil && uint64(st.Dev) == dev && int(st.Uid) != r.UID {
			u.Bytes += st.Blocks * 512
			u.Entries++
		}
	}
}

// chargeRetired takes the share of each of uids in a folder being retired
// (path, on scratch) off their quota measure from now on. Nothing of the
// users runs (forgetBeneath saw to it): what each owns on the file system
// is its earlier retired folders' shares, this folder's, and its other
// folders (its HOME and TMPDIR, emptied at its stop), walked here.
func (b *Broker) chargeRetired(path string, uids []int) {
	fs := b.quotaFS()
	if fs == nil || len(uids) == 0 {
		return
	}
	shares := map[int]quota.Usage{}
	for _, uid := range uids {
		r, ok := b.table.ByUID(uid)
		if !ok {
			continue
		}
		all, err := fs.Of(uid)
		if err != nil {
			// Unknown share: none is taken off, so the user's measure
			// counts this folder too (more, never less).
			b.log.Warn("quota: a retired folder's share is not known; it counts against the role until removed", "path", path, "role", r.Name, "err", err)
			continue
		}
		var rest quota.Usage
		b.eachOwnedFolder(r, func(top *os.File) {
			var st unix.Stat_t
			if unix.Fstat(int(top.Fd()), &st) != nil || st.Dev != fs.Dev {
				return
			}
			n, e, _ := confined.Usage(top)
			rest = rest.Add(quota.Usage{Bytes: n, Inodes: e})
		}, func(error) {})
		b.mu.Lock()
		share := all.Sub(b.measure.quota.charged[uid]).Sub(rest)
		if share.Bytes > 0 || share.Inodes > 0 {
			shares[uid] = quota.Usage{Bytes: max(share.Bytes, 0), Inodes: max(share.Inodes, 0)}
			b.measure.quota.charged[uid] = b.measure.quota.charged[uid].Add(shares[uid])
			b.measure.quota.gen++
		}
		b.mu.Unlock()
	}
	if len(shares) > 0 {
		b.mu.Lock()
		b.measure.quota.retired[path] = shares
		b.mu.Unlock()
	}
}

// removingRetired marks a retired folder's users as measured by walking
// while it is removed; the returned function, called once it is gone (or
// its removal failed: what is left then counts), gives their shares back.
func (b *Broker) removingRetired(path string) (done func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.measure.quota == nil || b.measure.quota.retired[path] == nil {
		return func() {}
	}
	shares := b.measure.quota.retired[path]
	for uid := range shares {
		b.measure.quota.removing[uid]++
	}
	b.measure.quota.gen++
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		for uid, s := range shares {
			b.measure.quota.charged[uid] = b.measure.quota.charged[uid].Sub(s)
			if b.measure.quota.removing[uid]--; b.measure.quota.removing[uid] == 0 {
				delete(b.measure.quota.removing, uid)
			}
		}
		delete(b.measure.quota.retired, path)
		b.measure.quota.gen++
	}
}
