// Package confined does path operations that cannot leave a root folder:
// every lookup is openat2 with RESOLVE_BENEATH and RESOLVE_NO_SYMLINKS
// (OpenBeneath, the one confined open every package uses), and
// every change is made through a descriptor of the very file that was
// checked, so a role that swaps names for symlinks or hard links while the
// broker works cannot point it anywhere else.
package confined

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"thermite/internal/posixacl"
	"thermite/internal/weaken"
)

// Rel turns path, absolute or relative, into a path relative to root. It
// refuses an absolute path outside root; ".." and symlinks are left for
// Open to refuse, so that the error names what the kernel saw.
func Rel(root, path string) (string, error) {
	if path == "" {
		return "", fmt.Errorf("empty path")
	}
	if !filepath.IsAbs(path) {
		return path, nil
	}
	if path == root {
		return ".", nil
	}
	rel, ok := strings.CutPrefix(path, root+"/")
	if !ok || rel == "" {
		return "", fmt.Errorf("%s: not inside %s", path, root)
	}
	return rel, nil
}

// OpenRoot opens the root folder itself, refusing a symlink.
func OpenRoot(root string) (*os.File, error) {
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", root, err)
	}
	return os.NewFile(uintptr(fd), root), nil
}

// Open opens path beneath root with flags (O_CLOEXEC is added). The error
// names the path as the caller gave it.
func Open(root, path string, flags int) (*os.File, error) {
	rel, err := Rel(root, path)
	if err != nil {
		return nil, err
	}
	r, err := OpenRoot(root)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return OpenAt(r, rel, flags, path)
}

// OpenAt opens rel beneath the folder dir, refusing leaving it, any
// symlink, /proc's magic links and other mounts. name is what errors call
// it.
func OpenAt(dir *os.File, rel string, flags int, name string) (*os.File, error) {
	fd, err := OpenBeneath(int(dir.Fd()), rel, flags, 0, Strict)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, explain(err))
	}
	return os.NewFile(uintptr(fd), name), nil
}

// ErrEscape says a path left its root or went through a symlink.
var ErrEscape = errors.New("leaves its folder or goes through a symlink")

func explain(err error) error {
	switch {
	case errors.Is(err, unix.EXDEV), errors.Is(err, unix.ELOOP):
		return fmt.Errorf("%w (%v)", ErrEscape, err)
	}
	return err
}

// Stat is what a walk reports of each entry.
type Stat struct {
	Mode  uint32
	UID   uint32
	GID   uint32
	Nlink uint64
	Dev   uint64
	Ino   uint64
	// Blocks is the space allocated, in 512-byte units.
	Blocks int64
}

func statAt(dirfd int, name string) (Stat, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return Stat{}, err
	}
	return Stat{Mode: st.Mode, UID: st.Uid, GID: st.Gid, Nlink: uint64(st.Nlink), Dev: st.Dev, Ino: st.Ino, Blocks: st.Blocks}, nil
}

func fstat(fd int) (Stat, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Stat{}, err
	}
	return Stat{Mode: st.Mode, UID: st.Uid, GID: st.Gid, Nlink: uint64(st.Nlink), Dev: st.Dev, Ino: st.Ino, Blocks: st.Blocks}, nil
}

// visit is called for every entry below a walk's top, with the folder's
// descriptor and the entry's name in it. It may return errSkipDir for a
// folder it does not want entered.
type visit func(dirfd int, name, path string, st Stat) error

var errSkipDir = errors.New("skip this folder")

type dirent struct {
	name string
	typ  byte
}

// readDir lists a folder's entries, all at once, so that buf can be reused
// by the walk beneath.
func readDir(dir int, path string, buf []byte) ([]dirent, error) {
	var out []dirent
	for {
		n, err := unix.Getdents(dir, buf)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if n <= 0 {
			return out, nil
		}
		b := buf[:n]
		for len(b) > 0 {
			// struct linux_dirent64: ino u64, off s64, reclen u16, type u8, name.
			reclen := int(b[16]) | int(b[17])<<8
			typ := b[18]
			nameb := b[19:reclen]
			for i, c := range nameb {
				if c == 0 {
					nameb = nameb[:i]
					break
				}
			}
			b = b[reclen:]
			if name := string(nameb); name != "." && name != ".." {
				out = append(out, dirent{name, typ})
			}
		}
	}
}

// walk visits every entry beneath the open folder dir, depth first, never
// following a symlink: folders are entered with O_NOFOLLOW relative to
// their parent's descriptor.
func walk(dir int, path string, fn visit, buf []byte) error {
	w := &walker{fn: fn, buf: buf}
	return w.walk(dir, path, 0)
}

// walkCounting is walk that also hands fn each symlink (stat'ed, never
// followed): a measure of the space a tree takes counts them, as ext4
// gives a target over 60 bytes a block of its own.
func walkCounting(dir int, path string, fn visit, buf []byte) error {
	w := &walker{fn: fn, buf: buf, links: !(weaken.Enabled && weaken.Has(weaken.DiskSymlinks))}
	return w.walk(dir, path, 0)
}

// Bounds of every walk: a role that builds a tree deeper or larger than
// this in its folders cannot make the broker's walks use unbounded memory,
// descriptors or time; the walk stops with ErrTooBig, which callers treat
// as the worst case.
const (
	MaxDepth   = 256
	MaxEntries = 4_000_000
)

// ErrTooBig is a tree past MaxDepth or MaxEntries.
var ErrTooBig = errors.New("too deep or too large to walk")

type walker struct {
	fn      visit
	buf     []byte
	entries int
	links   bool // symlinks go to fn too (walkCounting)
}

func (w *walker) walk(dir int, path string, depth int) error {
	if depth >= MaxDepth {
		return fmt.Errorf("%s: %w (more than %d levels)", path, ErrTooBig, MaxDepth)
	}
	fn, buf := w.fn, w.buf
	ents, err := readDir(dir, path, buf)
	if err != nil {
		return err
	}
	w.entries += len(ents)
	if w.entries > MaxEntries {
		return fmt.Errorf("%s: %w (more than %d entries)", path, ErrTooBig, MaxEntries)
	}
	for _, e := range ents {
		if e.typ == unix.DT_LNK && !w.links {
			continue // symlinks are never followed nor changed
		}
		child := path + "/" + e.name
		st, err := statAt(dir, e.name)
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // removed while we walked
			}
			return fmt.Errorf("%s: %w", child, err)
		}
		err = fn(dir, e.name, child, st)
		if errors.Is(err, errSkipDir) {
			continue
		}
		if err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		sub, err := unix.Openat(dir, e.name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				continue // swapped or removed while we walked: not ours to follow
			}
			return fmt.Errorf("%s: %w", child, err)
		}
		err = w.walk(sub, child, depth+1)
		unix.Close(sub)
		if err != nil {
			return err
		}
	}
	return nil
}

// openEntry opens an entry for changing its metadata only (O_PATH), and
// checks that it is still the entry that was stat'ed.
func openEntry(dirfd int, name string, want Stat) (int, Stat, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, Stat{}, err
	}
	st, err := fstat(fd)
	if err != nil {
		unix.Close(fd)
		return -1, Stat{}, err
	}
	if st.Dev != want.Dev || st.Ino != want.Ino {
		unix.Close(fd)
		return -1, Stat{}, fmt.Errorf("replaced while being checked")
	}
	return fd, st, nil
}

// chmodFD changes the mode of the file an O_PATH descriptor holds: through
// /proc/self/fd, which resolves to exactly that inode, never to a new name.
func chmodFD(fd int, mode uint32) error {
	return unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), mode)
}

// chownFD changes the owner of the file an O_PATH descriptor holds.
func chownFD(fd, uid, gid int) error {
	return unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW)
}

const setIDBits = unix.S_ISUID | unix.S_ISGID

// clearsLinkedSetID decides whether a set-id file with more than one link
// loses its bits: yes when a role whose tree is being swept or handed back
// (isRole) owns it. Its other links can only be a role's own doing
// (fs.protected_hardlinks lets a user link a set-id file only when it owns
// it), and keeping the bits would let a lane keep a set-id program by
// linking it twice. A linked file of another owner is not the role's to
// change: it stays skipped and reported.
func clearsLinkedSetID(st Stat, isRole func(uid int) bool) bool {
	if weaken.Enabled && weaken.Has(weaken.SetID) {
		return false
	}
	return st.Mode&unix.S_IFMT == unix.S_IFREG && st.Mode&setIDBits != 0 && isRole(int(st.UID))
}

// published is a mode everyone can read and nobody can write: folders
// 0555, files 0444, or 0555 when the owner could run them.
func published(mode uint32, dir bool) uint32 {
	if dir || mode&0o100 != 0 {
		return 0o555
	}
	return 0o444
}

// ClearSetID takes set-user and set-group bits off every file and folder
// beneath top (and top itself) that uid owns, hard-linked files included
// (see clearsLinkedSetID). It never follows a symlink and changes a file
// only through a descriptor of the entry it checked. It skips, and reports,
// set-id entries with another owner.
func ClearSetID(top *os.File, uid int) (cleared, skipped []string, scanned int, err error) {
	fix := func(fd int, st Stat, path string) {
		switch {
		case st.Mode&setIDBits == 0:
		case int(st.UID) != uid:
			skipped = append(skipped, path+": owned by uid "+strconv.Itoa(int(st.UID)))
		case st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Mode&unix.S_IFMT != unix.S_IFREG:
			// Set-id bits on a FIFO or socket grant nothing; leave it.
		case st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Nlink > 1 && !clearsLinkedSetID(st, func(u int) bool { return u == uid }):
			// Only uid's own files get here, which clearsLinkedSetID clears
			// unless a thermite_weaken build says otherwise.
			skipped = append(skipped, path+": has "+strconv.FormatUint(st.Nlink, 10)+" links")
		default:
			if e := chmodFD(fd, st.Mode&0o7777&^setIDBits); e != nil {
				skipped = append(skipped, path+": "+e.Error())
				return
			}
			cleared = append(cleared, path)
		}
	}
	tst, err := fstat(int(top.Fd()))
	if err != nil {
		return nil, nil, 0, err
	}
	scanned = 1
	fix(int(top.Fd()), tst, top.Name())
	dir, err := reopenDir(top)
	if err != nil {
		return cleared, skipped, scanned, err
	}
	defer unix.Close(dir)
	buf := walkBuf()
	defer putWalkBuf(buf)
	err = walk(dir, top.Name(), func(dirfd int, name, path string, st Stat) error {
		scanned++
		if st.Mode&setIDBits == 0 {
			return nil
		}
		fd, cur, err := openEntry(dirfd, name, st)
		if err != nil {
			skipped = append(skipped, path+": "+err.Error())
			return nil
		}
		fix(fd, cur, path)
		unix.Close(fd)
		return nil
	}, buf)
	return cleared, skipped, scanned, err
}

// walkBufs are the walks' directory-read buffers, kept between walks: the
// broker sweeps a role's folders after every command.
var walkBufs = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

func walkBuf() []byte { return *walkBufs.Get().(*[]byte) }

func putWalkBuf(b []byte) { walkBufs.Put(&b) }

// reopenDir opens a readable descriptor of the folder top holds (which may
// be O_PATH): "." beneath it is that folder itself, so no name is resolved
// again (and no /proc lookup is paid).
func reopenDir(top *os.File) (int, error) {
	fd, err := unix.Openat(int(top.Fd()), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("%s: %w", top.Name(), err)
	}
	return fd, nil
}

// Hand says what ChownTree does to a tree.
type Hand struct {
	// UID and GID own every entry beneath the top once handed.
	UID, GID int
	// TopUID owns the top folder itself, with GID as its group: UID for a
	// folder handed whole, another (the controller's) for a top the role
	// may write in through its group but not open to other roles.
	TopUID int
	// Allowed says which current owners may be handed on: anything else
	// (root's files, or a hard link a role made to a file elsewhere) is
	// skipped and reported, so that the broker never gives away a file
	// that was not in the tree.
	Allowed func(uid int) bool
	// ReadOnly takes every write bit away.
	ReadOnly bool
	// Publish makes the tree readable by all and writable by none, and
	// removes every FIFO, socket and device node in it (a FIFO that every
	// role may open would stall each reader that opens it) and every file
	// it cannot hand (one with more than one link, or of an owner Allowed
	// refuses), which would stay its role's with the role's mode; and it
	// takes every POSIX ACL off, so that its modes alone say who reads.
	Publish bool
	// TopMode is the top folder's mode; 0 keeps it.
	TopMode uint32
}

// Handed is what ChownTree did.
type Handed struct {
	Changed int
	Skipped []string
	// Removed are the paths of what a publish took away (Hand.Publish).
	Removed []string
}

// special says whether a file type is one a publish removes: a FIFO, a
// socket or a device node, which hold no content of their own.
func special(typ uint32) bool {
	return typ == unix.S_IFIFO || typ == unix.S_IFSOCK || typ == unix.S_IFCHR || typ == unix.S_IFBLK
}

// unpublishable decides what a publish removes rather than hands on: a
// special file, and a regular file that ChownTree would skip (more than
// one link, which may live outside the tree; an owner that is not a
// role's), which would stay in the published tree its role's, with the
// mode and ACL the role gave it (0666: writable by every role's DAC).
func unpublishable(st Stat, allowed func(uid int) bool) bool {
	typ := st.Mode & unix.S_IFMT
	return special(typ) || typ == unix.S_IFREG && (st.Nlink > 1 || !allowed(int(st.UID)))
}

// aclAttrs are the extended attributes that hold a file's POSIX ACLs.
var aclAttrs = []string{posixacl.Attr, posixacl.DefaultAttr}

// dropACLs takes every POSIX ACL off the file an O_PATH descriptor holds
// (through /proc/self/fd, as chmodFD), so that its mode alone decides:
// an entry naming a user could keep a published file from that user, and
// a folder's default ACL would give what is made in it later to another.
// A file system that keeps no ACL has none to take.
func dropACLs(fd int) error {
	for _, a := range aclAttrs {
		err := unix.Removexattr("/proc/self/fd/"+strconv.Itoa(fd), a)
		if err != nil && !errors.Is(err, unix.ENODATA) && !errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("removing its %s: %w", a, err)
		}
	}
	return nil
}

// ChownTree gives top and everything beneath it to h.UID:h.GID (the top
// to h.TopUID:h.GID). Set-id bits always go, also from a skipped
// hard-linked file that a role owns.
func ChownTree(top *os.File, h Hand) (res Handed, err error) {
	readOnly := h.ReadOnly || h.Publish
	apply := func(fd int, st Stat, path string) {
		typ := st.Mode & unix.S_IFMT
		switch {
		case !h.Allowed(int(st.UID)):
			res.Skipped = append(res.Skipped, path+": owned by uid "+strconv.Itoa(int(st.UID)))
			return
		case typ != unix.S_IFDIR && st.Nlink > 1:
			// Never handed on: its other links may live outside. Its set-id
			// bits go all the same when a role owns it.
			note := path + ": has " + strconv.FormatUint(st.Nlink, 10) + " links"
			if clearsLinkedSetID(st, h.Allowed) {
				if e := chmodFD(fd, st.Mode&0o7777&^setIDBits); e != nil {
					note += "; clearing its set-id bits: " + e.Error()
				} else {
					note += "; set-id bits cleared"
				}
			}
			res.Skipped = append(res.Skipped, note)
			return
		case typ == unix.S_IFLNK:
			return
		}
		if e := chownFD(fd, h.UID, h.GID); e != nil {
			res.Skipped = append(res.Skipped, path+": "+e.Error())
			return
		}
		if h.Publish {
			if e := dropACLs(fd); e != nil {
				res.Skipped = append(res.Skipped, path+": "+e.Error())
				return
			}
		}
		mode := st.Mode & 0o7777 &^ setIDBits
		if readOnly {
			mode &^= 0o222
		}
		if h.Publish {
			mode = published(mode, typ == unix.S_IFDIR)
		}
		if typ == unix.S_IFDIR || typ == unix.S_IFREG {
			if e := chmodFD(fd, mode); e != nil {
				res.Skipped = append(res.Skipped, path+": "+e.Error())
				return
			}
		}
		res.Changed++
	}
	tst, err := fstat(int(top.Fd()))
	if err != nil {
		return res, err
	}
	if tst.Mode&unix.S_IFMT != unix.S_IFDIR {
		return res, fmt.Errorf("%s: not a folder", top.Name())
	}
	dir, err := reopenDir(top)
	if err != nil {
		return res, err
	}
	defer unix.Close(dir)
	err = walk(dir, top.Name(), func(dirfd int, name, path string, st Stat) error {
		if h.Publish && unpublishable(st, h.Allowed) {
			if e := unix.Unlinkat(dirfd, name, 0); e != nil && !errors.Is(e, unix.ENOENT) {
				res.Skipped = append(res.Skipped, path+": removing it: "+e.Error())
			} else {
				res.Removed = append(res.Removed, path)
			}
			return nil
		}
		fd, cur, err := openEntry(dirfd, name, st)
		if err != nil {
			res.Skipped = append(res.Skipped, path+": "+err.Error())
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				return errSkipDir
			}
			return nil
		}
		apply(fd, cur, path)
		unix.Close(fd)
		if cur.Mode&unix.S_IFMT == unix.S_IFDIR && !h.Allowed(int(cur.UID)) {
			return errSkipDir
		}
		return nil
	}, make([]byte, 64<<10))
	if err != nil {
		return res, err
	}
	// The top changes hands last, so that the new owner has no way in
	// before everything beneath is its own.
	if !h.Allowed(int(tst.UID)) {
		res.Skipped = append(res.Skipped, top.Name()+": owned by uid "+strconv.Itoa(int(tst.UID)))
		return res, nil
	}
	if err := chownFD(int(top.Fd()), h.TopUID, h.GID); err != nil {
		return res, fmt.Errorf("%s: %w", top.Name(), err)
	}
	if h.Publish {
		if err := dropACLs(int(top.Fd())); err != nil {
			return res, fmt.Errorf("%s: %w", top.Name(), err)
		}
	}
	mode := tst.Mode & 0o7777 &^ setIDBits
	if h.TopMode != 0 {
		mode = h.TopMode
	}
	if readOnly {
		mode &^= 0o222
	}
	if h.Publish {
		mode = published(mode, true)
	}
	if err := chmodFD(int(top.Fd()), mode); err != nil {
		return res, fmt.Errorf("%s: %w", top.Name(), err)
	}
	res.Changed++
	return res, nil
}

// Usage is what lies beneath top, and top itself: allocated bytes (blocks,
// so sparse files count what they use) and entries. It never follows a
// symlink, and counts each one's own blocks: ext4 stores a target over 60
// bytes in a block, so a tree of long symlinks would otherwise hold 4 KiB
// each unseen.
func Usage(top *os.File) (bytes, entries int64, err error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(top.Fd()), &st); err != nil {
		return 0, 0, err
	}
	bytes, entries = st.Blocks*512, 1
	dir, err := reopenDir(top)
	if err != nil {
		return bytes, entries, err
	}
	defer unix.Close(dir)
	// Each entry is stat'ed once, by the walk itself.
	buf := walkBuf()
	defer putWalkBuf(buf)
	// Symlinks too: a long target takes a block of its own.
	err = walkCounting(dir, top.Name(), func(dirfd int, name, path string, s Stat) error {
		bytes += s.Blocks * 512
		entries++
		return nil
	}, buf)
	return bytes, entries, err
}
