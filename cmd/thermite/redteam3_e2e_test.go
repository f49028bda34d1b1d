package main

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"thermite/controller"
	"thermite/internal/testrig"
)

// Attacks on the disk measure (confined.Usage, confined.Watched and the
// measure of unlinked files, procs.HeldUnlinked): each grows the blocks a
// lane holds in a way the measure might not see, as the lane's own user,
// with a process of the lane left running so that every check measures
// (none reuses an idle figure). Each must end the trial at its 2 MiB cap.
func TestLaneGrowsDiskPastTheMeasureEndsItsTrial(t *testing.T) {
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("needs /usr/bin/python3 to run the attacks as the lane")
	}
	type attack struct{ name, script string }
	attacks := []attack{
		// ext4 gives a symlink whose target is over 60 bytes a block of
		// its own: 3000 of them hold 12 MiB that no walk counted.
		{"puts its bytes in symlink targets", `
os.mkdir("links")
for i in range(3000):
    os.symlink("a" * 4000, "links/%d" % i)
`},
		// A file unlinked, written through its descriptor under the cap,
		// mapped (4 KiB) and its descriptor closed: only the mapping keeps
		// it, and a mapping shows its length, not the file's blocks.
		{"keeps deleted files by a small mapping alone", `
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
for i in range(6):
    fd = os.open("held%d" % i, os.O_RDWR | os.O_CREAT, 0o600)
    os.unlink("held%d" % i)
    os.write(fd, b"x" * (1536 << 10))
    # libc's mmap: Python's own keeps a duplicate of the descriptor.
    if libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0) in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap")
    os.close(fd)
    time.sleep(0.7)
`},
		{"allocates past the size with fallocate KEEP_SIZE", `
fd = os.open("small", os.O_RDWR)
os.posix_fallocate  # the plain call grows the size; KEEP_SIZE does not
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
if libc.fallocate(fd, 1, ctypes.c_long(0), ctypes.c_long(3 << 20)) != 0:
    raise OSError(ctypes.get_errno(), "fallocate")
`},
		{"copies into a file with copy_file_range", `
src = os.open("/usr/bin/python3.11", os.O_RDONLY)
dst = os.open("small", os.O_WRONLY)
n = 0
while n < 3 << 20:
    n += os.copy_file_range(src, dst, (3 << 20) - n)
`},
		{"copies into a file with sendfile", `
src = os.open("/usr/bin/python3.11", os.O_RDONLY)
dst = os.open("small", os.O_WRONLY)
n = 0
while n < 3 << 20:
    n += os.sendfile(dst, src, n, (3 << 20) - n)
`},
		{"copies into a file with splice", `
src = os.open("/usr/bin/python3.11", os.O_RDONLY)
dst = os.open("small", os.O_WRONLY)
r, w = os.pipe()
n = 0
while n < 3 << 20:
    k = os.splice(src, w, 65536)
    while k > 0:
        k -= os.splice(r, dst, k)
    n += 65536
`},
		{"writes with O_DIRECT and pwritev2 flags", `
fd = os.open("small", os.O_WRONLY | os.O_DIRECT)
buf = mmap.mmap(-1, 1 << 20)
buf.write(b"y" * (1 << 20))
for i in range(3):
    os.pwritev(fd, [buf], (i + 1) << 20, os.RWF_DSYNC | os.RWF_HIPRI)
`},
		// A 3000-byte value does not fit in the inode: ext4 gives each
		// file a block of its own for it.
		{"sets large xattrs on files and folders measured before", `
for i in range(800):
    os.setxattr("x/%d" % i, "user.pad", b"v" * 3000)
os.setxattr("x", "user.pad", b"v" * 3000)
`},
	}
	r := testrig.New(t, testrig.Options{Lanes: len(attacks), Extra: "[trial]\ndisk_check = \"300ms\"\ndisk_cap_mb = 2\n"})
	project := makeProject(t, r)
	over := func(s controller.TrialStatus) bool {
		return s.State != "open" && strings.Contains(s.EndReason, "over its disk limit")
	}
	measured := func(s controller.TrialStatus) bool { return s.Disk != nil && s.Disk.Bytes > 0 }
	for i, at := range attacks {
		t.Run(at.name, func(t *testing.T) {
			info, a := startTrial(t, r, i+1, project)
			// What the attack starts from, measured before it runs.
			prep := `: > small && mkdir x && i=0; while [ $i -lt 800 ]; do : > x/$i; i=$((i+1)); done`
			if _, stderr, code := r.Thermite("trial", "exec", info.ID, "--", "sh", "-c", prep); code != 0 {
				t.Fatalf("prepare: %s", stderr)
			}
			script := "import os, mmap, time\ntime.sleep(1.5)\n" + strings.TrimPrefix(at.script, "\n") + "time.sleep(60)\n"
			if code, _, raw := a.do("POST", "/v1/fs/write", map[string]any{"path": "attack.py", "data": []byte(script)}); code != 200 {
				t.Fatalf("fs/write: %d %s", code, raw)
			}
			waitTrial(t, r, info.ID, "a measure", measured)
			cmd := "setsid -f sh -c '/usr/bin/python3 attack.py 2>attack.err' </dev/null >/dev/null 2>&1"
			if _, stderr, code := r.Thermite("trial", "exec", info.ID, "--", "sh", "-c", cmd); code != 0 {
				t.Fatalf("trial exec: %s", stderr)
			}
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(150 * time.Millisecond) {
				s := trialDisk(t, r, info.ID)
				if over(s) {
					t.Logf("ended: %s", s.EndReason)
					break
				}
				if time.Now().After(deadline) {
					errs, _, _ := r.Thermite("trial", "exec", info.ID, "--", "cat", "attack.err")
					t.Fatalf("the trial did not end for its disk: %+v %+v; the attack's errors: %s", s.Trial, s.Disk, errs)
				}
			}
		})
	}
}
