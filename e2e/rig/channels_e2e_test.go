package rig

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"thermite/internal/testrig"
)

// Issue 27: the kernel's channels between roles. Each test is one attack,
// run for real as the role's user, asserting the exact refusal or that the
// attack leaves the other role's work as it was, and that the allowed form
// still works.

// requirePython skips a test whose attack is written in Python.
func requirePython(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("needs /usr/bin/python3 to run the attack as the role")
	}
}

// pyAs runs a Python script as a role through `thermite run-as`; each line
// it prints is "WHAT ok" or "WHAT ERRNO".
func pyAs(t *testing.T, r *testrig.Rig, role, script string, args ...string) map[string]string {
	t.Helper()
	got, err := pyRun(r, role, script, args...)
	if err != "" {
		t.Fatal(err)
	}
	return got
}

// pyRun is pyAs for another goroutine than the test's: it says what went
// wrong rather than ending the test.
func pyRun(r *testrig.Rig, role, script string, args ...string) (map[string]string, string) {
	argv := append([]string{"/usr/bin/python3", "-c", pyPrelude + script}, args...)
	out, stderr, code := r.RunAs(role, nil, argv...)
	if code != 0 {
		return nil, fmt.Sprintf("python as %s: exit %d: %s%s", role, code, out, stderr)
	}
	return pyOutcomes(out), ""
}

// pyPrelude gives a script try_(what, f): it prints what f got.
const pyPrelude = `
import os, sys, errno, fcntl, socket, time
def try_(what, f):
    try:
        f()
        print(what, "ok", flush=True)
    except OSError as e:
        print(what, errno.errorcode.get(e.errno, str(e.errno)), flush=True)
`

func pyOutcomes(out string) map[string]string {
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if i := strings.LastIndex(l, " "); i > 0 {
			got[l[:i]] = l[i+1:]
		}
	}
	return got
}

// A lane reads what it can of the timing user's process, and of another
// lane's, while each runs. /proc, as every role sees it, is the broker's
// own mount with hidepid=invisible (broker.HideProcesses): every file of
// another user's process, stat, status, schedstat, cmdline and io as much
// as its descriptors and memory, is not there at all (ENOENT), and
// listing /proc shows none of their pids. The same files of the lane's
// own process are read. What remains is named, and asserted so the docs
// stay true: a pid is not a file, so kill(pid, 0) (EPERM where the pid
// lives, ESRCH once it is gone) and pidfd_open (a descriptor for any live
// pid, readable when it ends) tell a lane that some process lives under a
// number and when it ends, though not whose it is; seccomp sees only the
// number, never the target's user, so it cannot refuse these for other
// roles' pids alone.
func TestLaneReadingTheTimingUsersAndAnotherLanesProcFilesRefused(t *testing.T) {
	requirePython(t)
	r := newRig(t)
	if v := r.Status().ProcView; strings.HasPrefix(v, "none") || v == "" {
		t.Fatalf("the rig runs without hidepid for its roles (%q): newRig accepts no such loss", v)
	}
	others := []string{"run", "lane-2"}
	done := make(chan string, len(others))
	target := map[string]int{}
	for _, role := range others {
		go func() {
			_, stderr, _ := r.RunAs(role, nil, "sleep", "20")
			done <- stderr
		}()
		var pids []int
		if !waitFor(10*time.Second, func() bool { pids = r.Procs(role); return len(pids) > 0 }) {
			t.Fatalf("%s's sleep did not start", role)
		}
		target[role] = pids[0]
	}
	files := []string{"stat", "status", "schedstat", "cmdline", "io", "environ", "syscall", "stack", "fd", "maps", "mem", "pagemap", "fdinfo", "map_files"}
	script := `
import select
listed = set(os.listdir("/proc"))
for who in sys.argv[1:]:
    name, pid = who.split("=")
    for f in ` + pyList(files) + `:
        p = "/proc/%s/%s" % (pid, f)
        try_(f + " of " + name, lambda: os.listdir(p) if os.path.isdir(p) else open(p, "rb").read(1))
    if pid == "self":
        continue
    print("listed " + name, "yes" if pid in listed else "no", flush=True)
    try_("kill 0 of " + name, lambda: os.kill(int(pid), 0))
    def pidfd():
        fd = os.pidfd_open(int(pid))
        r, _, _ = select.select([fd], [], [], 0)
        os.close(fd)
        if r:
            raise OSError(errno.ESRCH, "ended")
    try_("pidfd_open of " + name, pidfd)
`
	args := []string{"run=" + strconv.Itoa(target["run"]), "lane-2=" + strconv.Itoa(target["lane-2"]), "self=self"}
	got := pyAs(t, r, "lane-1", script, args...)
	for _, role := range others {
		for _, f := range files {
			if g := got[f+" of "+role]; g != "ENOENT" {
				t.Errorf("lane-1 reads /proc/%d/%s of %s: %s, want ENOENT", target[role], f, role, g)
			}
		}
		if got["listed "+role] != "no" {
			t.Errorf("lane-1 lists %s's pid %d in /proc", role, target[role])
		}
		// The named remainder, while it runs.
		if got["kill 0 of "+role] != "EPERM" || got["pidfd_open of "+role] != "ok" {
			t.Errorf("lane-1's kill(pid, 0) and pidfd_open on %s's live pid: %s, %s; the docs name EPERM and a descriptor", role, got["kill 0 of "+role], got["pidfd_open of "+role])
		}
	}
	for _, f := range files {
		// Its own mem and pagemap have nothing at offset 0, and its own
		// kernel stack takes CAP_SYS_ADMIN: the rest it reads.
		if g := got[f+" of self"]; g != "ok" && f != "mem" && f != "pagemap" && f != "stack" {
			t.Errorf("lane-1 reads its own /proc/self/%s: %s, want ok", f, g)
		}
	}
	for _, role := range others {
		r.Thermite("stop", role)
		<-done
	}
	// And once they are gone: ESRCH, which is all the number said.
	got = pyAs(t, r, "lane-1", script, args[:2]...)
	for _, role := range others {
		if got["kill 0 of "+role] != "ESRCH" {
			t.Errorf("lane-1's kill(pid, 0) on %s's ended pid: %s, want ESRCH", role, got["kill 0 of "+role])
		}
	}
}

func pyList(xs []string) string {
	q := make([]string, len(xs))
	for i, x := range xs {
		q[i] = strconv.Quote(x)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// POSIX named semaphores and shared memory live in /dev/shm, closed to
// every role (EACCES). POSIX message queues live in the kernel's mqueue
// file system, one per IPC namespace, shared by every role: there Landlock
// refused only the open, after mq_open(O_CREAT) had made the queue, so the
// name stayed, and another role's mq_open told it from a name never made
// (EACCES against ENOENT). The filter now refuses every queue call
// (EPERM), and no name is left: root, which Landlock does not hold, finds
// none of them (ENOENT). A role's own TMPDIR still takes a file.
func TestLaneNamedSemaphoreAndQueueRefused(t *testing.T) {
	requirePython(t)
	r := newRig(t)
	script := `
import ctypes, platform
rt = ctypes.CDLL("librt.so.1", use_errno=True)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
MQ_OPEN, MQ_UNLINK = {"x86_64": (240, 241), "aarch64": (180, 181)}[platform.machine()]
name = sys.argv[1].encode()
def mq():
    if rt.mq_open(name, os.O_CREAT | os.O_RDWR, 0o666, None) < 0:
        raise OSError(ctypes.get_errno(), "mq_open")
# The system calls themselves (glibc's mq_unlink turns EPERM into EACCES),
# named as the kernel takes them, without the leading slash.
def raw(*args):
    def f():
        if libc.syscall(*args) < 0:
            raise OSError(ctypes.get_errno(), "mq")
    return f
try_("mq_open", mq)
try_("mq_open system call", raw(MQ_OPEN, name[1:], os.O_CREAT | os.O_RDWR, 0o666, None))
try_("mq_unlink system call", raw(MQ_UNLINK, b"thermite-no-such-queue"))
try_("sem in /dev/shm", lambda: os.close(os.open("/dev/shm/sem.thermite-channel", os.O_CREAT | os.O_RDWR, 0o666)))
try_("shm in /dev/shm", lambda: os.close(os.open("/dev/shm/thermite-channel", os.O_CREAT | os.O_RDWR, 0o666)))
try_("file in TMPDIR", lambda: os.close(os.open(os.environ["TMPDIR"] + "/sem.own", os.O_CREAT | os.O_RDWR, 0o600)))
`
	for _, role := range []string{"lane-1", "lane-2", "agent-1", "run", "builder"} {
		name := "/thermite-channel-" + role + "-" + ipcKey()
		got := pyAs(t, r, role, script, name)
		for what, want := range map[string]string{"mq_open": "EPERM", "mq_open system call": "EPERM", "mq_unlink system call": "EPERM", "sem in /dev/shm": "EACCES", "shm in /dev/shm": "EACCES", "file in TMPDIR": "ok"} {
			if got[what] != want {
				t.Errorf("%s: %s: %s, want %s", role, what, got[what], want)
			}
		}
		if left := rootOpensQueue(name); left != "ENOENT" {
			t.Errorf("%s's mq_open left the queue %s for another role to see: root's mq_open: %s, want ENOENT", role, name, left)
		}
	}
}

// rootOpensQueue opens the POSIX message queue name ("/NAME") as the test
// (root, with no rule set), removing it if it is there, and says what it
// got. The system call takes the name without its slash, as glibc passes
// it.
func rootOpensQueue(name string) string {
	p, err := unix.BytePtrFromString(strings.TrimPrefix(name, "/"))
	if err != nil {
		return err.Error()
	}
	fd, _, errno := unix.Syscall(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(p)), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if errno != 0 {
		return unix.ErrnoName(errno)
	}
	unix.Close(int(fd))
	unix.Syscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(p)), 0, 0)
	return "ok"
}

// A lane leaves a process holding every lock it can take on what other
// roles open: flock on the run's research folders and on /etc/passwd and
// /etc/group, a POSIX read lock on both, and a write lease on a file of its
// research area. The locks are advisory and the controller and broker take
// none of them (the broker's own lock, /etc/.pwd.lock, is root's 0600: the
// lane cannot open it), and what opens a lane's files opens them O_PATH
// or O_NONBLOCK, which no lease holds: another lane's trial on the same
// run starts, runs a command and ends, and the lane's own trial ends, each
// in its usual time.
func TestLaneLockingSharedFilesCannotStallTheController(t *testing.T) {
	requirePython(t)
	r := newRig(t)
	t1, _ := startTrial(t, r, 1, makeProject(t, r))
	holder := `
import os, fcntl, time, sys
held = []
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    if os.path.isfile(p):
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    held.append(fd)
lease = os.path.join(sys.argv[1], "lanes", "lane-1", "leased")
fd = os.open(lease, os.O_CREAT | os.O_WRONLY, 0o644)
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
held.append(fd)
open(os.environ["HOME"] + "/locked", "w").close()
time.sleep(600)
`
	locked := []string{t1.ResearchDir, filepath.Join(t1.ResearchDir, "lanes"), filepath.Join(t1.ResearchDir, "pages"), "/etc/passwd", "/etc/group"}
	argv := append([]string{"trial", "exec", t1.ID, "--", "sh", "-c", `setsid -f /usr/bin/python3 -c "$0" "$@" </dev/null >/dev/null 2>&1`, holder}, locked...)
	if _, stderr, code := r.Thermite(argv...); code != 0 {
		t.Fatalf("trial exec the lock holder: exit %d %s", code, stderr)
	}
	lane1 := r.Role("lane-1")
	mark := filepath.Join(r.Cfg.ScratchDir(), "home", lane1.Name, "locked")
	if !waitFor(10*time.Second, func() bool { _, err := os.Stat(mark); return err == nil }) {
		t.Fatal("lane-1's lock holder did not take its locks (a lock or the lease refused)")
	}
	timed := func(what string, max time.Duration, f func()) {
		t.Helper()
		start := time.Now()
		f()
		if d := time.Since(start); d > max {
			t.Errorf("%s took %v while lane-1 holds its locks, want under %v", what, d.Round(time.Millisecond), max)
		} else {
			t.Logf("%s: %v", what, d.Round(time.Millisecond))
		}
	}
	var t2 struct{ ID string }
	timed("lane 2's trial start on the same run", 10*time.Second, func() {
		info, _ := startTrial(t, r, 2, makeProject(t, r))
		t2.ID = info.ID
	})
	timed("lane 2's command", 10*time.Second, func() {
		if out, stderr, code := r.Thermite("trial", "exec", t2.ID, "--", "cat", "README"); code != 0 || !strings.Contains(out, "hello project") {
			t.Errorf("lane 2's command: exit %d %q %s", code, out, stderr)
		}
	})
	timed("lane 2's trial end", 10*time.Second, func() {
		if _, stderr, code := r.Thermite("trial", "end", t2.ID); code != 0 {
			t.Errorf("lane 2's trial end: exit %d %s", code, stderr)
		}
	})
	timed("lane 1's trial end (stop, measure, publish)", 10*time.Second, func() {
		if _, stderr, code := r.Thermite("trial", "end", t1.ID); code != 0 {
			t.Errorf("lane 1's trial end: exit %d %s", code, stderr)
		}
	})
	// The broker's own lock is out of every role's reach.
	if _, err := os.Stat("/etc/.pwd.lock"); err == nil {
		if got := r.Probe("lane-2", "read", "/etc/.pwd.lock"); got != "EACCES" {
			t.Errorf("lane-2 opens /etc/.pwd.lock: %s, want EACCES", got)
		}
	}
}

// A lane makes a FIFO and a listening unix socket in its research area,
// then its trial ends: the publish walk never opens either (the end is not
// held) and removes both, naming them in the trial's end event, since a
// published FIFO every role may open would hold each reader that opens it
// to read (a lane reading the run's research) until a writer comes, which
// none ever does. Lane-2's blocking open of the FIFO's path returns at
// once, finding nothing (ENOENT); the lane's plain file is published and
// lane-2 reads it.
func TestLaneFIFOInResearchAreaCannotStallAnotherRole(t *testing.T) {
	requirePython(t)
	r := newRig(t)
	t1, _ := startTrial(t, r, 1, makeProject(t, r))
	fifo := filepath.Join(t1.LaneArea, "pipe")
	sock := filepath.Join(t1.LaneArea, "sock")
	note := filepath.Join(t1.LaneArea, "note")
	if _, stderr, code := r.Thermite("trial", "exec", t1.ID, "--", "sh", "-c", "mkfifo -m 0666 "+fifo+" && echo kept > "+note); code != 0 {
		t.Fatalf("lane-1 makes a FIFO in its research area: exit %d %s", code, stderr)
	}
	listener := `import socket, os, time, sys
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o777); s.listen(8); time.sleep(600)`
	if _, stderr, code := r.Thermite("trial", "exec", t1.ID, "--", "sh", "-c", `setsid -f /usr/bin/python3 -c "$0" "$1" </dev/null >/dev/null 2>&1`, listener, sock); code != 0 {
		t.Fatalf("lane-1 listens in its research area: exit %d %s", code, stderr)
	}
	if !waitFor(10*time.Second, func() bool { _, err := os.Stat(sock); return err == nil }) {
		t.Fatal("lane-1's socket did not appear")
	}
	start := time.Now()
	if _, stderr, code := r.Thermite("trial", "end", t1.ID); code != 0 {
		t.Fatalf("trial end: exit %d %s", code, stderr)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the trial's end took %v with a FIFO in its research area", d)
	}
	for _, p := range []string{fifo, sock} {
		if st, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("published with the research area: %s (%v, %v), want it removed", p, st, err)
		}
	}
	// Lane-2 opens the FIFO's path as a reader does, blocking: it must
	// return, whatever it finds, or it is held.
	type answer struct {
		got map[string]string
		err string
	}
	answered := make(chan answer, 1)
	go func() {
		var a answer
		a.got, a.err = pyRun(r, "lane-2", `
try_("read-open the FIFO", lambda: os.close(os.open(sys.argv[1], os.O_RDONLY)))
try_("read the note", lambda: open(sys.argv[2]).read())
`, fifo, note)
		answered <- a
	}()
	select {
	case a := <-answered:
		if a.err != "" {
			t.Fatal(a.err)
		}
		if a.got["read-open the FIFO"] != "ENOENT" || a.got["read the note"] != "ok" {
			t.Errorf("lane-2 after the publish: %v, want the FIFO ENOENT and the note ok", a.got)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("lane-2's read-open of the FIFO's published path did not return in 60 s: it is held")
	}
	out, stderr, code := r.Thermite("ledger", "export")
	if code != 0 {
		t.Fatalf("ledger export: exit %d %s", code, stderr)
	}
	found := false
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, `"trial.end"`) && strings.Contains(l, t1.ID) {
			found = strings.Contains(l, `"research_removed"`) && strings.Contains(l, fifo) && strings.Contains(l, sock)
		}
	}
	if !found {
		t.Errorf("the trial's end event does not name the FIFO and the socket it removed:\n%s", out)
	}
}

// heldFrom lists what a process's descriptors hold of what a role passed
// it: a memfd named name, any pidfd, and any file whose owner is uid (a
// memfd is its maker's, as is every file a role makes).
func heldFrom(t *testing.T, pid int, name string, uid int) []string {
	t.Helper()
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil // the process ended
	} else if err != nil {
		t.Fatalf("%s: %v", dir, err)
	}
	var held []string
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		l, err := os.Readlink(p)
		if err != nil {
			continue // closed since the listing
		}
		var st syscall.Stat_t
		owned := syscall.Stat(p, &st) == nil && int(st.Uid) == uid
		if strings.Contains(l, "memfd:"+name) || strings.Contains(l, "[pidfd]") || owned {
			held = append(held, fmt.Sprintf("%s -> %s (uid %d)", e.Name(), l, st.Uid))
		}
	}
	return held
}

// A role hands a memfd (and a pidfd of itself) over the socket of another
// role's it reaches by design, its harness API socket, with a request in
// the same message, and keeps its end open: the controller reads its
// connections with read(2), which takes no descriptors, so the kernel
// drops them and the controller holds none: no memfd, no pidfd, no file
// of the role's at all. The agent tries it on its socket, the lane on its
// own (each lane and agent has one). Passed over a socketpair of its own,
// the same memfd arrives and reads back, and the role's own process shows
// it (so the controller's listing would show one too).
func TestAgentPassingAMemfdOverItsAPISocketKeepsNothingInTheController(t *testing.T) {
	requirePython(t)
	r := newRig(t)
	info, _ := startTrial(t, r, 1, makeProject(t, r))
	tok, err := os.ReadFile(info.TokenFile)
	if err != nil {
		t.Fatal(err)
	}
	passMemfd(t, r, "agent-1", strings.TrimSpace(string(tok)))
	// A lane's socket serves a lane harness run's token alone.
	passMemfd(t, r, "lane-1", startLaneRun(t, r, info.ID).token)
}

// passMemfd runs one role's attempt of
// TestAgentPassingAMemfdOverItsAPISocketKeepsNothingInTheController.
func passMemfd(t *testing.T, r *testrig.Rig, role, token string) {
	t.Helper()
	name := "thermite-channel-" + ipcKey()
	sent := filepath.Join(r.Cfg.ScratchDir(), "home", role, "sent")
	type answer struct {
		got map[string]string
		err string
	}
	answered := make(chan answer, 1)
	go func() {
		var a answer
		a.got, a.err = pyRun(r, role, `
import array
name = sys.argv[2]
mfd = os.memfd_create(name); os.write(mfd, b"from " + os.environ.get("USER", "the role").encode())
os.lseek(mfd, 0, 0); mine = os.read(mfd, 100)
pfd = os.pidfd_open(os.getpid())
fds = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [mfd, pfd]))]
a, b = socket.socketpair()
a.sendmsg([b"x"], fds)
msg, anc, _, _ = b.recvmsg(1, socket.CMSG_SPACE(8))
got = array.array("i"); got.frombytes(anc[0][2])
os.lseek(got[0], 0, 0)
print("own socketpair", "ok" if os.read(got[0], 100) == mine else "lost", flush=True)
s = socket.socket(socket.AF_UNIX)
def send():
    s.connect(sys.argv[1])
    s.sendmsg([b"GET /v1/trial HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer " + sys.argv[3].encode() + b"\r\nConnection: keep-alive\r\n\r\n"], fds)
    s.settimeout(10)
    if not s.recv(100).startswith(b"HTTP/1.1 200"):
        raise OSError(errno.EPROTO, "no 200 answer")
try_("the API socket", send)
open(os.environ["HOME"] + "/sent", "w").close()
time.sleep(3)
`, r.Cfg.RoleAPISocket(role), name, token)
		answered <- a
	}()
	// While the role still holds its connection and its memfd.
	if !waitFor(30*time.Second, func() bool { _, err := os.Stat(sent); return err == nil }) {
		a := <-answered
		t.Fatalf("%s never reported its descriptors sent: %v %s", role, a.got, a.err)
	}
	uid := r.Role(role).UID
	if held := heldFrom(t, controllerPID(t, r), name, uid); len(held) > 0 {
		t.Errorf("the controller holds what %s passed it: %v", role, held)
	}
	seen := false
	for _, pid := range r.Procs(role) {
		seen = seen || len(heldFrom(t, pid, name, uid)) > 0
	}
	if !seen {
		t.Errorf("no process of %s shows its memfd, so the controller's listing proves nothing", role)
	}
	a := <-answered
	if a.err != "" {
		t.Fatal(a.err)
	}
	if got := a.got; got["own socketpair"] != "ok" || got["the API socket"] != "ok" {
		t.Fatalf("%s passing a memfd: %v, want both ok", role, got)
	}
	os.Remove(sent)
}
