package confined

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/posixacl"
)

func TestOpenStaysBeneath(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "a", "b"), 0o755)
	os.Symlink("/etc", filepath.Join(root, "a", "link"))
	os.Symlink("b", filepath.Join(root, "a", "inner"))
	if f, err := Open(root, filepath.Join(root, "a", "b"), unix.O_PATH|unix.O_DIRECTORY); err != nil {
		t.Fatalf("a plain folder: %v", err)
	} else {
		f.Close()
	}
	for _, p := range []string{
		filepath.Join(root, "a", "link"),
		filepath.Join(root, "a", "inner"), // even a symlink that stays inside
		filepath.Join(root, "a", "..", "..", "etc"),
		"a/../../etc",
		"/etc",
		root + "x/y",
	} {
		f, err := Open(root, p, unix.O_PATH)
		if err == nil {
			f.Close()
			t.Errorf("%s: opened", p)
			continue
		}
		if !strings.Contains(err.Error(), p) {
			t.Errorf("%s: error %q does not name the path", p, err)
		}
	}
	_, err := Open(root, filepath.Join(root, "a", "link"), unix.O_PATH)
	if !errors.Is(err, ErrEscape) {
		t.Errorf("symlink error %v is not ErrEscape", err)
	}
}

func requireRoot(t testing.TB) {
	if os.Geteuid() != 0 || testing.Short() {
		t.Skip("needs root (and no -short): files owned by other uids")
	}
}

func mode(t *testing.T, p string) uint32 {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Mode & 0o7777
}

func TestClearSetID(t *testing.T) {
	requireRoot(t)
	const uid = 45999
	base := t.TempDir()
	lane := filepath.Join(base, "lane")
	outside := filepath.Join(base, "outside")
	os.MkdirAll(filepath.Join(lane, "sub"), 0o755)
	os.MkdirAll(outside, 0o755)
	mk := func(p string, m uint32, owner int) {
		os.WriteFile(p, []byte("x"), 0o644)
		os.Chown(p, owner, owner)
		unix.Chmod(p, m)
	}
	mk(filepath.Join(lane, "su"), 0o4755, uid)
	mk(filepath.Join(lane, "sub", "sg"), 0o2755, uid)
	mk(filepath.Join(lane, "rootfile"), 0o4755, 0)
	mk(filepath.Join(outside, "victim"), 0o4755, uid)
	mk(filepath.Join(outside, "linked"), 0o4755, uid)
	os.Link(filepath.Join(outside, "linked"), filepath.Join(lane, "hardlink"))
	mk(filepath.Join(outside, "rootlinked"), 0o4755, 0)
	os.Link(filepath.Join(outside, "rootlinked"), filepath.Join(lane, "roothardlink"))
	os.Symlink(outside, filepath.Join(lane, "out"))
	os.Symlink(filepath.Join(outside, "victim"), filepath.Join(lane, "victimlink"))
	os.Chown(filepath.Join(lane, "sub"), uid, uid)
	unix.Chmod(filepath.Join(lane, "sub"), 0o2755)
	os.Chown(lane, uid, uid)

	top, err := Open(base, lane, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		t.Fatal(err)
	}
	defer top.Close()
	cleared, skipped, scanned, err := ClearSetID(top, uid)
	if err != nil {
		t.Fatal(err)
	}
	if scanned != 7 { // top, su, sub, sub/sg, rootfile, hardlink, roothardlink: symlinks are not entries it touches
		t.Errorf("scanned %d", scanned)
	}
	for p, want := range map[string]uint32{
		filepath.Join(lane, "su"):            0o755,
		filepath.Join(lane, "sub", "sg"):     0o755,
		filepath.Join(lane, "sub"):           0o755,
		filepath.Join(lane, "rootfile"):      0o4755, // another owner: reported, untouched
		filepath.Join(outside, "victim"):     0o4755, // behind a symlink: never reached
		filepath.Join(outside, "linked"):     0o755,  // the role's own, hard-linked in: its bits go too
		filepath.Join(outside, "rootlinked"): 0o4755, // another owner's, hard-linked in: reported, untouched
	} {
		if got := mode(t, p); got != want {
			t.Errorf("%s: mode %04o, want %04o", p, got, want)
		}
	}
	if len(cleared) != 4 {
		t.Errorf("cleared %v", cleared)
	}
	joined := strings.Join(skipped, "\n")
	if !strings.Contains(joined, "rootfile: owned by uid 0") || !strings.Contains(joined, "roothardlink: owned by uid 0") || len(skipped) != 2 {
		t.Errorf("skipped:\n%s", joined)
	}
}

func TestChownTree(t *testing.T) {
	requireRoot(t)
	const from, to = 45998, 45997
	base := t.TempDir()
	dir := filepath.Join(base, "ws")
	os.MkdirAll(filepath.Join(dir, "d"), 0o755)
	os.WriteFile(filepath.Join(dir, "d", "f"), []byte("x"), 0o664)
	os.WriteFile(filepath.Join(dir, "rootowned"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(base, "elsewhere"), []byte("x"), 0o644)
	os.Chown(filepath.Join(base, "elsewhere"), from, from)
	os.Link(filepath.Join(base, "elsewhere"), filepath.Join(dir, "hard"))
	for _, p := range []string{dir, filepath.Join(dir, "d"), filepath.Join(dir, "d", "f")} {
		os.Chown(p, from, from)
	}
	top, err := Open(base, dir, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		t.Fatal(err)
	}
	defer top.Close()
	allowed := func(uid int) bool { return uid == from || uid == to }
	res, err := ChownTree(top, Hand{UID: to, GID: to, TopUID: to, Allowed: allowed, ReadOnly: true, TopMode: 0o750})
	changed, skipped := res.Changed, res.Skipped
	if err != nil {
		t.Fatal(err)
	}
	if changed != 3 {
		t.Errorf("changed %d, want 3 (top, d, d/f); skipped %v", changed, skipped)
	}
	var st unix.Stat_t
	unix.Lstat(filepath.Join(dir, "d", "f"), &st)
	if st.Uid != to || st.Mode&0o777 != 0o444 {
		t.Errorf("d/f: uid %d mode %o, want %d 0444", st.Uid, st.Mode&0o777, to)
	}
	unix.Lstat(dir, &st)
	if st.Uid != to || st.Mode&0o777 != 0o550 {
		t.Errorf("top: uid %d mode %o, want %d 0550", st.Uid, st.Mode&0o777, to)
	}
	unix.Lstat(filepath.Join(base, "elsewhere"), &st)
	if st.Uid != from {
		t.Errorf("a hard link gave away a file outside the tree")
	}
	unix.Lstat(filepath.Join(dir, "rootowned"), &st)
	if st.Uid != 0 {
		t.Errorf("root's file was handed on")
	}
}

// A role that hard-links its own set-id file keeps it out of the hand-back
// (its other link may live anywhere), but not its bits; another owner's
// linked file is left as it is. (A publish removes both: see
// TestPublishedAreaKeepsNoLinkedFileNorACL.)
func TestChownTreeClearsSetIDOfLinkedRoleFiles(t *testing.T) {
	requireRoot(t)
	const from, to = 45996, 45995
	base := t.TempDir()
	dir := filepath.Join(base, "area")
	os.MkdirAll(dir, 0o755)
	os.Chown(dir, from, from)
	mk := func(p string, m uint32, owner int) {
		os.WriteFile(p, []byte("x"), 0o644)
		os.Chown(p, owner, owner)
		unix.Chmod(p, m)
	}
	mk(filepath.Join(dir, "prog"), 0o6755, from)
	os.Link(filepath.Join(dir, "prog"), filepath.Join(dir, "prog2"))
	mk(filepath.Join(base, "foreign"), 0o4755, 0)
	os.Link(filepath.Join(base, "foreign"), filepath.Join(dir, "foreignlink"))
	top, err := Open(base, dir, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		t.Fatal(err)
	}
	defer top.Close()
	allowed := func(uid int) bool { return uid == from || uid == to }
	res, err := ChownTree(top, Hand{UID: to, GID: to, TopUID: to, Allowed: allowed, ReadOnly: true})
	skipped := res.Skipped
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	unix.Lstat(filepath.Join(dir, "prog"), &st)
	if st.Mode&0o7777 != 0o755 || st.Uid != from {
		t.Errorf("the role's linked set-id file: uid %d mode %04o, want uid %d 0755", st.Uid, st.Mode&0o7777, from)
	}
	if got := mode(t, filepath.Join(base, "foreign")); got != 0o4755 {
		t.Errorf("another owner's linked file: mode %04o, want it untouched (04755)", got)
	}
	joined := strings.Join(skipped, "\n")
	if !strings.Contains(joined, "prog: has 2 links; set-id bits cleared") || !strings.Contains(joined, "foreignlink: owned by uid 0") {
		t.Errorf("skipped:\n%s", joined)
	}
}

var (
	treeOnce sync.Once
	treeDir  string
)

// bigTree is 100,000 files in 1,000 folders, one in a thousand set-id.
func bigTree(b *testing.B) string {
	treeOnce.Do(func() {
		d, err := os.MkdirTemp("", "thermite-setid-bench-")
		if err != nil {
			b.Fatal(err)
		}
		for i := 0; i < 1000; i++ {
			sub := filepath.Join(d, fmt.Sprintf("d%03d", i))
			os.Mkdir(sub, 0o755)
			for j := 0; j < 100; j++ {
				p := filepath.Join(sub, fmt.Sprintf("f%03d", j))
				fd, _ := unix.Open(p, unix.O_CREAT|unix.O_WRONLY, 0o644)
				unix.Close(fd)
			}
		}
		treeDir = d
	})
	return treeDir
}

// BenchmarkSetIDSweep100k compares the sweep over a 100,000-file folder
// with `find DIR -perm /6000` over the same tree: scripts/bench.sh prints
// the ratio.
func BenchmarkSetIDSweep100k(b *testing.B) {
	d := bigTree(b)
	b.Cleanup(func() { os.RemoveAll(d) })
	b.Run("thermite", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			// One file in a thousand gets its bit back each round.
			for k := 0; k < 100; k++ {
				unix.Chmod(filepath.Join(d, fmt.Sprintf("d%03d", k*10), "f000"), 0o4755)
			}
			top, err := Open(filepath.Dir(d), d, unix.O_PATH|unix.O_DIRECTORY)
			if err != nil {
				b.Fatal(err)
			}
			_, _, n, err := ClearSetID(top, os.Getuid())
			top.Close()
			if err != nil || n != 101001 {
				b.Fatalf("scanned %d: %v", n, err)
			}
		}
	})
	b.Run("find", func(b *testing.B) {
		if _, err := exec.LookPath("find"); err != nil {
			b.Skip("needs find")
		}
		for i := 0; i < b.N; i++ {
			for k := 0; k < 100; k++ {
				unix.Chmod(filepath.Join(d, fmt.Sprintf("d%03d", k*10), "f000"), 0o4755)
			}
			if err := exec.Command("find", d, "-perm", "/6000").Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestWalksAreBounded(t *testing.T) {
	root := t.TempDir()
	p := root
	for i := 0; i < MaxDepth+5; i++ {
		p = filepath.Join(p, "d")
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	top, err := Open(filepath.Dir(root), root, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		t.Fatal(err)
	}
	defer top.Close()
	if _, _, err := Usage(top); !errors.Is(err, ErrTooBig) {
		t.Fatalf("a tree %d deep: %v, want ErrTooBig", MaxDepth+5, err)
	}
	if _, _, _, err := ClearSetID(top, os.Getuid()); !errors.Is(err, ErrTooBig) {
		t.Fatalf("sweep of a tree %d deep: %v, want ErrTooBig", MaxDepth+5, err)
	}
}

// BenchmarkUsage100k measures a trial's disk check over 100,000 files of
// one block each against `du -s` of the same tree, in CPU time (user and
// system) per measurement: the walk stats each entry once, as du does.
func BenchmarkUsage100k(b *testing.B) {
	d, err := os.MkdirTemp("", "thermite-usage-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(d) })
	for i := 0; i < 1000; i++ {
		sub := filepath.Join(d, fmt.Sprintf("d%03d", i))
		os.Mkdir(sub, 0o755)
		for j := 0; j < 100; j++ {
			os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%03d", j)), []byte("x"), 0o644)
		}
	}
	cpu := func(who int) time.Duration {
		var ru unix.Rusage
		unix.Getrusage(who, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	b.Run("thermite", func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		start := cpu(unix.RUSAGE_THREAD)
		for i := 0; i < b.N; i++ {
			top, err := Open(filepath.Dir(d), d, unix.O_PATH|unix.O_DIRECTORY)
			if err != nil {
				b.Fatal(err)
			}
			_, n, err := Usage(top)
			top.Close()
			if err != nil || n != 101001 {
				b.Fatalf("entries %d: %v", n, err)
			}
		}
		b.ReportMetric(float64(cpu(unix.RUSAGE_THREAD)-start)/float64(b.N)/1e6, "cpu-ms/op")
	})
	b.Run("du", func(b *testing.B) {
		if _, err := exec.LookPath("du"); err != nil {
			b.Skip("needs du")
		}
		start := cpu(unix.RUSAGE_CHILDREN)
		for i := 0; i < b.N; i++ {
			if err := exec.Command("du", "-s", d).Run(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(cpu(unix.RUSAGE_CHILDREN)-start)/float64(b.N)/1e6, "cpu-ms/op")
	})
}

// TestChownTreePublishRemovesFIFOsSocketsAndDevices: a published tree is
// opened by every role, so nothing in it may hold a reader (a FIFO), be
// connected to (a socket) or reach a device: each goes, by name in
// Removed, and the plain file and folder are published as usual. Handed
// without publishing, they stay.
func TestChownTreePublishRemovesFIFOsSocketsAndDevices(t *testing.T) {
	requireRoot(t)
	const from, to = 45994, 45993
	for _, publish := range []bool{false, true} {
		base := t.TempDir()
		dir := filepath.Join(base, "area")
		os.MkdirAll(filepath.Join(dir, "sub"), 0o755)
		os.WriteFile(filepath.Join(dir, "sub", "note"), []byte("x"), 0o644)
		if err := unix.Mkfifo(filepath.Join(dir, "sub", "pipe"), 0o666); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mknod(filepath.Join(dir, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatal(err)
		}
		s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Bind(s, &unix.SockaddrUnix{Name: filepath.Join(dir, "sock")}); err != nil {
			t.Fatal(err)
		}
		unix.Close(s)
		filepath.Walk(dir, func(p string, _ os.FileInfo, _ error) error { return os.Lchown(p, from, from) })
		top, err := Open(base, dir, unix.O_PATH|unix.O_DIRECTORY)
		if err != nil {
			t.Fatal(err)
		}
		res, err := ChownTree(top, Hand{UID: to, GID: to, TopUID: to, Allowed: func(uid int) bool { return uid == from || uid == to }, Publish: publish})
		top.Close()
		if err != nil {
			t.Fatal(err)
		}
		special := []string{filepath.Join(dir, "null"), filepath.Join(dir, "sock"), filepath.Join(dir, "sub", "pipe")}
		for _, p := range special {
			_, err := os.Lstat(p)
			if publish && !os.IsNotExist(err) {
				t.Errorf("published: %s is still there (%v)", p, err)
			}
			if !publish && err != nil {
				t.Errorf("handed, not published: %s went: %v", p, err)
			}
		}
		removed := append([]string(nil), res.Removed...)
		sort.Strings(removed)
		if want := special; publish && strings.Join(removed, " ") != strings.Join(want, " ") || !publish && len(removed) > 0 {
			t.Errorf("publish %v: Removed %v", publish, removed)
		}
		if got := mode(t, filepath.Join(dir, "sub", "note")); publish && got != 0o444 {
			t.Errorf("the published note: mode %04o, want 0444", got)
		}
	}
}

// TestPublishedAreaKeepsNoLinkedFileNorACL: a lane's research area is
// published to every role at its trial's end. A file the lane linked
// elsewhere as well would be skipped by the hand-back and stay the
// lane's, mode 0666 and all: writable by every other role, and by the
// lane through its other link after publication. A POSIX ACL the lane
// put on a file (user:X:---) would keep it from role X, and a folder's
// default ACL would name who gets what is made there. The publish removes
// the linked file (its other link, outside the tree, is left alone), and
// takes every ACL off, so that the published modes alone decide.
func TestPublishedAreaKeepsNoLinkedFileNorACL(t *testing.T) {
	requireRoot(t)
	const from, to, other = 45991, 45990, 45989
	base := t.TempDir()
	dir := filepath.Join(base, "area")
	os.MkdirAll(filepath.Join(dir, "sub"), 0o755)
	for _, f := range []string{"linked", "kept"} {
		os.WriteFile(filepath.Join(dir, f), []byte("research\n"), 0o666)
		unix.Chmod(filepath.Join(dir, f), 0o666)
	}
	if err := os.Link(filepath.Join(dir, "linked"), filepath.Join(base, "outside")); err != nil {
		t.Fatal(err)
	}
	filepath.Walk(base, func(p string, _ os.FileInfo, _ error) error { return os.Lchown(p, from, from) })
	deny, err := posixacl.Encode([]posixacl.Entry{{Tag: posixacl.UserObj, Perm: 6}, {Tag: posixacl.User, Perm: 0, ID: other}, {Tag: posixacl.GroupObj, Perm: 4}, {Tag: posixacl.Mask, Perm: 6}, {Tag: posixacl.Other, Perm: 4}})
	if err != nil {
		t.Fatal(err)
	}
	acls := true
	if err := unix.Setxattr(filepath.Join(dir, "kept"), "system.posix_acl_access", deny, 0); errors.Is(err, unix.EOPNOTSUPP) {
		acls = false
		t.Logf("%s keeps no POSIX ACLs: the ACL half is not tried here", base)
	} else if err != nil {
		t.Fatal(err)
	} else if err := unix.Setxattr(filepath.Join(dir, "sub"), "system.posix_acl_default", deny, 0); err != nil {
		t.Fatal(err)
	}
	top, err := Open(base, dir, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		t.Fatal(err)
	}
	res, err := ChownTree(top, Hand{UID: to, GID: to, TopUID: to, Allowed: func(uid int) bool { return uid == from || uid == to }, ReadOnly: true, Publish: true})
	top.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "linked")); !os.IsNotExist(err) {
		t.Errorf("published: the lane's hard-linked file is still in the area (%v), its mode %04o", err, mode(t, filepath.Join(dir, "linked")))
	}
	if !slices.Contains(res.Removed, filepath.Join(dir, "linked")) {
		t.Errorf("Removed %v does not name the linked file", res.Removed)
	}
	if b, err := os.ReadFile(filepath.Join(base, "outside")); err != nil || string(b) != "research\n" {
		t.Errorf("the linked file's other link, outside the tree: %q %v, want it left alone", b, err)
	}
	if got := mode(t, filepath.Join(dir, "kept")); got != 0o444 {
		t.Errorf("the published file: mode %04o, want 0444", got)
	}
	if !acls {
		return
	}
	for _, c := range []struct{ path, attr string }{{filepath.Join(dir, "kept"), "system.posix_acl_access"}, {filepath.Join(dir, "sub"), "system.posix_acl_default"}} {
		if _, err := unix.Getxattr(c.path, c.attr, make([]byte, 256)); !errors.Is(err, unix.ENODATA) {
			t.Errorf("published: %s keeps its %s (%v), want it taken off", c.path, c.attr, err)
		}
	}
}
