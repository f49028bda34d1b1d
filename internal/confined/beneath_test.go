package confined

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// beneathTree makes top/in/f, top/in/sub/g, top/outside, and in top/in:
// abs -> / (an absolute symlink), up -> ../outside, inner -> sub/g (a
// symlink that stays inside). It returns a descriptor of top/in.
func beneathTree(t *testing.T) int {
	t.Helper()
	top := t.TempDir()
	in := filepath.Join(top, "in")
	for _, d := range []string{in, filepath.Join(in, "sub")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(in, "f"), filepath.Join(in, "sub", "g"), filepath.Join(top, "outside")} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, to := range map[string]string{"abs": "/", "up": "../outside", "inner": "sub/g"} {
		if err := os.Symlink(to, filepath.Join(in, name)); err != nil {
			t.Fatal(err)
		}
	}
	fd, err := unix.Open(in, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// Each way out of a folder is refused with the kernel's own errno, under
// every Resolve a caller may pass, and the plain open still works.
func TestOpenBeneathRefusesEveryWayOut(t *testing.T) {
	dir := beneathTree(t)
	for _, tc := range []struct {
		name   string
		path   string
		extra  Resolve
		want   error // nil: it opens
		reason string
	}{
		{"plain file", "f", Strict, nil, ""},
		{"plain file in a folder", "sub/g", FollowInside, nil, ""},
		{"dot-dot escape", "../outside", FollowInside, unix.EXDEV, "leaves the folder"},
		{"dot-dot escape, strict", "../outside", Strict, unix.EXDEV, "leaves the folder"},
		{"dot-dot back inside", "sub/../f", FollowInside, nil, ""},
		{"absolute path", "/etc/passwd", FollowInside, unix.EXDEV, "an absolute path leaves the folder"},
		{"absolute symlink", "abs/etc/passwd", FollowInside, unix.EXDEV, "the symlink leads to /"},
		{"absolute symlink, no symlinks", "abs/etc/passwd", NoSymlinks, unix.ELOOP, "a symlink"},
		{"symlink up and out", "up", FollowInside, unix.EXDEV, "the symlink leaves the folder"},
		{"symlink inside", "inner", FollowInside, nil, ""},
		{"symlink inside, no symlinks", "inner", NoSymlinks, unix.ELOOP, "a symlink, even one that stays"},
		{"symlink inside, strict", "inner", Strict, unix.ELOOP, "a symlink, even one that stays"},
		{"NUL in the path", "f\x00/../../x", FollowInside, unix.EINVAL, "a NUL would cut the path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fd, err := OpenBeneath(dir, tc.path, unix.O_RDONLY, 0, tc.extra)
			if err == nil {
				unix.Close(fd)
			}
			if tc.want == nil && err != nil {
				t.Fatalf("%q: %v, want it opened", tc.path, err)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("%q: %v, want %v (%s)", tc.path, err, tc.want, tc.reason)
			}
		})
	}
}

// /proc's magic links jump anywhere (a descriptor, a process's root or
// cwd): refused with ELOOP whatever else the caller allows.
func TestOpenBeneathRefusesMagicLinks(t *testing.T) {
	self, err := unix.Open("/proc/self", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("needs /proc: %v", err)
	}
	defer unix.Close(self)
	f, err := os.Open("/etc/hostname")
	if err != nil {
		f, err = os.Open(os.Args[0])
		if err != nil {
			t.Fatal(err)
		}
	}
	defer f.Close()
	for _, path := range []string{"fd/" + strconv.Itoa(int(f.Fd())), "cwd", "root/etc", "exe"} {
		for _, extra := range []Resolve{FollowInside, Strict} {
			fd, err := OpenBeneath(self, path, unix.O_RDONLY, 0, extra)
			if err == nil {
				unix.Close(fd)
			}
			if !errors.Is(err, unix.ELOOP) {
				t.Errorf("/proc/self/%s (resolve %#x): %v, want ELOOP", path, extra, err)
			}
		}
	}
}

// O_CREAT makes the file with the mode asked (less the umask) beneath the
// folder, and O_CLOEXEC is always set.
func TestOpenBeneathCreatesWithModeAndCloexec(t *testing.T) {
	dir := beneathTree(t)
	fd, err := OpenBeneath(dir, "sub/new", unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600, Strict)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&0o777 != 0o600 {
		t.Fatalf("mode %o, %v; want 0600", st.Mode&0o777, err)
	}
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	if err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Fatalf("FD_CLOEXEC not set (%#x, %v)", flags, err)
	}
}

// Another mount on the way (/proc beneath /) is refused with EXDEV under
// NoXDev and crossed without it.
func TestOpenBeneathNoXDevStopsAtAMount(t *testing.T) {
	root, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(root)
	var a, b unix.Stat_t
	if unix.Stat("/", &a) != nil || unix.Stat("/proc", &b) != nil || a.Dev == b.Dev {
		t.Skip("needs /proc mounted apart from /")
	}
	if fd, err := OpenBeneath(root, "proc/version", unix.O_RDONLY, 0, NoXDev); !errors.Is(err, unix.EXDEV) {
		if err == nil {
			unix.Close(fd)
		}
		t.Errorf("proc/version under NoXDev: %v, want EXDEV", err)
	}
	fd, err := OpenBeneath(root, "proc/version", unix.O_RDONLY, 0, NoSymlinks)
	if err != nil {
		t.Fatalf("proc/version without NoXDev: %v", err)
	}
	unix.Close(fd)
}
