package rig

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"thermite/internal/testrig"
)

// Issue 27, keyrings: the kernel's keyrings are not namespaced. A key in
// a lane's session or user keyring would outlive the command for the
// lane's later ones; its user's persistent keyring outlives every
// process; KEYCTL_JOIN_SESSION_KEYRING joins any keyring of that name
// whose permissions let the caller search it, another role's included;
// request_key asks the kernel's helper. The filter refuses each (EPERM),
// in a trial's real command; the lane's other work goes on.
func TestLaneKeyringsRefused(t *testing.T) {
	requirePython(t)
	r := newRig(t)
	t1, _ := startTrial(t, r, 1, makeProject(t, r))
	script := pyPrelude + `
import ctypes, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
nr = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}[platform.machine()]
ADD_KEY, REQUEST_KEY, KEYCTL = nr
def call(*args):
    def f():
        if libc.syscall(*args) < 0:
            raise OSError(ctypes.get_errno(), "keyring")
    return f
for ring, spec in (("session", -3), ("user", -4), ("process", -2)):
    try_("add_key to its " + ring + " keyring", call(ADD_KEY, b"user", b"thermite-channel", b"bits", 4, spec))
try_("keyctl get_persistent", call(KEYCTL, 22, -1, -2))
try_("keyctl join_session_keyring by name", call(KEYCTL, 1, b"thermite-channel"))
try_("request_key", call(REQUEST_KEY, b"user", b"thermite-channel", None, -2))
try_("write its workspace", lambda: open("note", "w").write("still works\n"))
`
	out, stderr, code := r.Thermite("trial", "exec", t1.ID, "--", "/usr/bin/python3", "-c", script)
	if code != 0 {
		t.Fatalf("lane-1's keyring attempts: exit %d %s %s", code, out, stderr)
	}
	got := pyOutcomes(out)
	for what, want := range map[string]string{
		"add_key to its session keyring": "EPERM", "add_key to its user keyring": "EPERM", "add_key to its process keyring": "EPERM",
		"keyctl get_persistent": "EPERM", "keyctl join_session_keyring by name": "EPERM", "request_key": "EPERM",
		"write its workspace": "ok",
	} {
		if got[what] != want {
			t.Errorf("lane-1: %s: %s, want %s", what, got[what], want)
		}
	}
}

// pyFutex is a futex waiter and waker over the first page of a file.
// "wait MODE PATH" maps the page as MODE says (ro: shared, read-only,
// never written; cow: private, written once, as a program stores a lock
// word in a file's mapping; own: shared and written, a file of the
// role's own), writes $HOME/waiting-MODE, and waits on its first word in
// 0.2 s turns until $HOME/stop-MODE appears, printing how often a wake
// reached it. "wake PATH" maps the page read-only and shared, and 30
// times wakes every shared waiter on the word and requeues them to a word
// nobody wakes, printing how many it reached.
const pyFutex = `
import ctypes, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.syscall.restype = ctypes.c_long
FUTEX = {"x86_64": 202, "aarch64": 98}[platform.machine()]
PROT_READ, PROT_WRITE, MAP_SHARED, MAP_PRIVATE = 1, 2, 1, 2
def page(path, prot, flags, write):
    fd = os.open(path, os.O_RDWR if write and flags == MAP_SHARED else os.O_RDONLY)
    a = libc.mmap(None, 4096, prot, flags, fd, 0)
    if write:
        w = ctypes.c_int.from_address(a)
        w.value = w.value
    return a
if sys.argv[1] == "wait":
    mode, path = sys.argv[2], sys.argv[3]
    a = {"ro": lambda: page(path, PROT_READ, MAP_SHARED, False),
         "cow": lambda: page(path, PROT_READ | PROT_WRITE, MAP_PRIVATE, True),
         "own": lambda: page(path, PROT_READ | PROT_WRITE, MAP_SHARED, True)}[mode]()
    home = os.environ["HOME"]
    open(home + "/waiting-" + mode, "w").close()
    woken = 0
    while not os.path.exists(home + "/stop-" + mode):
        ts = (ctypes.c_long * 2)(0, 200000000)
        if libc.syscall(FUTEX, ctypes.c_void_p(a), 0, ctypes.c_int.from_address(a).value, ts, None, 0) == 0:
            woken += 1
    print("woken", woken, flush=True)
else:
    try:
        a = page(sys.argv[2], PROT_READ, MAP_SHARED, False)
    except OSError as e:
        print("map", errno.errorcode.get(e.errno, str(e.errno)), flush=True)
        sys.exit(0)
    other = ctypes.c_int(0)
    reached = 0
    for i in range(30):
        reached += libc.syscall(FUTEX, ctypes.c_void_p(a), 1, 0x7fffffff, None, None, 0)
        n = libc.syscall(FUTEX, ctypes.c_void_p(a), 4, 0, ctypes.c_void_p(0x7fffffff), ctypes.byref(other), ctypes.c_int.from_address(a).value)
        reached += max(n, 0)
        time.sleep(0.05)
    print("map ok", flush=True)
    print("reached", reached, flush=True)
`

// futexRound runs one waiter of role (mode, path), then lane-1's waker on
// wakePath once the waiter waits, then stops the waiter: it returns what
// each printed. Every wait is bounded; nothing is timed.
func futexRound(t *testing.T, r *testrig.Rig, role, mode, path, wakePath string) (waiter, waker map[string]string) {
	t.Helper()
	home := filepath.Join(r.Cfg.ScratchDir(), "home", role)
	done := make(chan map[string]string, 1)
	go func() {
		got, err := pyRun(r, role, pyFutex, "wait", mode, path)
		if err != "" {
			got = map[string]string{"error": err}
		}
		done <- got
	}()
	if !waitFor(60*time.Second, func() bool { _, err := os.Stat(filepath.Join(home, "waiting-"+mode)); return err == nil }) {
		t.Fatalf("%s's futex waiter (%s) did not start", role, mode)
	}
	waker = pyAs(t, r, "lane-1", pyFutex, "wake", wakePath)
	if err := os.WriteFile(filepath.Join(home, "stop-"+mode), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case waiter = <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s's futex waiter (%s) did not end after its stop file", role, mode)
	}
	if waiter["error"] != "" {
		t.Fatal(waiter["error"])
	}
	return waiter, waker
}

// Issue 27, futexes: a shared futex's key is the page it lies on. For a
// page of a file (not copied on write), the key is the file's inode and
// the page's offset, so every process that maps that page keys the same
// futex, whatever its user; the filter cannot tell (it sees an address,
// not what is mapped there). What keeps another role's locks out of a
// lane's reach is where a lock word lives: a program writes it, and a
// written private page is anonymous (keyed by the process's own memory),
// while a shared written page is a file the program may write, its own
// (Landlock and the modes keep every role's writes in its own places).
// So lane-1, mapping a file every role reads (/etc/passwd) and waking and
// requeueing every waiter on its first word, reaches neither lane-2's nor
// the timing user's lock word in a private mapping of that file, and
// cannot open their own files to map them at all (EACCES); their waits
// run their course. What remains is named: two roles that both wait and
// wake on a page neither wrote do reach each other, a signal they must
// both want (docs/agents.md and the README say so); lane-1 reaches lane-2
// waiting that way.
func TestLaneFutexOnSharedFilePagesReachesNoOtherRolesLock(t *testing.T) {
	requirePython(t)
	r := newRig(t)
	shared := "/etc/passwd"
	for _, role := range []string{"lane-2", "run"} {
		waiter, waker := futexRound(t, r, role, "cow", shared, shared)
		if waker["map"] != "ok" || waker["reached"] != "0" {
			t.Errorf("lane-1 waking %s's word in a private, written mapping of %s: %v, want mapped and 0 reached", role, shared, waker)
		}
		if waiter["woken"] != "0" {
			t.Errorf("%s's lock word in a private, written mapping of %s was woken %s times by lane-1", role, shared, waiter["woken"])
		}
		own := filepath.Join(r.Cfg.ScratchDir(), "tmp", role, "lock")
		if err := os.WriteFile(own, make([]byte, 4096), 0o644); err != nil {
			t.Fatal(err)
		}
		owner := r.Role(role)
		os.Chown(own, owner.UID, owner.GID)
		waiter, waker = futexRound(t, r, role, "own", own, own)
		if waker["map"] != "EACCES" {
			t.Errorf("lane-1 maps %s's own lock file %s: %v, want EACCES", role, own, waker)
		}
		if waiter["woken"] != "0" {
			t.Errorf("%s's lock word in its own shared file was woken %s times", role, waiter["woken"])
		}
	}
	// The named remainder: a waiter on a page it never wrote.
	waiter, waker := futexRound(t, r, "lane-2", "ro", shared, shared)
	if n, _ := strconv.Atoi(waker["reached"]); n == 0 || waiter["woken"] == "0" {
		t.Errorf("two lanes waiting and waking on a page of %s neither wrote: waker %v, waiter %v; the docs name this as the one futex signal left (both must want it), so it should reach", shared, waker, waiter)
	}
	if !strings.HasPrefix(waker["map"], "ok") {
		t.Errorf("lane-1 maps %s: %v", shared, waker)
	}
}
