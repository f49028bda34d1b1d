package rig

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"thermite/internal/sysvipc"
	"thermite/internal/testrig"
)

// Issue 12, points 3 and 6: SysV IPC as a channel between roles and across
// stops, and set-id bits that survive through openat2 or a hard link. Each
// attack runs as the role, through `thermite run-as` and the probe.

// ipcKey is a random key for one test's objects.
func ipcKey() string { return strconv.Itoa(1 + rand.IntN(1<<30)) }

// ipcOf lists the objects whose owner or creator is the role's user.
func ipcOf(t *testing.T, r *testrig.Rig, role string) []sysvipc.Object {
	t.Helper()
	uid := r.Role(role).UID
	objs, err := sysvipc.List("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []sysvipc.Object
	for _, o := range objs {
		if o.UID == uid || o.CUID == uid {
			out = append(out, o)
		}
	}
	return out
}

func TestSysVShmBetweenLanesRefused(t *testing.T) {
	r := newRig(t)
	for _, kind := range sysvipc.Kinds {
		// The attack: an object of mode 0666 that every role could open.
		for _, role := range []string{"lane-1", "builder", "run"} {
			if got := r.Probe(role, "sysv-shared", "-", kind); got != "EPERM" {
				t.Errorf("%s makes a 0666 %s object: %s, want EPERM", role, kind, got)
			}
			// A 0600 object works; opening it up afterwards does not.
			if got := r.Probe(role, "sysv-open-up", "-", kind); got != "EPERM" {
				t.Errorf("%s makes a 0600 %s object and IPC_SETs it 0666: %s, want EPERM", role, kind, got)
			}
		}
		// Lane 1's own object lives on with its other leftovers until its
		// trial ends, and no other role reaches it.
		key := ipcKey()
		if got := r.Probe("lane-1", "sysv-make", "-", kind+":"+key); got != "ok" {
			t.Fatalf("lane-1 makes a 0600 %s object: %s", kind, got)
		}
		if got := r.Probe("lane-1", "sysv-find", "-", kind+":"+key); got != "ok" {
			t.Errorf("lane-1 finds its own %s object in its next command: %s, want ok", kind, got)
		}
		for _, role := range []string{"lane-2", "builder", "run"} {
			if got := r.Probe(role, "sysv-find", "-", kind+":"+key); got != "EACCES" {
				t.Errorf("%s opens lane-1's %s object: %s, want EACCES", role, kind, got)
			}
		}
	}
	r.Thermite("stop", "lane-1")
	// POSIX message queues are refused by the filter (issue 27).
	if got := r.Probe("lane-1", "mq-open", "-", "/thermite-test-"+ipcKey()); got != "EPERM" {
		t.Errorf("lane-1 makes a POSIX message queue: %s, want EPERM", got)
	}
}

func TestSysVIPCRemovedWhenUserStopped(t *testing.T) {
	r := newRig(t)
	for _, kind := range sysvipc.Kinds {
		t.Run(kind, func(t *testing.T) {
			// A lane: its object outlives its commands, not `thermite stop`
			// (nor its trial's end, which stops it the same way).
			key := ipcKey()
			if got := r.Probe("lane-1", "sysv-make", "-", kind+":"+key); got != "ok" {
				t.Fatalf("lane-1 makes a %s object: %s", kind, got)
			}
			if n := len(ipcOf(t, r, "lane-1")); n != 1 {
				t.Fatalf("lane-1 owns %d objects, want its one", n)
			}
			if _, stderr, code := r.Thermite("stop", "lane-1"); code != 0 {
				t.Fatalf("stop lane-1: %s", stderr)
			}
			if left := ipcOf(t, r, "lane-1"); len(left) != 0 {
				t.Errorf("after thermite stop lane-1: %v", left)
			}
			if got := r.Probe("lane-1", "sysv-find", "-", kind+":"+key); got != "ENOENT" {
				t.Errorf("lane-1 finds its %s object after the stop: %s, want ENOENT", kind, got)
			}
			// The builder and the timing user are stopped after each
			// command, between repeats: the next command finds nothing.
			for _, role := range []string{"builder", "run"} {
				key := ipcKey()
				if got := r.Probe(role, "sysv-make", "-", kind+":"+key); got != "ok" {
					t.Fatalf("%s makes a %s object: %s", role, kind, got)
				}
				if got := r.Probe(role, "sysv-find", "-", kind+":"+key); got != "ENOENT" {
					t.Errorf("%s finds the %s object of its previous command: %s, want ENOENT", role, kind, got)
				}
				if left := ipcOf(t, r, role); len(left) != 0 {
					t.Errorf("%s still owns %v", role, left)
				}
			}
		})
	}
}

func TestSetIDThroughOpenat2Refused(t *testing.T) {
	r := newRig(t)
	tmp := filepath.Join(r.Cfg.ScratchDir(), "tmp", "lane-1")
	for _, role := range []string{"lane-1", "builder", "agent-1"} {
		p := filepath.Join(r.Cfg.ScratchDir(), "tmp", role, "made-by-openat2")
		if got := r.Probe(role, "openat2-setid", p); got != "ENOSYS" {
			t.Errorf("%s creates a 06755 file through openat2: %s, want ENOSYS", role, got)
		}
	}
	// What callers do on ENOSYS: openat, where a plain mode works and a
	// set-id one is refused.
	argv := []string{r.Bin, "__probe", "try", "openat2-fallback", filepath.Join(tmp, "f"), "0755"}
	out, stderr, _ := r.RunAs("lane-1", nil, argv...)
	if strings.TrimSpace(out) != "ok" || !strings.Contains(stderr, "via openat mode 0755") {
		t.Errorf("a 0755 file through openat2 with the fallback: %q %q", out, stderr)
	}
	argv[len(argv)-1] = "6755"
	out, stderr, _ = r.RunAs("lane-1", nil, argv...)
	if strings.TrimSpace(out) != "EPERM" || !strings.Contains(stderr, "via openat") {
		t.Errorf("a 06755 file through openat2 with the fallback: %q %q, want EPERM via openat", out, stderr)
	}
	// The lane's file helper keeps openat2: the file tools still work.
	p := makeProject(t, r)
	_, a := startTrial(t, r, 1, p)
	if code, _, raw := a.do("POST", "/v1/fs/write", map[string]any{"path": "notes/x.txt", "data": []byte("hello\n"), "create_parents": true}); code != 200 {
		t.Fatalf("the file helper's write: %d %s", code, raw)
	}
	if code, m, raw := a.do("POST", "/v1/fs/read", map[string]any{"path": "notes/x.txt"}); code != 200 || !strings.Contains(raw, "aGVsbG8K") && fmt.Sprint(m["data"]) != "hello\n" {
		t.Fatalf("the file helper's read: %d %s", code, raw)
	}
}

func TestSetIDHardLinkSwept(t *testing.T) {
	r := newRig(t)
	lane := r.Role("lane-1")
	tmp := filepath.Join(r.Cfg.ScratchDir(), "tmp", "lane-1")
	// A set-id file of the lane's own, however it came to be (openat2
	// before this fix), and another owner's set-id file linked in.
	prog := filepath.Join(tmp, "prog")
	if err := os.WriteFile(prog, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chown(prog, lane.UID, lane.GID)
	if err := unix.Chmod(prog, 0o6755); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(r.Dir, "foreign")
	os.WriteFile(foreign, []byte("#!/bin/sh\n"), 0o755)
	unix.Chmod(foreign, 0o4755)
	if err := os.Link(foreign, filepath.Join(tmp, "foreign")); err != nil {
		t.Fatal(err)
	}
	// The attack: link it twice, so that the sweep after the command
	// passes it over.
	if _, stderr, code := r.RunAs("lane-1", nil, "sh", "-c", "ln $TMPDIR/prog $TMPDIR/prog2 && ln $TMPDIR/prog $TMPDIR/prog3"); code != 0 {
		t.Fatalf("lane-1 links its file: %s", stderr)
	}
	var st unix.Stat_t
	if err := unix.Lstat(prog, &st); err != nil {
		t.Fatal(err)
	}
	if st.Nlink != 3 || st.Mode&0o7777 != 0o755 {
		t.Errorf("the lane's set-id file with %d links: mode %04o, want 0755", st.Nlink, st.Mode&0o7777)
	}
	if err := unix.Lstat(foreign, &st); err != nil || st.Mode&0o7777 != 0o4755 {
		t.Errorf("another owner's linked file: mode %04o (%v), want it untouched (04755)", st.Mode&0o7777, err)
	}
}
