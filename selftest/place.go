package selftest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"thermite/internal/confined"
)

// The self-test runs as root and places canaries in folders that the
// controller's user owns (its folder, the store, scratch/trials…), which a
// process of that user could change while it works. So every canary is
// made, owned and removed through descriptors: the parent is opened without
// following a symlink, the entry is made in it with mkdirat or
// openat(O_CREAT|O_EXCL|O_NOFOLLOW), and its owner and mode are set on that
// descriptor, never by path.

// openParent opens the folder that holds path: beneath the state dir with
// openat2 (no symlink anywhere), or, outside it (the secrets folder, which
// is root's), without following a symlink at its last component.
func openParent(stateDir, path string) (int, error) {
	parent := filepath.Dir(path)
	if parent == stateDir || strings.HasPrefix(parent, stateDir+"/") {
		f, err := confined.Open(stateDir, parent, unix.O_PATH|unix.O_DIRECTORY)
		if err != nil {
			return -1, err
		}
		// Close-on-exec from the start: the broker's other goroutines
		// may fork and exec (os/exec) while canaries are placed.
		fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		f.Close()
		return fd, err
	}
	fd, err := unix.Open(parent, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("%s: %w", parent, err)
	}
	return fd, nil
}

// setOwnerMode sets owner and mode through a descriptor of the entry.
func setOwnerMode(fd, uid, gid int, mode os.FileMode) error {
	if err := unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH); err != nil {
		return err
	}
	return unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), uint32(mode.Perm()))
}

// placeFile makes a new file at path with the given owner and mode.
func placeFile(stateDir, path string, uid, gid int, mode os.FileMode) error {
	return placeContent(stateDir, path, "thermite self-test canary\n", uid, gid, uint32(mode.Perm()))
}

// placeContent makes a new file at path holding content, then sets its
// owner and then its raw mode (set-id bits included: chown clears them,
// so the mode comes after), all through the new file's descriptor.
func placeContent(stateDir, path, content string, uid, gid int, mode uint32) error {
	pfd, err := openParent(stateDir, path)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	fd, err := unix.Openat(pfd, filepath.Base(path), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte(content)); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), mode); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// placeDir makes a new folder at path with the given owner and mode.
func placeDir(stateDir, path string, uid, gid int, mode os.FileMode) error {
	pfd, err := openParent(stateDir, path)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	name := filepath.Base(path)
	if err := unix.Mkdirat(pfd, name, 0o700); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	fd, err := unix.Openat(pfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer unix.Close(fd)
	return setOwnerMode(fd, uid, gid, mode)
}

// placeSymlink makes a new symlink at path to target, owned by uid:gid.
func placeSymlink(stateDir, path, target string, uid, gid int) error {
	pfd, err := openParent(stateDir, path)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	name := filepath.Base(path)
	if err := unix.Symlinkat(target, pfd, name); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := unix.Fchownat(pfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// removePlaced removes a canary, a folder with all it holds, through
// descriptors: nothing is followed out of it.
func removePlaced(stateDir, path string) {
	pfd, err := openParent(stateDir, path)
	if err != nil {
		return
	}
	defer unix.Close(pfd)
	removeAt(pfd, filepath.Base(path), 0)
}

func removeAt(dirfd int, name string, depth int) {
	if depth > 64 {
		return
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Unlinkat(dirfd, name, 0) // a file, a symlink: the entry itself
		return
	}
	f := os.NewFile(uintptr(fd), name)
	names, _ := f.Readdirnames(-1)
	for _, n := range names {
		removeAt(fd, n, depth+1)
	}
	f.Close()
	unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

// readToken reads a token of an ended trial beneath trials: a plain file
// with one link, owned by a user owner accepts, read without following a
// symlink or blocking, and at most 256 bytes.
func readToken(trials, rel string, owner func(uid int) bool) (string, error) {
	f, err := confined.Open(trials, rel, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return "", err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 || !owner(int(st.Uid)) {
		return "", errors.New("not a plain file of an agent's")
	}
	buf := make([]byte, 256)
	n, _ := f.Read(buf)
	return strings.TrimSpace(string(buf[:n])), nil
}
