package lanefs

import (
	"errors"
	"strings"

	"golang.org/x/sys/unix"

	"thermite/internal/confined"
)

// openBeneath is the confinement: the one function that turns a path from
// a request into a descriptor. It opens path relative to dirfd (a root's
// descriptor, or a folder's that was itself opened here) with
// confined.OpenBeneath, so the kernel refuses anything that would leave
// dirfd's folder: "..", absolute paths and symlinks that lead out fail with
// EXDEV, /proc's magic links with ELOOP. Symlinks that stay beneath are
// followed. Everything else in this package works on the descriptors it
// returns, with the *at calls and a single final name. mode counts only
// with O_CREAT.
func openBeneath(dirfd int, path string, flags int, mode uint32) (int, error) {
	return confined.OpenBeneath(dirfd, path, flags, mode, confined.FollowInside)
}

// root is one folder the helper serves, open for its whole life.
type root struct {
	fd   int
	name string // what messages call it: "the workspace", "root 1"
}

// split cuts a path into the folder that holds its final entry and that
// entry's name. Trailing slashes go; the folder keeps any leading slash
// so that the kernel sees (and refuses) an absolute path.
func split(path string) (dir, base string) {
	p := strings.TrimRight(path, "/")
	if p == "" {
		if path != "" {
			return "/", ""
		}
		return ".", ""
	}
	i := strings.LastIndexByte(p, '/')
	switch {
	case i < 0:
		return ".", p
	case i == 0:
		return "/", p[1:]
	}
	return p[:i], p[i+1:]
}

// fail turns an errno from working on path into the request's error.
func (r *root) fail(path string, err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	p := show(path)
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return errorf(CodeIO, "%s: %v", p, err)
	}
	switch errno {
	case unix.EXDEV:
		return errorf(CodeEscape, "%s: leaves %s", p, r.name)
	case unix.ELOOP:
		return errorf(CodeEscape, "%s: goes through a symlink loop or a magic link", p)
	case unix.ENOENT:
		return errorf(CodeNotFound, "%s: no such file or folder", p)
	case unix.EACCES, unix.EPERM:
		return errorf(CodeDenied, "%s: permission denied", p)
	case unix.EROFS:
		return errorf(CodeDenied, "%s: read-only", p)
	case unix.EEXIST:
		return errorf(CodeExists, "%s: already exists", p)
	case unix.ENOTDIR:
		return errorf(CodeBadRequest, "%s: not a folder", p)
	case unix.EISDIR:
		return errorf(CodeBadRequest, "%s: is a folder", p)
	case unix.ENOTEMPTY:
		return errorf(CodeBadRequest, "%s: folder is not empty (delete it with recursive)", p)
	case unix.ENAMETOOLONG:
		return errorf(CodeBadRequest, "%s: name too long", p)
	case unix.EINVAL:
		return errorf(CodeBadRequest, "%s: invalid path", p)
	case unix.EFBIG, unix.ENOSPC, unix.EDQUOT:
		return errorf(CodeTooLarge, "%s: %s", p, errno.Error())
	}
	return errorf(CodeIO, "%s: %s", p, errno.Error())
}

// parent opens the folder that holds path's final entry (O_PATH) and
// returns its descriptor and the entry's name: a single name, never "."
// or "..", which the *at calls then use relative to the descriptor. A
// path that names its entry through "." or ".." (or the root itself) is
// refused: as an escape when it leaves the root, else as a bad request.
func (r *root) parent(path string) (int, string, *Error) {
	if path == "" {
		return -1, "", errorf(CodeBadRequest, "empty path")
	}
	dir, base := split(path)
	fd, err := openBeneath(r.fd, dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, "", r.fail(path, err)
	}
	if base == "" || base == "." || base == ".." {
		unix.Close(fd)
		if fd, err := openBeneath(r.fd, path, unix.O_PATH, 0); err != nil {
			return -1, "", r.fail(path, err)
		} else {
			unix.Close(fd)
		}
		return -1, "", errorf(CodeBadRequest, "%s: names a folder by . or .. (or the root itself): name the entry", show(path))
	}
	return fd, base, nil
}

// joinShow is the root-relative path of rel, found below top.
func joinShow(top, rel string) string {
	top = strings.TrimRight(top, "/")
	if top == "" || top == "." {
		return rel
	}
	return top + "/" + rel
}

// openDir opens the folder path names for reading (an empty path is the
// root), and returns the path as errors name it.
func (r *root) openDir(path string) (int, string, *Error) {
	if path == "" {
		path = "."
	}
	fd, err := openBeneath(r.fd, path, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, path, r.fail(path, err)
	}
	return fd, path, nil
}
