package confined

import (
	"strings"

	"golang.org/x/sys/unix"
)

// Resolve is what OpenBeneath refuses on the way to a path beyond leaving
// the folder and /proc's magic links, which it always refuses.
type Resolve uint64

const (
	// FollowInside follows symlinks that stay beneath the folder.
	FollowInside Resolve = 0
	// NoSymlinks refuses every symlink on the way, even one that stays
	// beneath (ELOOP).
	NoSymlinks Resolve = unix.RESOLVE_NO_SYMLINKS
	// NoXDev refuses crossing into another mount (EXDEV).
	NoXDev Resolve = unix.RESOLVE_NO_XDEV
	// Strict is every lookup of this package's own: no symlink, no other
	// mount.
	Strict = NoSymlinks | NoXDev
)

// beneath is refused by every OpenBeneath: "..", an absolute path or a
// symlink that would leave the folder (EXDEV), and magic links (ELOOP).
const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS

// OpenBeneath is the one confined open: it opens path relative to the
// folder dirfd with openat2, and the kernel refuses any resolution that
// would leave that folder or go through a magic link, plus what extra
// names. O_CLOEXEC is always added; mode counts only with O_CREAT. The
// error is the kernel's errno as it is (EXDEV, ELOOP, ENOENT…), for the
// caller to name.
func OpenBeneath(dirfd int, path string, flags int, mode uint32, extra Resolve) (int, error) {
	if strings.IndexByte(path, 0) >= 0 {
		return -1, unix.EINVAL
	}
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: beneath | uint64(extra)}
	if flags&unix.O_CREAT != 0 {
		how.Mode = uint64(mode)
	}
	for tries := 0; ; tries++ {
		fd, err := unix.Openat2(dirfd, path, &how)
		// EAGAIN: a rename raced the resolution of ".."; the kernel asks
		// for a retry rather than risk a wrong answer.
		if (err == unix.EAGAIN && tries < 64) || err == unix.EINTR {
			continue
		}
		return fd, err
	}
}
