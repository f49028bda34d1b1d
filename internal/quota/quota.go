//go:build linux

// Package quota reads a user's usage from the file system's own user
// quota accounting (ext4 with the quota feature or usrquota, XFS with
// uquota or uqnoenforce, tmpfs with usrquota on 6.6 and later): one
// quotactl per user, whatever the size of the user's trees. The kernel
// charges every block and inode a user owns on the file system, files
// unlinked but still open included, until they are freed.
package quota

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"thermite/internal/mountinfo"
	"thermite/internal/threadcred"
)

// From linux/quota.h: the Q_GETQUOTA command and its answer.
const (
	qGetQuota = 0x800007
	usrQuota  = 0
	subShift  = 8
)

// dqblk is struct if_dqblk.
type dqblk struct {
	bHardLimit, bSoftLimit, curSpace  uint64
	iHardLimit, iSoftLimit, curInodes uint64
	bTime, iTime                      uint64
	valid                             uint32
	_                                 uint32
}

// Usage is what a user owns on one file system.
type Usage struct {
	Bytes  int64 // space charged, in bytes (allocated and reserved blocks)
	Inodes int64
}

// Sub is u less v.
func (u Usage) Sub(v Usage) Usage { return Usage{u.Bytes - v.Bytes, u.Inodes - v.Inodes} }

// Add is u plus v.
func (u Usage) Add(v Usage) Usage { return Usage{u.Bytes + v.Bytes, u.Inodes + v.Inodes} }

// FS is a file system with user quota accounting on.
type FS struct {
	dir    *os.File // a folder on it, held open: quotactl_fd's handle
	Dev    uint64   // st_dev of every file on it
	Type   string   // as /proc/self/mountinfo names it: ext4, xfs, tmpfs
	Source string   // the mount's source: /dev/vdb, tmpfs
	Mount  string   // where it is mounted
}

// String is how status names it: "ext4 user quota on /dev/vdb at /var/lib/thermite".
func (f *FS) String() string {
	return fmt.Sprintf("%s user quota on %s at %s", f.Type, f.Source, f.Mount)
}

// NotOnError says why a file system's user quotas cannot be read.
type NotOnError struct {
	Path string
	Err  error
}

func (e *NotOnError) Error() string {
	why := e.Err.Error()
	switch {
	case errors.Is(e.Err, unix.ENOSYS):
		why = "no quota support in this file system or kernel (ENOSYS; quotactl_fd needs Linux 5.14)"
	case errors.Is(e.Err, unix.ESRCH):
		why = "user quotas are not on for it (ESRCH)"
	case errors.Is(e.Err, unix.EOPNOTSUPP), errors.Is(e.Err, unix.ENOTTY), errors.Is(e.Err, unix.EINVAL):
		why = fmt.Sprintf("it has no user quotas (%v)", e.Err)
	}
	return fmt.Sprintf("%s: %s", e.Path, why)
}

func (e *NotOnError) Unwrap() error { return e.Err }

// Probe opens the file system that holds dir and asks it for root's user
// quota. A file system without user quota accounting answers with a
// *NotOnError; the caller then measures by walking, as before.
func Probe(dir string) (*FS, error) {
	f, err := os.OpenFile(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("quota: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("quota: %s: %w", dir, err)
	}
	fs := &FS{dir: f, Dev: st.Dev}
	if _, err := fs.get(unix.Geteuid()); err != nil {
		f.Close()
		return nil, &NotOnError{Path: dir, Err: err}
	}
	fs.Type, fs.Source, fs.Mount = mountOf("/proc/self/mountinfo", st.Dev)
	return fs, nil
}

// Close lets the file system go.
func (f *FS) Close() error { return f.dir.Close() }

// Of is what uid owns on the file system now.
//
// Reading another user's quota takes CAP_SYS_ADMIN, which the broker does
// not keep; a user may read its own. So the read runs with uid as its
// effective uid on a thread of its own for that one call
// (threadcred.As); quotactl asks the uid alone, so the gid stays.
func (f *FS) Of(uid int) (Usage, error) {
	var d dqblk
	err := threadcred.As(uid, unix.Getegid(), func() error {
		var err error
		d, err = f.get(uid)
		return err
	})
	if err != nil {
		return Usage{}, fmt.Errorf("quota of uid %d on %s: %w", uid, f.Source, err)
	}
	return Usage{Bytes: int64(d.curSpace), Inodes: int64(d.curInodes)}, nil
}

func (f *FS) get(uid int) (dqblk, error) {
	var d dqblk
	_, _, e := unix.Syscall6(unix.SYS_QUOTACTL_FD, f.dir.Fd(), uintptr(qGetQuota<<subShift|usrQuota), uintptr(uid), uintptr(unsafe.Pointer(&d)), 0, 0)
	if e != 0 {
		return d, e
	}
	return d, nil
}

// mountOf finds the mount of device dev: its type, source and mount point.
func mountOf(path string, dev uint64) (fstype, source, mount string) {
	fstype, source, mount = "?", "?", "?"
	mi, err := os.ReadFile(path)
	if err != nil {
		return
	}
	want := fmt.Sprintf("%d:%d", unix.Major(dev), unix.Minor(dev))
	for _, m := range mountinfo.Parse(string(mi)) {
		if m.Device != want {
			continue
		}
		// The first mount of the device whose root is the file system's
		// own: a bind mount of a folder of it names that folder.
		if m.Root == "/" || mount == "?" {
			fstype, source, mount = m.Type, m.Source, m.Point
			if m.Root == "/" {
				return
			}
		}
	}
	return
}
