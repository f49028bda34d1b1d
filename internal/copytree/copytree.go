// Package copytree copies a folder: reflinks where the file system can
// (FICLONE), a real copy otherwise. It never follows a symlink: symlinks
// are copied as symlinks, and devices, FIFOs and sockets are skipped.
// Set-id bits never survive the copy.
package copytree

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Stats says what a copy did.
type Stats struct {
	Files, Dirs, Symlinks, Skipped int
	Bytes                          int64
	Reflinked                      int
}

// Options shape a copy.
type Options struct {
	// UID and GID, when not -1, own everything copied (the caller must be
	// able to chown).
	UID, GID int
	// ReadOnly takes every write bit away: files 0444 or 0555, folders 0555.
	ReadOnly bool
	// MaxBytes bounds the copy (0: no bound).
	MaxBytes int64
	// RefuseLinks refuses a regular file with more than one link: a copy
	// made as root of a tree a role wrote must not read a file the role
	// hard-linked in from elsewhere.
	RefuseLinks bool
	// TopOwned, with TopUID and TopGID, gives the top folder an owner of
	// its own: a trial's workspace is imported with everything the lane's
	// but its top the controller's, so that the controller can move it
	// into place (moving a folder to another parent needs write access to
	// the folder itself) and the broker then hands over only the top.
	TopOwned       bool
	TopUID, TopGID int
	// Progress, when set, is called after each file with the running
	// counts.
	Progress func(files int, bytes int64)
}

// Copy copies the folder src to dst, which must not exist.
func Copy(src, dst string, o Options) (Stats, error) {
	parent, err := os.Open(filepath.Dir(dst))
	if err != nil {
		return Stats{}, fmt.Errorf("copy: %w", err)
	}
	defer parent.Close()
	return CopyAt(src, parent, filepath.Base(dst), o)
}

// CopyAt copies the folder src to name in the open folder parent; name
// must not exist. The copy is made relative to parent's descriptor, so no
// name above it is looked up again.
func CopyAt(src string, parent *os.File, name string, o Options) (Stats, error) {
	var st Stats
	dst := filepath.Join(parent.Name(), name)
	sfd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return st, fmt.Errorf("copy: %s: %w", src, err)
	}
	defer unix.Close(sfd)
	var sst unix.Stat_t
	if err := unix.Fstat(sfd, &sst); err != nil {
		return st, fmt.Errorf("copy: %s: %w", src, err)
	}
	if err := unix.Mkdirat(int(parent.Fd()), name, 0o700); err != nil {
		return st, fmt.Errorf("copy: %s: %w", dst, err)
	}
	dfd, err := unix.Openat(int(parent.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return st, fmt.Errorf("copy: %s: %w", dst, err)
	}
	defer unix.Close(dfd)
	if err := copyDir(sfd, dfd, src, dst, o, &st); err != nil {
		return st, err
	}
	top := o
	if o.TopOwned {
		top.UID, top.GID = o.TopUID, o.TopGID
	}
	if err := finish(dfd, "", dirMode(sst.Mode, o), top); err != nil {
		return st, fmt.Errorf("copy: %s: %w", dst, err)
	}
	st.Dirs++
	return st, nil
}

func dirMode(m uint32, o Options) uint32 {
	mode := m&0o777 | 0o700 // the owner can always walk what it was given
	if o.ReadOnly {
		mode = (mode &^ 0o222) | 0o555
	}
	return mode
}

func fileMode(m uint32, o Options) uint32 {
	mode := m & 0o777
	if o.ReadOnly {
		mode = (mode &^ 0o222) | 0o444
		if m&0o111 != 0 {
			mode |= 0o111
		}
	}
	return mode
}

// finish sets owner and mode on an entry of dfd (name "" is dfd itself).
func finish(dfd int, name string, mode uint32, o Options) error {
	flags := unix.AT_SYMLINK_NOFOLLOW
	if name == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	if o.UID >= 0 || o.GID >= 0 {
		if err := unix.Fchownat(dfd, name, o.UID, o.GID, flags); err != nil {
			return err
		}
	}
	if name == "" {
		return unix.Fchmod(dfd, mode)
	}
	return unix.Fchmodat(dfd, name, mode, 0)
}

func copyDir(sfd, dfd int, src, dst string, o Options, st *Stats) error {
	// Readdirnames on a duplicate, so closing it leaves sfd open. The
	// duplicate is close-on-exec from the start: a fork by another
	// goroutine (os/exec in the controller) must not inherit it.
	dup, err := unix.FcntlInt(uintptr(sfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return err
	}
	df := os.NewFile(uintptr(dup), src)
	names, err := df.Readdirnames(-1)
	df.Close()
	if err != nil {
		return fmt.Errorf("copy: %s: %w", src, err)
	}
	for _, n := range names {
		sp, dp := filepath.Join(src, n), filepath.Join(dst, n)
		var s unix.Stat_t
		if err := unix.Fstatat(sfd, n, &s, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return fmt.Errorf("copy: %s: %w", sp, err)
		}
		switch s.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if err := unix.Mkdirat(dfd, n, 0o700); err != nil {
				return fmt.Errorf("copy: %s: %w", dp, err)
			}
			csfd, err := unix.Openat(sfd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("copy: %s: %w", sp, err)
			}
			cdfd, err := unix.Openat(dfd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				unix.Close(csfd)
				return fmt.Errorf("copy: %s: %w", dp, err)
			}
			err = copyDir(csfd, cdfd, sp, dp, o, st)
			if err == nil {
				err = finish(cdfd, "", dirMode(s.Mode, o), o)
			}
			unix.Close(csfd)
			unix.Close(cdfd)
			if err != nil {
				return err
			}
			st.Dirs++
		case unix.S_IFREG:
			if o.RefuseLinks && s.Nlink > 1 {
				return fmt.Errorf("copy: %s has %d links: refusing to copy a hard-linked file", sp, s.Nlink)
			}
			if o.MaxBytes > 0 && st.Bytes+s.Size > o.MaxBytes {
				return fmt.Errorf("copy: %s: the copy would pass its limit of %d bytes", sp, o.MaxBytes)
			}
			reflinked, err := copyFile(sfd, dfd, n, sp, dp, o, s)
			if err != nil {
				return err
			}
			if err := finish(dfd, n, fileMode(s.Mode, o), o); err != nil {
				return fmt.Errorf("copy: %s: %w", dp, err)
			}
			st.Files++
			st.Bytes += s.Size
			if reflinked {
				st.Reflinked++
			}
			if o.Progress != nil {
				o.Progress(st.Files, st.Bytes)
			}
		case unix.S_IFLNK:
			buf := make([]byte, unix.PathMax)
			k, err := unix.Readlinkat(sfd, n, buf)
			if err != nil {
				return fmt.Errorf("copy: %s: %w", sp, err)
			}
			if err := unix.Symlinkat(string(buf[:k]), dfd, n); err != nil {
				return fmt.Errorf("copy: %s: %w", dp, err)
			}
			if o.UID >= 0 || o.GID >= 0 {
				unix.Fchownat(dfd, n, o.UID, o.GID, unix.AT_SYMLINK_NOFOLLOW)
			}
			st.Symlinks++
		default:
			st.Skipped++
		}
	}
	return nil
}

// copyFile copies one regular file: FICLONE first, then its data ranges
// (Data), holes kept.
func copyFile(sfd, dfd int, name, sp, dp string, o Options, want unix.Stat_t) (bool, error) {
	// O_NONBLOCK: a FIFO swapped in after the check must not hang the copy.
	in, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("copy: %s: %w", sp, err)
	}
	fin := os.NewFile(uintptr(in), sp)
	defer fin.Close()
	var got unix.Stat_t
	if err := unix.Fstat(in, &got); err != nil {
		return false, fmt.Errorf("copy: %s: %w", sp, err)
	}
	if got.Mode&unix.S_IFMT != unix.S_IFREG || got.Ino != want.Ino || got.Dev != want.Dev || (o.RefuseLinks && got.Nlink > 1) {
		return false, fmt.Errorf("copy: %s changed while it was copied", sp)
	}
	out, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return false, fmt.Errorf("copy: %s: %w", dp, err)
	}
	fout := os.NewFile(uintptr(out), dp)
	defer fout.Close()
	if unix.IoctlFileClone(out, in) == nil {
		return true, nil
	}
	if err := Data(fout, fin); err != nil {
		return false, fmt.Errorf("copy: %s: %w", dp, err)
	}
	return false, nil
}

// Data copies what in holds into out, an empty file, keeping its holes
// holes: only the ranges SEEK_DATA finds are read and written, and out is
// then made in's size. A sparse file a role made (truncate -s 1T) copies
// as the blocks it has, not as its apparent size in zeros, which would
// fill the disk. Where the file system cannot say where data lies, the
// whole file is copied.
func Data(out, in *os.File) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(in.Fd()), &st); err != nil {
		return err
	}
	for pos := int64(0); pos < st.Size; {
		start, err := unix.Seek(int(in.Fd()), pos, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // nothing but a hole from pos to the end
		}
		if errors.Is(err, unix.EINVAL) && pos == 0 {
			return copyAll(out, in)
		}
		if err != nil {
			return err
		}
		end, err := unix.Seek(int(in.Fd()), start, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		if _, err := in.Seek(start, io.SeekStart); err != nil {
			return err
		}
		if _, err := out.Seek(start, io.SeekStart); err != nil {
			return err
		}
		if _, err := io.CopyN(out, in, end-start); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		pos = end
	}
	return out.Truncate(st.Size)
}

// copyAll copies in whole into out, from the start.
func copyAll(out, in *os.File) error {
	if _, err := in.Seek(0, io.SeekStart); err != nil {
		return err
	}
	_, err := io.Copy(out, in)
	return err
}
