package procs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A mapping of a deleted file counts its mapped length, once per inode at
// its largest; a mapping of a file with a name, or an anonymous one, not.
func TestDeletedMappings(t *testing.T) {
	maps := filepath.Join(t.TempDir(), "maps")
	os.WriteFile(maps, []byte(`55d0c0000000-55d0c0002000 r--p 00000000 08:01 1234 /usr/bin/cat
7f0000000000-7f0000100000 rw-s 00000000 08:01 777 /work/big (deleted)
7f0000200000-7f0000201000 r--s 00000000 08:01 777 /work/big (deleted)
7f0000300000-7f0000302000 rw-s 00000000 00:01 99 /memfd:x (deleted)
7f0000400000-7f0000500000 rw-p 00000000 00:00 0 
7f0000600000-7f0000601000 r--p 00000000 08:01 55 /work/a file named (deleted) not
`), 0o644)
	got, lines := deletedMappings(maps, 100)
	if lines != 6 {
		t.Errorf("%d lines read, want 6", lines)
	}
	if _, lines := deletedMappings(maps, 3); lines != 4 {
		t.Errorf("with at most 3 to read: %d lines read, want 4 (one past)", lines)
	}
	big := inode{unix.Mkdev(8, 1), 777}
	memfd := inode{unix.Mkdev(0, 1), 99}
	if len(got) != 2 || got[big].bytes != 1<<20 || got[memfd].bytes != 2<<12 {
		t.Fatalf("deletedMappings = %v; want %v: 1 MiB and %v: 8 KiB", got, big, memfd)
	}
	// Each mapping's map_files name, as the kernel spells it (no leading
	// zeros), and the path.
	if r := got[big].ranges; len(r) != 2 || r[0] != "7f0000000000-7f0000100000" || r[1] != "7f0000200000-7f0000201000" || got[big].path != "/work/big" {
		t.Errorf("the mappings of %v: %+v", big, got[big])
	}
	os.WriteFile(maps, []byte("00400000-00401000 r--s 00000000 08:01 5 /a b (deleted)\n"), 0o644)
	if got, _ := deletedMappings(maps, 100); got[inode{unix.Mkdev(8, 1), 5}].ranges[0] != "400000-401000" || got[inode{unix.Mkdev(8, 1), 5}].path != "/a b" {
		t.Errorf("a low mapping of a path with a space: %+v", got)
	}
}

// On the quota path the file system whose quota already counts unlinked
// files is passed over (its descriptors and its mappings); every other
// file system's still counts.
func TestHeldUnlinkedExceptPassesOverOneFileSystem(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the stand-in /proc's entries must be root's or the user's, as the kernel's are")
	}
	root := t.TempDir()
	f, st := deletedFile(t)
	// A stand-in /proc: process 4242 of uid 5000, holding the unlinked
	// file by descriptor and mapping another deleted file on the same
	// file system.
	p := standInProcess(root, 4242, []int{4242}, fmt.Sprintf("7f0000000000-7f0000100000 rw-s 00000000 %x:%x 999999 /x (deleted)\n", unix.Major(st.Dev), unix.Minor(st.Dev)))
	os.Symlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), filepath.Join(p, "task", "4242", "fd", "3"))
	all, err := HeldUnlinked(root, 5000, nil)
	if err != nil || all.Files != 2 {
		t.Fatalf("HeldUnlinked: %+v %v, want the descriptor's file and the mapping", all, err)
	}
	except, err := HeldUnlinkedExcept(root, 5000, nil, st.Dev)
	if err != nil || except.Files != 0 || except.Bytes != 0 {
		t.Fatalf("HeldUnlinkedExcept(its file system): %+v %v, want nothing", except, err)
	}
}

// A lane could write a deleted file under its cap through a descriptor,
// map one page of it and close the descriptor: the mapping alone keeps the
// file's blocks, and shows only its own length. Such a file on a file
// system the role's folders lie on counts its blocks, read through the
// mapping's map_files entry; where that entry cannot be read (no
// capability), is never there (the mapping moves each time), or is
// another file than maps names, the measure fails (ErrHidden, naming the
// process and the file), unless a descriptor of it in any process of the
// user shows its blocks; a mapping elsewhere (memory: a memfd) still
// counts its length.
func TestLaneKeepsADeletedFileByAMappingAloneCountsItsBlocks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the stand-in /proc's entries must be root's or the user's, as the kernel's are")
	}
	root := t.TempDir()
	f, st := deletedFile(t)
	other, _ := deletedFile(t)
	proc := func(pid int, fds bool, maps string) string {
		p := standInProcess(root, pid, []int{pid}, maps)
		os.WriteFile(filepath.Join(p, "comm"), []byte("attack\n"), 0o644)
		if fds {
			os.Symlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), filepath.Join(p, "task", fmt.Sprint(pid), "fd", "3"))
		}
		return p
	}
	page := fmt.Sprintf("7f0000000000-7f0000001000 r--s 00000000 %x:%x %d /w/held (deleted)\n", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	memfd := "7f0000100000-7f0000300000 rw-s 00000000 00:01 77 /memfd:x (deleted)\n"
	p := proc(4242, false, page+memfd)
	disk := map[uint64]bool{st.Dev: true}
	hidden := func(what, want string, statMapped StatMapped) {
		t.Helper()
		h, err := HeldUnlinkedOn(root, 5000, nil, 0, disk, statMapped)
		if !errors.Is(err, ErrHidden) || !strings.Contains(err.Error(), `process 4242 (attack): maps a deleted file "/w/held"`) || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: %+v %v, want ErrHidden naming process 4242, /w/held and %q", what, h, err, want)
		}
		if h.Bytes != 2<<20 {
			t.Errorf("%s: the memfd beside it: %d bytes counted, want its 2 MiB mapping", what, h.Bytes)
		}
	}
	hidden("no map_files entry while the process is there", "moved each time they were read", unix.Stat)
	noCapability := func(string, *unix.Stat_t) error { return unix.EPERM }
	hidden("map_files refused", "whose blocks cannot be read: "+filepath.Join(p, "map_files", "7f0000000000-7f0000001000")+": operation not permitted", noCapability)

	// Its entry reaches the file: its 64 KiB of blocks count, not the page.
	if err := os.MkdirAll(filepath.Join(p, "map_files"), 0o755); err != nil {
		t.Fatal(err)
	}
	entry := filepath.Join(p, "map_files", "7f0000000000-7f0000001000")
	os.Symlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), entry)
	h, err := HeldUnlinkedOn(root, 5000, nil, 0, disk, unix.Stat)
	if err != nil || h.Files != 2 || h.Bytes != st.Blocks*512+2<<20 {
		t.Fatalf("the deleted file through its map_files entry: %+v %v, want its %d bytes of blocks and the memfd's 2 MiB", h, err, st.Blocks*512)
	}
	// An entry that is another file than maps names (the process replaced
	// the mapping meanwhile) fails closed.
	os.Remove(entry)
	os.Symlink(fmt.Sprintf("/proc/self/fd/%d", other.Fd()), entry)
	hidden("an entry of another file", "is another file", unix.Stat)

	// Where no file system is known to be the role's, the mapping's length
	// still counts (the quota path passes its own file system over).
	if h, err := HeldUnlinkedOn(root, 5000, nil, 0, nil, noCapability); err != nil || h.Files != 2 || h.Bytes != 4<<10+2<<20 {
		t.Fatalf("with no file system of the role: %+v %v", h, err)
	}
	// A descriptor of it in another process of the user shows its blocks,
	// and the map_files entry is not needed.
	proc(4243, true, "")
	h, err = HeldUnlinkedOn(root, 5000, nil, 0, disk, noCapability)
	if err != nil || h.Bytes != st.Blocks*512+2<<20 {
		t.Fatalf("the same file with a descriptor open elsewhere: %+v %v, want its 64 KiB of blocks and the memfd", h, err)
	}
}

// A deleted folder a descriptor (or a working folder) keeps holds its
// blocks as a deleted file does; and every thread's descriptor table is
// read, as a thread cloned without CLONE_FILES has one of its own.
func TestLaneKeepsDeletedFoldersAndThreadTablesCounted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the stand-in /proc's entries must be root's or the user's, as the kernel's are")
	}
	root := t.TempDir()
	d := filepath.Join(t.TempDir(), "gone")
	os.Mkdir(d, 0o755)
	dir, err := os.Open(d)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	os.Remove(d)
	f, _ := deletedFile(t)
	p := standInProcess(root, 4242, []int{4242, 4243}, "")
	// The leader works in the deleted folder; the other thread holds the
	// deleted file in a table of its own.
	os.Symlink(fmt.Sprintf("/proc/self/fd/%d", dir.Fd()), filepath.Join(p, "task", "4242", "cwd"))
	os.Symlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), filepath.Join(p, "task", "4243", "fd", "5"))
	h, err := HeldUnlinked(root, 5000, nil)
	if err != nil || h.Files != 2 || h.Bytes < 64<<10 {
		t.Fatalf("HeldUnlinked = %+v %v; want the deleted folder and the thread's deleted file (64 KiB at least)", h, err)
	}
}

// deletedFile is a file of 64 KiB, already unlinked, held open for the
// test, and what fstat says of it.
func deletedFile(t *testing.T) (*os.File, unix.Stat_t) {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "held")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	f.Write(make([]byte, 64<<10))
	f.Sync()
	os.Remove(f.Name())
	var st unix.Stat_t
	unix.Fstat(int(f.Fd()), &st)
	return f, st
}

// standInProcess makes process pid of uid 5000 in the stand-in /proc at
// root: its tasks (each with an empty fd/) and maps; it returns the
// process's folder.
func standInProcess(root string, pid int, tasks []int, maps string) string {
	p := filepath.Join(root, fmt.Sprint(pid))
	for _, task := range tasks {
		os.MkdirAll(filepath.Join(p, "task", fmt.Sprint(task), "fd"), 0o755)
	}
	os.WriteFile(filepath.Join(p, "status"), []byte("Name:\tx\nUid:\t5000\t5000\t5000\t5000\n"), 0o644)
	os.WriteFile(filepath.Join(p, "maps"), []byte(maps), 0o644)
	return p
}

// A role that keeps more deleted files by mappings alone than the measure
// stats (MaxMappedStats) keeps them from it: each would cost the broker a
// map_files stat at every check.
func TestLaneKeepsTooManyDeletedFilesByMappingsIsHidden(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the stand-in /proc's entries must be root's or the user's, as the kernel's are")
	}
	root := t.TempDir()
	var maps strings.Builder
	for i := 0; i <= MaxMappedStats; i++ {
		fmt.Fprintf(&maps, "%x-%x r--s 00000000 08:01 %d /w/%d (deleted)\n", 0x7f0000000000+i<<12, 0x7f0000001000+i<<12, 1000+i, i)
	}
	standInProcess(root, 4242, []int{4242}, maps.String())
	stats := 0
	refuse := func(string, *unix.Stat_t) error { stats++; return unix.EPERM }
	_, err := HeldUnlinkedOn(root, 5000, nil, 0, map[uint64]bool{unix.Mkdev(8, 1): true}, refuse)
	if !errors.Is(err, ErrHidden) || !strings.Contains(err.Error(), "deleted files by mappings alone, past what the measure reads") {
		t.Fatalf("%d deleted files kept by mappings: %v, want %v past the bound", MaxMappedStats+1, err, ErrHidden)
	}
	if stats != 0 {
		t.Errorf("%d map_files entries stat'ed past the bound, want none", stats)
	}
}

// A socket's fdinfo with no scm_fds line is no unix socket on a kernel
// that shows descriptors in flight (Linux 5.9 and later), and hides
// nothing; on a kernel that shows none, any socket might keep files in
// flight, and the measure fails closed, naming the socket.
func TestLaneSocketOnAKernelShowingNoDescriptorsInFlightIsHidden(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the stand-in /proc's entries must be root's or the user's, as the kernel's are")
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	root := t.TempDir()
	p := standInProcess(root, 4242, []int{4242}, "")
	os.WriteFile(filepath.Join(p, "comm"), []byte("attack\n"), 0o644)
	os.Symlink(fmt.Sprintf("/proc/self/fd/%d", fds[0]), filepath.Join(p, "task", "4242", "fd", "3"))
	os.MkdirAll(filepath.Join(p, "task", "4242", "fdinfo"), 0o755)
	os.WriteFile(filepath.Join(p, "task", "4242", "fdinfo", "3"), []byte("pos:\t0\nflags:\t02000002\nmnt_id:\t10\nino:\t1\n"), 0o644)

	if !showsInFlight() {
		t.Skip("this kernel shows no scm_fds: the case below is the kernel's own")
	}
	if h, err := HeldUnlinked(root, 5000, nil); err != nil || h.Files != 0 {
		t.Fatalf("a socket with no scm_fds on a kernel that shows them: %+v %v, want nothing held nor hidden", h, err)
	}
	saved := showsInFlight
	showsInFlight = func() bool { return false }
	defer func() { showsInFlight = saved }()
	_, err = HeldUnlinked(root, 5000, nil)
	if !errors.Is(err, ErrHidden) || !strings.Contains(err.Error(), "process 4242 (attack): holds a socket whose descriptors in flight this kernel does not show (fdinfo scm_fds, Linux 5.9 and later): descriptor 3 (") {
		t.Fatalf("a socket on a kernel that shows no scm_fds: %v, want %v naming process 4242 and its descriptor 3", err, ErrHidden)
	}
}

// scmFDs reads the count from an fdinfo, and says where it has none.
func TestScmFDs(t *testing.T) {
	for in, want := range map[string][2]int{
		"pos:\t0\nflags:\t02000002\nmnt_id:\t10\nino:\t92057\nscm_fds: 2\n": {2, 1},
		"pos:\t0\nscm_fds:\t0\n": {0, 1},
		"pos:\t0\nino:\t1\n":     {0, 0},
		"scm_fds: x\n":           {0, 0},
	} {
		n, shown := scmFDs([]byte(in))
		if n != want[0] || shown != (want[1] == 1) {
			t.Errorf("scmFDs(%q) = %d, %v; want %d, %v", in, n, shown, want[0], want[1] == 1)
		}
	}
}
