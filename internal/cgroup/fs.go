package cgroup

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// FileError is a failed filesystem operation on a cgroup file or directory.
// It always names the path, and for a write the value written:
//
//	cgroup: /sys/fs/cgroup/memory/thermite/x/memory.limit_in_bytes: write 100000: device or resource busy
type FileError struct {
	Op   string // mkdir, rmdir, write, read, open, statfs
	Path string
	Data string // for a write: what was written
	Err  error  // usually a unix.Errno
}

func (e *FileError) Error() string {
	if e.Op == "write" {
		return fmt.Sprintf("cgroup: %s: write %s: %v", e.Path, strings.TrimSpace(e.Data), e.Err)
	}
	return fmt.Sprintf("cgroup: %s: %s: %v", e.Path, e.Op, e.Err)
}

func (e *FileError) Unwrap() error { return e.Err }

// fsys is the little of the filesystem the package uses. The kernel's
// cgroupfs is osFS; the tests stand a fake cgroup v2 kernel in its place to
// check the v2 file formats and layout on a machine that has only v1. Every
// method returns a bare error (usually a unix.Errno); the callers wrap it in
// a FileError that names the path.
type fsys interface {
	mkdir(path string) error
	rmdir(path string) error
	// write writes data in one write(2) to an existing file: cgroupfs
	// takes one value per write, and a file that is not there is an
	// error (never created).
	write(path, data string) error
	read(path string) ([]byte, error)
	exists(path string) bool
	// subdirs lists the directories in path (child groups).
	subdirs(path string) ([]string, error)
	// statfs returns the filesystem magic of path and whether it is
	// mounted read-only.
	statfs(path string) (magic int64, readOnly bool, err error)
}

type osFS struct{}

func (osFS) mkdir(p string) error { return unix.Mkdir(p, 0o755) }
func (osFS) rmdir(p string) error { return unix.Rmdir(p) }

func (osFS) write(p, data string) error {
	fd, err := retryEINTR(func() (int, error) { return unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC, 0) })
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	n, err := retryEINTR(func() (int, error) { return unix.Write(fd, []byte(data)) })
	if err != nil {
		return err
	}
	if n != len(data) {
		return fmt.Errorf("short write (%d of %d bytes)", n, len(data))
	}
	return nil
}

func (osFS) read(p string) ([]byte, error) {
	b, err := os.ReadFile(p)
	var pe *os.PathError
	if errors.As(err, &pe) {
		return nil, pe.Err
	}
	return b, err
}

func (osFS) exists(p string) bool {
	return unix.Access(p, unix.F_OK) == nil
}

func (osFS) subdirs(p string) ([]string, error) {
	ents, err := os.ReadDir(p)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return nil, pe.Err
		}
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

func (osFS) statfs(p string) (int64, bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return 0, false, err
	}
	return int64(st.Type), st.Flags&unix.ST_RDONLY != 0, nil
}

func retryEINTR(f func() (int, error)) (int, error) {
	for {
		n, err := f()
		if err != unix.EINTR {
			return n, err
		}
	}
}

// system is what a Tree works through: the filesystem and the way it
// signals a process. Tests replace both.
type system struct {
	fs   fsys
	kill func(pid int) error
}

func hostSystem() *system {
	return &system{
		fs:   osFS{},
		kill: func(pid int) error { return unix.Kill(pid, unix.SIGKILL) },
	}
}

func (s *system) mkdir(p string) error {
	if err := s.fs.mkdir(p); err != nil {
		return &FileError{Op: "mkdir", Path: p, Err: err}
	}
	return nil
}

func (s *system) rmdir(p string) error {
	if err := s.fs.rmdir(p); err != nil {
		return &FileError{Op: "rmdir", Path: p, Err: err}
	}
	return nil
}

func (s *system) write(p, data string) error {
	if err := s.fs.write(p, data); err != nil {
		return &FileError{Op: "write", Path: p, Data: data, Err: err}
	}
	return nil
}

func (s *system) read(p string) (string, error) {
	b, err := s.fs.read(p)
	if err != nil {
		return "", &FileError{Op: "read", Path: p, Err: err}
	}
	return string(b), nil
}
