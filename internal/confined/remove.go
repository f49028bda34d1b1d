package confined

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// removeDepth is how deep RemoveTree descends before it moves a folder up
// to the top of the tree: a role may nest folders far deeper than a walk
// may hold descriptors, and renaming within the tree costs nothing.
const removeDepth = 64

// RemoveTree removes the entry name in the open folder parent and, when it
// is a folder, everything beneath it. Every step is relative to a
// descriptor and never follows a symlink, so a tree of any depth or shape
// is removed without leaving it. It returns how many entries it removed.
func RemoveTree(parent *os.File, name string) (removed int64, err error) {
	pfd := int(parent.Fd())
	err = unix.Unlinkat(pfd, name, 0)
	if err == nil {
		return 1, nil
	}
	if errors.Is(err, unix.ENOENT) {
		return 0, nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	top, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	r := &remover{top: top, buf: make([]byte, 64<<10)}
	// Folders found too deep are moved to the top and emptied on a later
	// pass; each pass removes everything within reach, so this ends.
	for {
		r.moved = 0
		if err := r.empty(top, name, 0); err != nil {
			unix.Close(top)
			return r.removed, err
		}
		if r.moved == 0 {
			break
		}
	}
	unix.Close(top)
	if err := unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR); err != nil {
		return r.removed, fmt.Errorf("%s: %w", name, err)
	}
	return r.removed + 1, nil
}

type remover struct {
	top     int
	buf     []byte
	removed int64
	moved   int
	seq     int
}

// empty removes everything inside the open folder dir.
func (r *remover) empty(dir int, path string, depth int) error {
	// The top folder is read again on every pass: from its start.
	if _, err := unix.Seek(dir, 0, 0); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	ents, err := readDir(dir, path, r.buf)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.typ != unix.DT_DIR && e.typ != unix.DT_UNKNOWN {
			if err := unix.Unlinkat(dir, e.name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("%s/%s: %w", path, e.name, err)
			}
			r.removed++
			continue
		}
		if depth+1 >= removeDepth {
			for {
				r.seq++
				up := ".thermite-deep-" + strconv.Itoa(r.seq)
				err := unix.Renameat2(dir, e.name, r.top, up, unix.RENAME_NOREPLACE)
				if errors.Is(err, unix.EEXIST) {
					continue
				}
				if err != nil {
					return fmt.Errorf("%s/%s: move up: %w", path, e.name, err)
				}
				break
			}
			r.moved++
			continue
		}
		sub, err := unix.Openat(dir, e.name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			// DT_UNKNOWN that is not a folder.
			if err := unix.Unlinkat(dir, e.name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("%s/%s: %w", path, e.name, err)
			}
			r.removed++
			continue
		}
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%s/%s: %w", path, e.name, err)
		}
		err = r.empty(sub, path+"/"+e.name, depth+1)
		unix.Close(sub)
		if err != nil {
			return err
		}
		if err := unix.Unlinkat(dir, e.name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("%s/%s: %w", path, e.name, err)
		}
		r.removed++
	}
	return nil
}
