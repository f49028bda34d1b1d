package rig

import (
	"fmt"
	"os"
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
		// A folder of long names (1.5 MiB of folder blocks) emptied and
		// removed while a descriptor of it stays open: ext4 frees its
		// blocks only when the last one closes.
		{"keeps deleted folders by a descriptor", `
keep = []
for r in range(6):
    d = "big%d" % r
    os.mkdir(d)
    for i in range(5000):
        open("%s/%0200d" % (d, i), "w").close()
    for i in range(5000):
        os.unlink("%s/%0200d" % (d, i))
    keep.append(os.open(d, os.O_RDONLY | os.O_DIRECTORY))
    os.rmdir(d)
    time.sleep(0.7)
`},
		// The main thread ends alone (exit, not exit_group): /proc/PID/fd
		// and /proc/PID/maps are then the dead leader's, empty, while
		// another thread keeps every descriptor.
		{"holds deleted files in a thread after its main thread ended", `
import ctypes, threading
def hold():
    keep = []
    for i in range(6):
        fd = os.open("held%d" % i, os.O_RDWR | os.O_CREAT, 0o600)
        os.unlink("held%d" % i)
        os.write(fd, b"x" * (1536 << 10))
        keep.append(fd)
        time.sleep(0.7)
    time.sleep(60)
threading.Thread(target=hold).start()
time.sleep(0.2)
ctypes.CDLL(None).syscall(60, 0)
`},
		// A thread cloned without CLONE_FILES has a descriptor table of
		// its own, which /proc/PID/fd (the leader's) does not show.
		{"holds deleted files in a thread with a descriptor table of its own", `
import subprocess
open("t.c", "w").write(r"""
#define _GNU_SOURCE
#include <sched.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <time.h>
static char buf[1536 << 10];
static char stack[1 << 16];
static int hold(void *arg) {
	struct timespec ts = {0, 700000000};
	for (int i = 0; i < 6; i++) {
		char name[] = "heldN";
		name[4] = '0' + i;
		int fd = syscall(SYS_openat, AT_FDCWD, name, O_RDWR | O_CREAT, 0600);
		syscall(SYS_unlinkat, AT_FDCWD, name, 0);
		syscall(SYS_write, fd, buf, sizeof buf);
		syscall(SYS_nanosleep, &ts, 0);
	}
	for (;;) syscall(SYS_pause);
}
int main(void) {
	for (int i = 0; i < (int)sizeof buf; i++) buf[i] = 'x';
	clone(hold, stack + sizeof stack, CLONE_VM | CLONE_SIGHAND | CLONE_THREAD | CLONE_FS, 0);
	sleep(60);
	return 0;
}
""")
subprocess.check_call(["gcc", "-O1", "-o", "t", "t.c"])
os.execv("./t", ["./t"])
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
		// The folder x, watched in the workspace's tree, moved into HOME
		// (another measured tree, whose measure may run first and find
		// the folder still watched by the workspace's), then grown there.
		{"moves a watched folder into its HOME and grows it there", `
home = os.environ["HOME"]
os.rename("x", home + "/x")
with open(home + "/x/0", "ab") as f:
    f.write(b"z" * (3 << 20))
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
			// Each attack is its own lane's: they run side by side.
			t.Parallel()
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

// threadcredAttack looks, as the lane, for the broker's thread that
// measures the lane's unlinked files with the lane's effective uid
// (threadcred.As: real and saved uid root), and tries on it what a
// process may do to another of its own effective uid: signal it, renice
// it, move its CPUs or its I/O priority, trace it, read its memory and
// its /proc entries. Each outcome goes to a line of threadcred.out.
const threadcredAttack = `
import ctypes, errno, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
uid = os.getuid()
out = open("threadcred.out", "w")
def sc(*a):
    r = libc.syscall(*[ctypes.c_long(x) for x in a])
    return "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
def py(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
brokers = [int(sys.argv[1])]  # the broker's pid, as status shows it
found = 0
end = time.time() + 8
while time.time() < end and found < 5:
    for b in brokers:
        try:
            tids = os.listdir("/proc/%d/task" % b)
        except OSError:
            continue
        for t in tids:
            try:
                st = open("/proc/%d/task/%s/status" % (b, t)).read()
            except OSError:
                continue
            u = [l for l in st.splitlines() if l.startswith("Uid:")][0].split()[1:]
            if int(u[1]) != uid:
                continue
            t = int(t)
            found += 1
            res = {
                "tgkill 0": sc(234, b, t, 0),
                "setpriority": py(lambda: os.setpriority(os.PRIO_PROCESS, t, 19)),
                "sched_setaffinity": py(lambda: os.sched_setaffinity(t, {0})),
                "ioprio_set": sc(251, 1, t, (3 << 13)),
                "ptrace seize": sc(101, 0x4206, t, 0, 0),
                "read its mem": py(lambda: open("/proc/%d/task/%d/mem" % (b, t), "rb").read(1)),
                "list its fds": py(lambda: os.listdir("/proc/%d/task/%d/fd" % (b, t))),
                "read its environ": py(lambda: open("/proc/%d/task/%d/environ" % (b, t), "rb").read(1)),
                "prlimit": sc(302, t, 7, 0, 0),
            }
            # The thread may end while tried: ESRCH is no answer.
            if "ESRCH" in res.values() or "ENOENT" in res.values():
                found -= 1
                continue
            out.write(repr(sorted(res.items())) + "\n")
            out.flush()
out.close()
`

// The broker measures a lane's unlinked files on a thread of its own with
// the lane's effective uid (threadcred.As): a process of the lane can find
// it (a thread's status is readable by everyone) and must reach it in no
// way. Signals, prlimit and ptrace check the thread's real and saved uid
// (root's): EPERM. Renice, affinity and I/O priority pass the ownership
// check on the effective uid and are refused by cap_safe_nice (the
// thread's permitted capabilities are not a subset of the lane's): EPERM.
// Its /proc entries are root's (the broker is not dumpable): EACCES.
func TestLaneReachesTheBrokersMeasureThreadRefused(t *testing.T) {
	r, info := pythonAttackTrial(t, "100ms", threadcredAttack)
	// A process left running: every check measures the unlinked files.
	r.Thermite("trial", "exec", info.ID, "--", "sh", "-c", "setsid -f sleep 60 </dev/null >/dev/null 2>&1")
	out, stderr, code := r.Thermite("trial", "exec", info.ID, "--", "sh", "-c", "/usr/bin/python3 attack.py "+itoa(r.Status().BrokerPID)+" && cat threadcred.out")
	if code != 0 {
		t.Fatalf("the attack: exit %d %s %s", code, out, stderr)
	}
	if strings.TrimSpace(out) == "" {
		t.Skip("the lane never saw the measure's thread in 8 s: nothing was tried")
	}
	want := "[('ioprio_set', 'EPERM'), ('list its fds', 'EACCES'), ('prlimit', 'EPERM'), ('ptrace seize', 'EPERM'), ('read its environ', 'EACCES'), ('read its mem', 'EACCES'), ('sched_setaffinity', 'EPERM'), ('setpriority', 'EPERM'), ('tgkill 0', 'EPERM')]"
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l != want {
			t.Errorf("the lane's attempts on the broker's measure thread:\n got %s\nwant %s", l, want)
		}
	}
	t.Logf("the lane's attempts:\n%s", out)
}

// brokerWatches counts the inotify watches the broker holds.
func brokerWatches(t *testing.T, pid int) int {
	t.Helper()
	dir := "/proc/" + itoa(pid) + "/fdinfo"
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		b, _ := os.ReadFile(dir + "/" + e.Name())
		n += strings.Count(string(b), "inotify wd:")
	}
	return n
}

// Each folder of a role's trees takes one inotify watch, charged to root
// (fs.inotify.max_user_watches counts per user, and the broker is root):
// a lane that makes folders by the thousand, within its disk cap, would
// take root's watches from every other root program of the host. The
// broker holds at most watchesPerRole of them for one role; past that,
// the lane's folder is walked whole at each check, and still measured.
func TestLaneFoldersTakeRootsInotifyWatchesBounded(t *testing.T) {
	// Alone: root's inotify watches are every rig's on the machine.
	r := testrig.New(t, testrig.Options{Extra: "[trial]\ndisk_check = \"300ms\"\ndisk_cap_mb = 100\n", Alone: true})
	info, _ := startTrial(t, r, 1, makeProject(t, r))
	bp := r.Status().BrokerPID
	before := brokerWatches(t, bp)
	// 20000 folders (80 MiB of folder blocks), and a process left running
	// so that the checks measure incrementally.
	mk := `python3 -c 'import os
for i in range(200):
    os.mkdir("d%d" % i)
    for j in range(100): os.mkdir("d%d/%d" % (i, j))' && setsid -f sleep 60 </dev/null >/dev/null 2>&1`
	if _, stderr, code := r.Thermite("trial", "exec", info.ID, "--", "sh", "-c", mk); code != 0 {
		t.Fatalf("trial exec: %s", stderr)
	}
	measured := func(s controller.TrialStatus) bool { return s.Disk != nil && s.Disk.Bytes > 20000*4096 }
	waitTrial(t, r, info.ID, "a measure of the 20000 folders", measured)
	time.Sleep(time.Second)
	got := brokerWatches(t, bp) - before
	t.Logf("the broker holds %d more inotify watches after lane-1 made 20000 folders", got)
	if got > 8192 {
		t.Errorf("the broker holds %d inotify watches of root's for one lane's folders, want at most 8192", got)
	}
	// Walked whole, the folder is still measured: 40 MiB more, deep
	// inside, put the lane over its 100 MiB.
	// The check may end the trial before the exec's answer is out, which
	// then ends with the broker's connection: what counts is the end.
	if _, stderr, code := r.Thermite("trial", "exec", info.ID, "--", "dd", "if=/dev/zero", "of=d7/7/late", "bs=1M", "count=40"); code != 0 {
		t.Logf("trial exec of the 40 MiB ended %d: %s", code, stderr)
	}
	over := func(s controller.TrialStatus) bool {
		return s.State != "open" && strings.Contains(s.EndReason, "over its disk limit")
	}
	waitTrial(t, r, info.ID, "the end for its disk after 40 MiB more in a folder past the watches", over)
	if !strings.Contains(r.LogText(), "more folders than the inotify watches a measure may hold") {
		t.Error("the broker's log does not say why the folder is walked whole")
	}
}

// mappingsFlood maps one small file 60000 times (offsets that never let
// two neighbours merge) and forks 19 copies: 1.2 million lines of
// /proc/PID/maps for the measure of unlinked files to read at each check.
const mappingsFlood = `
import ctypes, mmap, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd = os.open("pages", os.O_RDWR | os.O_CREAT, 0o600)
os.ftruncate(fd, 3 * 4096)
for i in range(60000):
    if libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, (i % 2) * 8192) in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap %d" % i)
for i in range(19):
    if os.fork() == 0:
        break
time.sleep(60)
`

// brokerCPU is the broker's user and system time so far, in clock ticks.
func brokerCPU(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	var u, s int64
	fmt.Sscan(f[11], &u)
	fmt.Sscan(f[12], &s)
	return u + s
}

// A lane whose processes hold mappings by the million would make every
// disk check read them all (/proc/PID/maps, to find deleted files kept by
// a mapping): seconds of the broker's CPU per check, for good. Past
// procs.MaxMappings lines in one measure, the measure stops and the
// trial ends, as for a tree too large to walk.
func TestLaneFloodsTheMeasureWithMappingsEndsItsTrial(t *testing.T) {
	r, info := pythonAttackTrial(t, "300ms", mappingsFlood)
	bp := r.Status().BrokerPID
	cpu0 := brokerCPU(t, bp)
	if _, stderr, code := r.Thermite("trial", "exec", info.ID, "--", "sh", "-c", "setsid -f /usr/bin/python3 attack.py </dev/null >/dev/null 2>attack.err"); code != 0 {
		t.Fatalf("trial exec: %s", stderr)
	}
	start := time.Now()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		s := trialDisk(t, r, info.ID)
		if s.State != "open" {
			if !strings.Contains(s.EndReason, "mappings") {
				t.Fatalf("the trial ended for another reason: %s", s.EndReason)
			}
			t.Logf("ended after %v: %s", time.Since(start).Round(time.Millisecond), s.EndReason)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the trial is still open after 20 s of checks that read its mappings; the broker used %d ticks of CPU meanwhile", brokerCPU(t, bp)-cpu0)
		}
	}
	t.Logf("the broker used %d ticks of CPU", brokerCPU(t, bp)-cpu0)
}

// The broker takes a command whose argv[0] is /proc/self/exe for one of
// its own (a lane's file helper, a probe): the disk check passes over its
// processes as the rig's, counts the role idle while only they run, and the
// file helper's filter keeps openat2. A lane's exec, from the operator or
// the agent's API, naming it is refused; other commands still run.
func TestLaneRunsThermiteItselfAsTheRigsOwnCommandRefused(t *testing.T) {
	r := testrig.New(t, testrig.Options{})
	info, a := startTrial(t, r, 1, makeProject(t, r))
	for _, argv := range [][]string{
		{"/proc/self/exe", "__lanefs", info.Workspace, info.ResearchDir},
		{"/proc/self/exe", "__probe"},
		{"/proc/./self/exe", "__probe"},
	} {
		_, stderr, code := r.Thermite(append([]string{"trial", "exec", info.ID, "--"}, argv...)...)
		if code == 0 || !strings.Contains(stderr, "thermite itself, which only the rig starts") {
			t.Errorf("trial exec %q: exit %d %q; want a refusal naming thermite itself", argv, code, stderr)
		}
		code, _, raw := a.do("POST", "/v1/exec", map[string]any{"argv": argv})
		if code != 400 || !strings.Contains(raw, "thermite itself") {
			t.Errorf("the agent's exec %q: %d %s; want 400 naming thermite itself", argv, code, raw)
		}
	}
	if out, stderr, code := r.Thermite("trial", "exec", info.ID, "--", "echo", "ok"); code != 0 || !strings.Contains(out, "ok") {
		t.Fatalf("a plain command: exit %d %q %q", code, out, stderr)
	}
}

// pythonAttackTrial starts a rig that checks disk use every check, and a
// trial on lane-1 whose workspace holds script as attack.py.
func pythonAttackTrial(t *testing.T, check, script string) (*testrig.Rig, controller.TrialInfo) {
	t.Helper()
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("needs /usr/bin/python3 to run the attack as the lane")
	}
	r := testrig.New(t, testrig.Options{Extra: "[trial]\ndisk_check = \"" + check + "\"\n"})
	info, a := startTrial(t, r, 1, makeProject(t, r))
	if code, _, raw := a.do("POST", "/v1/fs/write", map[string]any{"path": "attack.py", "data": []byte(script)}); code != 200 {
		t.Fatalf("fs/write: %d %s", code, raw)
	}
	return r, info
}
