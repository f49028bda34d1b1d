package rig

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Issue 27, the judge's side: a lane tries to open its research area to
// every role and listens there on a socket anyone may connect to, waiting
// for a judged candidate (its own code, run as the timing user with the
// kit's hidden inputs) to hand it what the lane must not see. The timing
// user and the builder make no unix socket at all (EPERM), so they reach
// no listener; they make no FIFO in their own places either (EACCES), and
// no socket file, so no lane finds a listener of theirs. A socket pair,
// which has no name, works, and so does what glibc does over a socket
// (nscd, /dev/log), which fails soft. Another lane is refused (EACCES):
// the area's top is not the lane's to open. The lane's own connect works:
// the listener is there.
func TestCandidateReachingALanesSocketRefused(t *testing.T) {
	requirePython(t)
	r := newRig(t)
	t1, _ := startTrial(t, r, 1, makeProject(t, r))
	sock := filepath.Join(t1.LaneArea, "drop.sock")
	listener := `import socket, os, sys
try:
    os.chmod(os.path.dirname(sys.argv[1]), 0o755)
except PermissionError:
    pass  # the area's top is not the lane's: it listens all the same
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o777); s.listen(8)
s.settimeout(120)
while True:
    c, _ = s.accept(); c.sendall(b"hello"); c.close()`
	if _, stderr, code := r.Thermite("trial", "exec", t1.ID, "--", "sh", "-c", `setsid -f /usr/bin/python3 -c "$0" "$1" </dev/null >/dev/null 2>&1`, listener, sock); code != 0 {
		t.Fatalf("lane-1 listens in its research area: exit %d %s", code, stderr)
	}
	if !waitFor(10*time.Second, func() bool { st, err := os.Stat(sock); return err == nil && st.Mode()&os.ModeSocket != 0 }) {
		t.Fatal("lane-1's socket did not appear")
	}
	if got := pyAs(t, r, "lane-1", pyReach, sock); got["reach the socket"] != "ok" {
		t.Fatalf("lane-1 reaches its own listener: %s, want ok", got["reach the socket"])
	}
	judge := pyReach + `
try_("unix socket", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close())
try_("unix datagram socket", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).close())
def pair():
    a, b = socket.socketpair()
    a.sendall(b"x")
    if b.recv(1) != b"x":
        raise OSError(errno.EIO, "the pair lost its byte")
try_("socketpair", pair)
try_("FIFO in TMPDIR", lambda: os.mkfifo(os.environ["TMPDIR"] + "/pipe", 0o600))
try_("FIFO in HOME", lambda: os.mkfifo(os.environ["HOME"] + "/pipe", 0o600))
try_("file in TMPDIR", lambda: os.close(os.open(os.environ["TMPDIR"] + "/plain", os.O_CREAT | os.O_WRONLY, 0o600)))
import pwd, syslog
try_("getpwuid (nscd, then files)", lambda: pwd.getpwuid(os.getuid()))
try_("getaddrinfo localhost", lambda: socket.getaddrinfo("localhost", 80))
try_("syslog (/dev/log)", lambda: syslog.syslog("thermite channel test"))
`
	want := map[string]string{
		"reach the socket": "EPERM", "unix socket": "EPERM", "unix datagram socket": "EPERM",
		"socketpair": "ok", "FIFO in TMPDIR": "EACCES", "FIFO in HOME": "EACCES", "file in TMPDIR": "ok",
		"getpwuid (nscd, then files)": "ok", "getaddrinfo localhost": "ok", "syslog (/dev/log)": "ok",
	}
	for _, role := range []string{"run", "builder"} {
		got := pyAs(t, r, role, judge, sock)
		for what, w := range want {
			if got[what] != w {
				t.Errorf("%s: %s: %s, want %s", role, what, got[what], w)
			}
		}
	}
	// Nor does another lane: the area's top is the controller's, for
	// lane-1's group alone, which lane-1 cannot chmod open.
	if got := pyAs(t, r, "lane-2", pyReach, sock); got["reach the socket"] != "EACCES" {
		t.Errorf("lane-2 reaches lane-1's listener in its research area: %s, want EACCES", got["reach the socket"])
	}
}

// pyReach connects to the unix socket argv[1] and reads its greeting.
const pyReach = `
def reach():
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(sys.argv[1])
    if s.recv(5) != b"hello":
        raise OSError(errno.EIO, "no greeting")
try_("reach the socket", reach)
`

// Issue 27, a role's own HOME and TMPDIR: they are root's, for the role's
// group (0770), so a lane that tries to open them to every role is
// refused (EPERM), and a socket it listens on there, mode 0777, is out of
// another lane's reach (EACCES: it cannot pass the HOME). The lane still
// writes, lists and listens in them.
func TestLaneOpeningItsHomeToOtherRolesRefused(t *testing.T) {
	requirePython(t)
	r := newRig(t)
	sock := filepath.Join(r.Cfg.ScratchDir(), "home", "lane-1", "drop.sock")
	got := pyAs(t, r, "lane-1", `
try_("chmod HOME 0755", lambda: os.chmod(os.environ["HOME"], 0o755))
try_("chmod TMPDIR 0777", lambda: os.chmod(os.environ["TMPDIR"], 0o777))
try_("file in HOME", lambda: os.close(os.open(os.environ["HOME"] + "/plain", os.O_CREAT | os.O_WRONLY, 0o644)))
try_("list HOME", lambda: os.listdir(os.environ["HOME"]))
`)
	for what, want := range map[string]string{"chmod HOME 0755": "EPERM", "chmod TMPDIR 0777": "EPERM", "file in HOME": "ok", "list HOME": "ok"} {
		if got[what] != want {
			t.Errorf("lane-1: %s: %s, want %s", what, got[what], want)
		}
	}
	listener := `import socket, os, sys
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o777); s.listen(8)
s.settimeout(120)
while True:
    c, _ = s.accept(); c.sendall(b"hello"); c.close()`
	if _, stderr, code := r.RunAs("lane-1", nil, "sh", "-c", `setsid -f /usr/bin/python3 -c "$0" "$1" </dev/null >/dev/null 2>&1`, listener, sock); code != 0 {
		t.Fatalf("lane-1 listens in its HOME: exit %d %s", code, stderr)
	}
	if !waitFor(10*time.Second, func() bool { st, err := os.Stat(sock); return err == nil && st.Mode()&os.ModeSocket != 0 }) {
		t.Fatal("lane-1's socket did not appear")
	}
	if got := pyAs(t, r, "lane-1", pyReach, sock); got["reach the socket"] != "ok" {
		t.Fatalf("lane-1 reaches its own listener: %s, want ok", got["reach the socket"])
	}
	for _, role := range []string{"lane-2", "agent-2"} {
		if got := pyAs(t, r, role, pyReach, sock); got["reach the socket"] != "EACCES" {
			t.Errorf("%s reaches lane-1's listener in its HOME: %s, want EACCES", role, got["reach the socket"])
		}
	}
}

// Issue 27, watches: a lane watches folders every role reads (/usr/bin,
// /etc) to see another role open and read files there, the timing user's
// candidate among them. inotify, fanotify (FAN_REPORT_FID, open to an
// unprivileged user) and dnotify are refused with EPERM for a lane, an
// agent and the judge's users; the controller's user is not affected, and
// the lane still lists and reads the folder.
func TestLaneWatchingAnotherRolesOpensRefused(t *testing.T) {
	requirePython(t)
	r := newRig(t)
	watch := `
import ctypes, signal
libc = ctypes.CDLL(None, use_errno=True)
def call(f, *args):
    fd = f(*args)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "watch")
    os.close(fd)
def inotify():
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    if libc.inotify_add_watch(fd, b"/usr/bin", 0x20 | 0x1) < 0:  # IN_OPEN | IN_ACCESS
        raise OSError(ctypes.get_errno(), "inotify_add_watch")
    os.close(fd)
try_("inotify_init1", inotify)
try_("inotify_init", lambda: call(libc.inotify_init))
# FAN_CLASS_NOTIF | FAN_REPORT_FID | FAN_CLOEXEC
try_("fanotify_init", lambda: call(libc.fanotify_init, 0x200 | 0x1, os.O_RDONLY))
signal.signal(signal.SIGIO, signal.SIG_IGN)
def dnotify():
    fd = os.open("/etc", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.fcntl(fd, fcntl.F_NOTIFY, fcntl.DN_ACCESS)
    finally:
        os.close(fd)
try_("dnotify", dnotify)
try_("list /usr/bin", lambda: os.listdir("/usr/bin"))
try_("read /etc/passwd", lambda: open("/etc/passwd").read())
`
	for _, role := range []string{"lane-1", "agent-1", "run", "builder"} {
		got := pyAs(t, r, role, watch)
		for what, want := range map[string]string{
			"inotify_init1": "EPERM", "inotify_init": "EPERM", "fanotify_init": "EPERM", "dnotify": "EPERM",
			"list /usr/bin": "ok", "read /etc/passwd": "ok",
		} {
			if got[what] != want {
				t.Errorf("%s: %s: %s, want %s", role, what, got[what], want)
			}
		}
	}
	got := pyAs(t, r, "thermite", watch)
	for _, what := range []string{"inotify_init1", "inotify_init", "dnotify", "list /usr/bin"} {
		if got[what] != "ok" {
			t.Errorf("the controller's user: %s: %s, want ok", what, got[what])
		}
	}
}
