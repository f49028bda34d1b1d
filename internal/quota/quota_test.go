//go:build linux

package quota

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestMountOfNamesTheFileSystemsOwnMount(t *testing.T) {
	mi := filepath.Join(t.TempDir(), "mountinfo")
	os.WriteFile(mi, []byte(`22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
30 22 7:0 /sub /srv/bind rw - ext4 /dev/loop0 rw,quota,usrquota
31 22 7:0 / /var/lib/thermite\040x rw - ext4 /dev/loop0 rw,quota,usrquota
`), 0o644)
	typ, src, mnt := mountOf(mi, unix.Mkdev(7, 0))
	if typ != "ext4" || src != "/dev/loop0" || mnt != "/var/lib/thermite x" {
		t.Fatalf("mountOf: %q %q %q", typ, src, mnt)
	}
	if typ, _, _ := mountOf(mi, unix.Mkdev(9, 9)); typ != "?" {
		t.Fatalf("an unknown device: %q", typ)
	}
}

// Where the file system has no user quotas on, Probe says why, and the
// broker measures by walking.
func TestProbeWithoutUserQuotasSaysWhy(t *testing.T) {
	dir := t.TempDir()
	fs, err := Probe(dir)
	if err == nil {
		fs.Close()
		t.Skipf("%s has user quotas on; this test needs a file system without", dir)
	}
	var no *NotOnError
	if !errors.As(err, &no) || !strings.HasPrefix(err.Error(), dir+": ") {
		t.Fatalf("Probe(%s): %v, want a NotOnError naming the folder", dir, err)
	}
	t.Log(err)
}

// On a file system with user quotas, a user's usage is what it owns there,
// files unlinked but still open included.
func TestOfCountsAUsersFilesAndUnlinkedOpenOnes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a file system with user quotas")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "usrquota,size=64m"); err != nil {
		t.Skipf("needs a file system with user quotas: tmpfs -o usrquota: %v (Linux 6.6+ with CONFIG_TMPFS_QUOTA)", err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	fs, err := Probe(dir)
	if err != nil {
		t.Fatalf("Probe on tmpfs with usrquota: %v", err)
	}
	defer fs.Close()
	const uid = 64999
	before, err := fs.Of(uid)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, make([]byte, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chown(p, uid, uid)
	f, _ := os.Open(p)
	defer f.Close()
	os.Remove(p)
	after, _ := fs.Of(uid)
	if got := after.Sub(before); got.Bytes < 4<<20 || got.Inodes != 1 {
		t.Fatalf("uid %d's 4 MiB file, unlinked and open: quota grew by %+v", uid, got)
	}
}

// Of reads another user's quota on a thread whose effective uid is that
// user's for the one call; every thread of the process is root's after.
func TestOfLeavesEveryThreadRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it changes one thread's effective uid")
	}
	dir, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	fs := &FS{dir: dir, Source: "test"}
	for i := 0; i < 50; i++ {
		// Quotas are off here: the answer is an error, the path the same.
		fs.Of(65534)
	}
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, tk := range tasks {
		data, err := os.ReadFile("/proc/self/task/" + tk.Name() + "/status")
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(l, "Uid:") && strings.Join(strings.Fields(l)[1:], " ") != "0 0 0 0" {
				t.Fatalf("thread %s after Of: %s", tk.Name(), l)
			}
			if strings.HasPrefix(l, "CapEff:") && strings.Fields(l)[1] == "0000000000000000" {
				t.Fatalf("thread %s lost its capabilities after Of: %s", tk.Name(), l)
			}
		}
	}
}

// BenchmarkOf is one role's read on the quota path: a thread whose
// effective uid is the role's for one quotactl_fd. Where the folder's file
// system has no user quotas the kernel answers ESRCH after the same
// permission check and lookup of the super block; with quotas it also
// copies the user's cached dquot.
//
//	go test ./internal/quota -run '^$' -bench Of
func BenchmarkOf(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: it changes one thread's effective uid")
	}
	dir, err := os.Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer dir.Close()
	fs := &FS{dir: dir, Source: "bench"}
	if q, err := Probe(dir.Name()); err == nil {
		fs = q
		defer q.Close()
	}
	for b.Loop() {
		fs.Of(65534)
	}
}
