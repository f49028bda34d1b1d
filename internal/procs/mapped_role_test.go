package procs_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"thermite/internal/caps"
	"thermite/internal/procs"
	"thermite/internal/testrig"
	"thermite/internal/threadcred"
)

// mapDeleted is a program of the role: it makes the file argv[1] of
// argv[2] bytes, writes argv[3] bytes of it, maps argv[4] bytes of it
// shared, unlinks it and closes its descriptor, so that the mapping alone
// keeps it; argv[5] children (killed with it) inherit the mapping. libc's
// mmap: Python's own keeps a duplicate of the descriptor.
const mapDeleted = `
import ctypes, mmap, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
path, size, written, maplen, children = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
os.ftruncate(fd, size)
os.pwrite(fd, b"x" * written, 0)
os.fsync(fd)
if libc.mmap(None, maplen, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0) in (None, ctypes.c_void_p(-1).value):
    raise OSError(ctypes.get_errno(), "mmap")
os.unlink(path)
os.close(fd)
for i in range(children):
    r, w = os.pipe()
    if os.fork() == 0:
        libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
        os.write(w, b".")
        time.sleep(60)
        sys.exit(0)
    os.read(r, 1)  # the child dies with this process from now on
print(flush=True)
time.sleep(60)
`

// A process of the role that keeps a deleted file by a mapping alone (its
// descriptor closed) is measured as the broker measures it: on a thread
// that is the role's, reading the mapping's /proc/PID/map_files entry with
// CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN raised for that stat. The file
// counts its blocks, not the mapping's length, once however many
// processes map it; without the capability the kernel refuses the entry
// (EPERM) and the measure fails, naming the process and the file.
func TestRoleMapsADeletedFileCountsItsBlocks(t *testing.T) {
	testrig.RequireRoot(t)
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("needs /usr/bin/python3 to map a file as the role")
	}
	c := caps.PermittedOf(caps.MapFiles)
	if c < 0 {
		t.Skip("needs CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN (the broker's with agent.egress) to read map_files")
	}
	uid := testrig.FreeUIDs(t)
	dir := t.TempDir()
	os.Chmod(filepath.Dir(dir), 0o755)
	os.Chmod(dir, 0o755)
	own := filepath.Join(dir, "own")
	os.Mkdir(own, 0o700)
	os.Chown(own, uid, uid)
	var fs unix.Stat_t
	if err := unix.Stat(own, &fs); err != nil {
		t.Fatal(err)
	}
	disk := map[uint64]bool{fs.Dev: true}
	measure := func(statMapped procs.StatMapped) (procs.Held, error) {
		var h procs.Held
		err := threadcred.As(uid, uid, func() error {
			var err error
			h, err = procs.HeldUnlinkedOn("/proc", uid, nil, 0, disk, statMapped)
			return err
		})
		return h, err
	}
	raised := func(path string, st *unix.Stat_t) error {
		return caps.WithEffective(c, func() error { return unix.Stat(path, st) })
	}
	start := func(t *testing.T, name string, size, written, maplen, children int) *exec.Cmd {
		return startAs(t, uid, "/usr/bin/python3", "-c", mapDeleted, filepath.Join(own, name),
			strconv.Itoa(size), strconv.Itoa(written), strconv.Itoa(maplen), strconv.Itoa(children))
	}
	const mib = 1 << 20

	t.Run("one page of a 1 MiB file counts 1 MiB", func(t *testing.T) {
		p := start(t, "page", mib, mib, 4096, 0)
		h, err := measure(raised)
		if err != nil || h.Files != 1 || h.Bytes < mib || h.Bytes > mib+64<<10 {
			t.Fatalf("measure: %+v %v, want the one file's 1 MiB of blocks", h, err)
		}
		// Without the capability the kernel refuses the entry.
		h, err = measure(unix.Stat)
		want := "process " + strconv.Itoa(p.Process.Pid) + " (python3): maps a deleted file \"" + filepath.Join(own, "page") + "\""
		if !errors.Is(err, procs.ErrHidden) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "map_files/") || !strings.Contains(err.Error(), "operation not permitted") {
			t.Fatalf("measure with no capability: %+v %v, want %v: %s ... map_files/...: operation not permitted", h, err, procs.ErrHidden, want)
		}
	})
	t.Run("a sparse 1 GiB file mapped whole counts its 4 KiB", func(t *testing.T) {
		start(t, "sparse", 1<<30, 4096, 1<<30, 0)
		h, err := measure(raised)
		if err != nil || h.Files != 1 || h.Bytes < 4096 || h.Bytes > 64<<10 {
			t.Fatalf("measure: %+v %v, want the sparse file's 4 KiB of blocks, not its 1 GiB mapping", h, err)
		}
	})
	t.Run("one file mapped by two processes counts once", func(t *testing.T) {
		p := start(t, "shared", mib, mib, mib, 1)
		if n := len(childrenOf(p.Process.Pid)); n != 1 {
			t.Fatalf("%d children, want the 1 that inherits the mapping", n)
		}
		h, err := measure(raised)
		if err != nil || h.Files != 1 || h.Bytes < mib || h.Bytes > mib+64<<10 {
			t.Fatalf("measure: %+v %v, want the one file's 1 MiB once", h, err)
		}
	})
}

// childrenOf lists the children of pid (/proc/PID/task/PID/children).
func childrenOf(pid int) []string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(pid) + "/children")
	return strings.Fields(string(b))
}

// mapManyDeleted is a program of the role that keeps argv[2] deleted
// files of 4 KiB in the folder argv[1], each by a one-page mapping alone.
const mapManyDeleted = `
import ctypes, mmap, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
for i in range(int(sys.argv[2])):
    p = os.path.join(sys.argv[1], str(i))
    fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.unlink(p)
    os.write(fd, b"x" * 4096)
    if libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0) in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap")
    os.close(fd)
print(flush=True)
time.sleep(600)
`

// BenchmarkHeldUnlinkedMappedAsRole is one role's measure as the broker
// makes it, with one process of the role keeping N deleted files by a
// mapping alone: each costs its maps line and one map_files stat with the
// capability raised and lowered around it ("maps only": the maps lines
// alone, as the measure read them before).
//
//	go test ./internal/procs -run '^$' -bench HeldUnlinkedMappedAsRole
func BenchmarkHeldUnlinkedMappedAsRole(b *testing.B) {
	testrig.RequireRoot(b)
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		b.Skip("needs /usr/bin/python3 to map files as the role")
	}
	c := caps.PermittedOf(caps.MapFiles)
	if c < 0 {
		b.Skip("needs CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN to read map_files")
	}
	raised := func(path string, st *unix.Stat_t) error {
		return caps.WithEffective(c, func() error { return unix.Stat(path, st) })
	}
	for _, n := range []int{0, 100, 1000, 10000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			uid := testrig.FreeUIDs(b)
			dir := b.TempDir()
			os.Chmod(filepath.Dir(dir), 0o755)
			os.Chmod(dir, 0o755)
			own := filepath.Join(dir, "own")
			os.Mkdir(own, 0o700)
			os.Chown(own, uid, uid)
			var fs unix.Stat_t
			unix.Stat(own, &fs)
			disk := map[uint64]bool{fs.Dev: true}
			startAs(b, uid, "/usr/bin/python3", "-c", mapManyDeleted, own, strconv.Itoa(n))
			// map_files: as the broker measures; maps only: the same walk
			// with no file system known as the role's (each mapping's
			// length, no stat), what the walk cost before.
			for _, m := range []struct {
				name string
				disk map[uint64]bool
			}{{"map_files", disk}, {"maps only", nil}} {
				b.Run(m.name, func(b *testing.B) {
					for b.Loop() {
						var h procs.Held
						err := threadcred.As(uid, uid, func() error {
							var err error
							h, err = procs.HeldUnlinkedOn("/proc", uid, nil, 0, m.disk, raised)
							return err
						})
						if err != nil || h.Files != n {
							b.Fatalf("measure: %+v %v, want %d files", h, err, n)
						}
					}
				})
			}
		})
	}
}
