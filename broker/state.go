package broker

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"thermite/roles"
)

// closedState is the places closed while the rig runs.
type closedState struct {
	places []closedTmp
	// recorded: the record of closed places is on disk for places.
	recorded bool
}

// folder is one row of the state dir's table in README.md ("The broker's
// start, in order", step 5).
type folder struct {
	path string
	uid  int
	gid  int
	mode os.FileMode
}

// layout is the state dir's folders with their owners and modes.
func (b *Broker) layout() []folder {
	ctl := b.table.Controller()
	out := []folder{
		{b.cfg.StateDir, 0, 0, 0o755},
		{b.cfg.BrokerDir(), 0, ctl.GID, 0o710},
		{b.cfg.ControllerDir(), ctl.UID, ctl.GID, 0o700},
		{b.cfg.StoreDir(), ctl.UID, ctl.GID, 0o711},
		{b.cfg.ScratchDir(), 0, 0, 0o755},
		{b.cfg.ResearchDir(), ctl.UID, ctl.GID, 0o755},
		{b.cfg.APIDir(), ctl.UID, ctl.GID, 0o755},
	}
	// Each lane's and agent's own API socket is in a folder only its
	// group (the role's) may pass: another lane's connect is EACCES.
	for _, r := range b.table.Roles {
		if r.Kind == roles.Lane || r.Kind == roles.Agent {
			out = append(out, folder{b.cfg.RoleAPIDir(r.Name), ctl.UID, r.GID, 0o710})
		}
	}
	return out
}

// scratchLayout is what scratch holds after it is cleared: each role's
// HOME and TMPDIR, and the controller's folders for trials, runs and builds.
func (b *Broker) scratchLayout() []folder {
	ctl := b.table.Controller()
	s := b.cfg.ScratchDir()
	out := []folder{
		{filepath.Join(s, "home"), 0, 0, 0o711},
		{filepath.Join(s, "tmp"), 0, 0, 0o711},
		{filepath.Join(s, "trials"), ctl.UID, ctl.GID, 0o711},
		{filepath.Join(s, "runs"), ctl.UID, ctl.GID, 0o711},
		{filepath.Join(s, "builds"), ctl.UID, ctl.GID, 0o711},
	}
	// A role's HOME and TMPDIR are root's, for the role's group (0770; no
	// other user is in it): the role writes there as in a folder of its
	// own, but cannot chmod them open, so what it leaves inside, a
	// listening socket or a FIFO of any mode, no other role reaches.
	for _, r := range b.table.Roles {
		out = append(out,
			folder{b.homeOf(r), 0, r.GID, 0o770},
			folder{b.tmpOf(r), 0, r.GID, 0o770})
	}
	return out
}

func (b *Broker) homeOf(r roles.Role) string { return roleHome(&b.cfg, r) }

func (b *Broker) tmpOf(r roles.Role) string { return roleTmp(&b.cfg, r) }

// checkAncestors refuses a state dir below a folder that someone other than
// root could change: whoever can rename its parents can redirect it. A
// sticky folder owned by root (/tmp) is fine, as nobody else can rename
// what root made in it. Every folder above it must also let others pass
// (o+x): role users reach their HOME, TMPDIR and workspace through it.
func checkAncestors(p string) error {
	for dir := filepath.Dir(p); ; dir = filepath.Dir(dir) {
		var st unix.Stat_t
		err := unix.Lstat(dir, &st)
		switch {
		case errors.Is(err, unix.ENOENT):
			// prepareState makes it, root's and 0755.
		case err != nil:
			return fmt.Errorf("state_dir: %s: %w", dir, err)
		case st.Mode&unix.S_IFMT == unix.S_IFLNK:
			// A symlink among the ancestors is resolved once, by root, at start.
		case st.Uid != 0:
			return fmt.Errorf("state_dir: %s is owned by uid %d, not root", dir, st.Uid)
		case st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0:
			return fmt.Errorf("state_dir: %s is writable by others (mode %04o)", dir, st.Mode&0o7777)
		case st.Mode&0o001 == 0:
			return fmt.Errorf("state_dir: %s is mode %04o: role users cannot pass through it to %s (every folder above state_dir needs o+x)", dir, st.Mode&0o7777, p)
		}
		if dir == "/" {
			return nil
		}
	}
}

// ensureFolder makes f, or puts its owner and mode back. It refuses a
// symlink or anything that is not a folder in its place.
func ensureFolder(f folder) error {
	var st unix.Stat_t
	err := unix.Lstat(f.path, &st)
	if errors.Is(err, unix.ENOENT) {
		if err := unix.Mkdir(f.path, 0o700); err != nil {
			return fmt.Errorf("%s: %w", f.path, err)
		}
		err = unix.Lstat(f.path, &st)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", f.path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("%s: is not a folder (mode %o)", f.path, st.Mode)
	}
	fd, err := unix.Open(f.path, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", f.path, err)
	}
	defer unix.Close(fd)
	if err := unix.Fchownat(fd, "", f.uid, f.gid, unix.AT_EMPTY_PATH); err != nil {
		return fmt.Errorf("%s: chown %d:%d: %w", f.path, f.uid, f.gid, err)
	}
	if err := unix.Chmod(fmt.Sprintf("/proc/self/fd/%d", fd), uint32(f.mode)); err != nil {
		return fmt.Errorf("%s: chmod %04o: %w", f.path, f.mode, err)
	}
	return nil
}

// prepareState makes the state dir's folders with their owners and modes,
// clears scratch of anything an earlier run left, and makes every role's
// HOME and TMPDIR afresh.
func (b *Broker) prepareState() error {
	if err := os.MkdirAll(filepath.Dir(b.cfg.StateDir), 0o755); err != nil {
		return fmt.Errorf("state_dir: %w", err)
	}
	for _, f := range b.layout() {
		if err := ensureFolder(f); err != nil {
			return fmt.Errorf("state: %w", err)
		}
	}
	if err := clearFolder(b.cfg.ScratchDir()); err != nil {
		return fmt.Errorf("scratch: %w", err)
	}
	for _, f := range b.scratchLayout() {
		if err := ensureFolder(f); err != nil {
			return fmt.Errorf("scratch: %w", err)
		}
	}
	return nil
}

// clearFolder removes everything inside dir. os.RemoveAll works through
// descriptors and never follows a symlink out of the tree.
func clearFolder(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
			return err
		}
	}
	return nil
}

// closedTmp is a shared temporary folder as it was before the broker
// closed it, so a clean stop, a refused start or the next start after a
// crash can put it back.
type closedTmp struct {
	Path string `json:"path"`
	UID  int    `json:"uid"`
	GID  int    `json:"gid"`
	Mode uint32 `json:"mode"`
}

// closedTmpRecord is where the places' modes before closing are kept while
// they are closed: root's, in the broker's folder, found by the next start.
func (b *Broker) closedTmpRecord() string {
	return filepath.Join(b.cfg.BrokerDir(), "closed-tmp.json")
}

// closeTmp makes each shared temporary place root's alone (0700): no role
// can write it or read what is in it. Each role has its own TMPDIR. The
// modes it found are written down, synced, before the first one changes.
func (b *Broker) closeTmp() error {
	var found []closedTmp
	for _, p := range b.cfg.ClosedTmp {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			if errors.Is(err, unix.ENOENT) {
				b.log.Info("closed_tmp folder does not exist; nothing to close", "path", p)
				continue
			}
			return fmt.Errorf("closed_tmp: %s: %w", p, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return fmt.Errorf("closed_tmp: %s is not a folder", p)
		}
		found = append(found, closedTmp{p, int(st.Uid), int(st.Gid), st.Mode & 0o7777})
	}
	if err := writeFileSynced(b.closedTmpRecord(), found); err != nil {
		return fmt.Errorf("closed_tmp: record the modes: %w", err)
	}
	b.closed.places, b.closed.recorded = found, true
	for _, c := range found {
		if err := ensureFolder(folder{c.Path, 0, 0, 0o700}); err != nil {
			return fmt.Errorf("closed_tmp: %w", err)
		}
	}
	return nil
}

// reopenTmp puts the shared temporary places back as they were, then
// forgets the record. It says whether every place is back.
func (b *Broker) reopenTmp() bool {
	if !b.closed.recorded {
		return true
	}
	ok := true
	for _, c := range b.closed.places {
		if err := ensureFolder(folder{c.Path, c.UID, c.GID, os.FileMode(c.Mode)}); err != nil {
			ok = false
			b.log.Warn("could not reopen closed_tmp folder", "path", c.Path, "err", err)
		}
	}
	if !ok {
		return false // the record stays for the next start
	}
	b.closed.places, b.closed.recorded = nil, false
	if err := os.Remove(b.closedTmpRecord()); err != nil && !errors.Is(err, os.ErrNotExist) {
		b.log.Warn("closed_tmp record", "err", err)
	}
	return true
}

// restoreClosedTmp puts back the places an earlier broker closed and never
// reopened (it was killed): their modes from before are in the record, and
// the places' present 0700 must not be taken for them.
func (b *Broker) restoreClosedTmp() error {
	fd, err := unix.Open(b.closedTmpRecord(), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("closed_tmp: %s: %w", b.closedTmpRecord(), err)
	}
	f := os.NewFile(uintptr(fd), b.closedTmpRecord())
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("closed_tmp: %s: %w", f.Name(), err)
	}
	if st.Uid != 0 || st.Mode&0o077 != 0 || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("closed_tmp: %s is not root's alone (uid %d, mode %04o): not trusted to restore modes", f.Name(), st.Uid, st.Mode&0o7777)
	}
	var rec []closedTmp
	if err := json.NewDecoder(io.LimitReader(f, 1<<20)).Decode(&rec); err != nil {
		return fmt.Errorf("closed_tmp: %s: %w", f.Name(), err)
	}
	b.log.Warn("an earlier broker left the shared temporary places closed; restoring their modes", "record", f.Name(), "places", len(rec))
	b.closed.places, b.closed.recorded = rec, true
	if !b.reopenTmp() {
		return fmt.Errorf("closed_tmp: could not restore the places recorded in %s", f.Name())
	}
	return nil
}

// writeFileSynced writes v as JSON to path (root's, 0600) through a
// temporary file, synced and renamed, with the folder synced after.
func writeFileSynced(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".new"
	os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	f.Close()
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// MaxSecret bounds one secret file.
const MaxSecret = 1 << 20

// readSecrets reads every secret file. It refuses to go on if the folder or
// any file in it can be read or written by anyone but root, or is anything
// but a plain file, and names the file and its mode.
func readSecrets(dir string) (map[string]string, error) {
	out := map[string]string{}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return out, nil
		}
		return nil, fmt.Errorf("secrets: %s: %w", dir, err)
	}
	if err := secretPerm(dir, &st, unix.S_IFDIR); err != nil {
		return nil, err
	}
	d, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("secrets: %w", err)
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("secrets: %s: %w", dir, err)
	}
	sort.Strings(names)
	for _, n := range names {
		p := filepath.Join(dir, n)
		fd, err := unix.Openat(int(d.Fd()), n, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			if errors.Is(err, unix.ELOOP) {
				return nil, fmt.Errorf("secrets: %s is a symlink: a secret must be a plain file", p)
			}
			return nil, fmt.Errorf("secrets: %s: %w", p, err)
		}
		f := os.NewFile(uintptr(fd), p)
		var fst unix.Stat_t
		if err := unix.Fstat(fd, &fst); err != nil {
			f.Close()
			return nil, fmt.Errorf("secrets: %s: %w", p, err)
		}
		if err := secretPerm(p, &fst, unix.S_IFREG); err != nil {
			f.Close()
			return nil, err
		}
		data, err := io.ReadAll(io.LimitReader(f, MaxSecret+1))
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("secrets: %s: %w", p, err)
		}
		if len(data) > MaxSecret {
			return nil, fmt.Errorf("secrets: %s is over %d bytes", p, MaxSecret)
		}
		out[n] = strings.TrimRight(string(data), "\n")
	}
	return out, nil
}

// secretPerm is the rule for the secrets folder and every file in it:
// root's, of the expected type, and no bit at all for group or others.
func secretPerm(p string, st *unix.Stat_t, typ uint32) error {
	if st.Mode&unix.S_IFMT != typ {
		kind := "plain file"
		if typ == unix.S_IFDIR {
			kind = "folder"
		}
		return fmt.Errorf("secrets: %s is not a %s", p, kind)
	}
	if st.Uid != 0 {
		return fmt.Errorf("secrets: %s is owned by uid %d: it must be root's", p, st.Uid)
	}
	if st.Mode&0o077 != 0 {
		return fmt.Errorf("secrets: %s is mode %04o: only root may read or write it (0600 or 0400, folder 0700)", p, st.Mode&0o7777)
	}
	return nil
}
