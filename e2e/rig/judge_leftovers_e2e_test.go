package rig

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"thermite/controller/ledger"
	"thermite/internal/testrig"
)

// Issue 27, the judge's side: a build or a candidate must leave nothing
// for what runs after it.

// TestBuildRenamesRacingTheHashStopped: a build leaves a process that
// swaps its output, by rename, as fast as it can, between a plain file and
// a symlink to the kit's hidden answer (which the controller reads and the
// builder does not). Were it alive when the controller checks the outputs
// and copies them, the check could see the plain file and the copy follow
// the symlink: the hidden answer stored as the build, for the candidate to
// read. The builder's processes are stopped when its command ends, before
// the outputs come back to the controller: none is left after any of five
// builds, each build is either stored as the plain file, every stored file
// the one its hash names, or refused naming the symlink, and never holds
// the answer; a stored one's timed run (which checks every hash first)
// sees the same file.
func TestBuildRenamesRacingTheHashStopped(t *testing.T) {
	r := newRig(t)
	const answer = "the hidden answer"
	secret := filepath.Join(r.Cfg.ControllerDir(), "kits", "swap", "answer.txt")
	importKit(t, r, "swap", `name = "swap"
[build]
command = ["sh", "-c", "printf A > prog && setsid -f sh -c 'while :; do ln -sfn `+secret+` t && mv -T t prog; printf A > u && mv -T u prog; done' </dev/null >/dev/null 2>&1 && sleep 0.3"]
outputs = ["prog"]
[run]
command = ["sh", "-c", "cat {build}/prog > out/got"]
repeats = 1
[check]
command = ["sh", "-c", "printf '{\"score\": 1, \"cases\": {\"got\": \"%s\"}}' \"$(cat \"$THERMITE_OUT/got\")\""]
`, map[string]string{"answer.txt": answer})
	proj := filepath.Join(r.Dir, "p-swap")
	os.MkdirAll(proj, 0o755)
	stored := 0
	for i := 0; i < 5; i++ {
		out, stderr, code := r.Thermite("judge", "build", "--kit", "swap", "--project", proj, "--json")
		if left := r.Procs("builder"); len(left) != 0 {
			t.Fatalf("build %d: the rename loop outlived it: builder runs %v", i, left)
		}
		if code != 0 {
			if !strings.Contains(stderr, "prog is a symlink") {
				t.Fatalf("build %d refused for another reason than the symlink it left: %s", i, stderr)
			}
			continue
		}
		stored++
		var b ledger.Build
		testrig.JSON(t, out, &b)
		data, err := os.ReadFile(filepath.Join(b.StorePath, "prog"))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		if string(data) != "A" || !strings.Contains(manifestOf(t, b), hex.EncodeToString(sum[:])) {
			t.Fatalf("build %d stored %q (hash named: %v), want the plain file A as its hash names it", i, data, b.Manifest)
		}
		tr := <-startTime(t, r, b.ID, "swap")
		if tr.Status != "scored" || !strings.Contains(tr.CheckOutput, `"got":"A"`) {
			t.Fatalf("build %d's timed run saw other than the stored file: %+v", i, tr)
		}
	}
	t.Logf("%d of 5 builds stored (the rest left the symlink and were refused)", stored)
}

// manifestOf is a build's manifest as text, to find a hash in.
func manifestOf(t *testing.T, b ledger.Build) string {
	t.Helper()
	raw, err := json.Marshal(b.Manifest)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// leftoverCandidate is a candidate that first writes what it finds of
// the runs before it into out/found.json (its own user's processes, its
// TMPDIR, its HOME, out/, its SysV IPC objects, /dev/shm), then leaves all
// it can for the next: a file in each of its places, a SysV object of
// each kind, a detached `setsid` process, a double-forked one and a child
// that ignores SIGTERM, and exits at once. It counts what it left running
// (spawned), so a finding of nothing proves something.
const leftoverCandidate = `#!/usr/bin/python3
import ctypes, json, os, signal, time
uid, me = os.getuid(), os.getpid()
def procs():
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) != me:
            try:
                if os.stat("/proc/" + p).st_uid == uid:
                    out.append(p)
            except OSError:
                pass
    return out
def ipc():
    n = 0
    for kind in ("shm", "msg", "sem"):
        lines = open("/proc/sysvipc/" + kind).read().splitlines()
        col = lines[0].split().index("uid")
        n += sum(1 for l in lines[1:] if int(l.split()[col]) == uid)
    return n
def ls(d):
    try:
        return sorted(os.listdir(d))
    except OSError as e:
        return "error " + str(e.errno)
def shm():
    try:
        os.close(os.open("/dev/shm/thermite-left", os.O_CREAT | os.O_RDWR, 0o600))
        return "made"
    except OSError as e:
        return "error " + str(e.errno)
found = {"procs": procs(), "tmp": ls(os.environ["TMPDIR"]), "home": ls(os.environ["HOME"]),
         "out": ls("out"), "ipc": ipc(), "devshm": ls("/dev/shm"), "devshm_make": shm()}
for d in (os.environ["TMPDIR"], os.environ["HOME"], "out"):
    open(os.path.join(d, "left-%d" % me), "w").write("for the next candidate\n")
libc = ctypes.CDLL(None, use_errno=True)
key = me
libc.shmget(key, 4096, 0o1600)
libc.msgget(key, 0o1600)
libc.semget(key, 1, 0o1600)
if os.fork() == 0:
    os.setsid()
    os.execvp("sleep", ["sleep", "600"])
if os.fork() == 0:
    if os.fork() == 0:
        time.sleep(600)
    os._exit(0)
if os.fork() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(600)
time.sleep(0.3)
found["spawned"] = len(procs())
found["ipc_made"] = ipc()
open("out/found.json", "w").write(json.dumps(found, sort_keys=True))
`

// TestCandidateLeavesNothingForTheNext: a candidate leaves processes
// (setsid, double fork, one that ignores SIGTERM), files in its TMPDIR,
// HOME and out/, and SysV objects, and /dev/shm is closed to it; the next
// repeat of the same build, and the repeats of another build timed after
// it, find none of them: no process of the timing user but their own, an
// empty TMPDIR, HOME and out/, no SysV object. After each timed run the
// timing user runs nothing and owns no SysV object.
func TestCandidateLeavesNothingForTheNext(t *testing.T) {
	r := newRig(t)
	importKit(t, r, "leftovers", `name = "leftovers"
[build]
command = ["sh", "-c", "cp prog.py prog && chmod 755 prog"]
outputs = ["prog"]
[run]
command = ["{build}/prog"]
repeats = 3
[check]
command = ["sh", "-c", "printf '{\"score\": 1, \"cases\": {\"found\": %s}}' \"$(cat \"$THERMITE_OUT/found.json\")\""]
`, nil)
	var builds []ledger.Build
	for _, name := range []string{"one", "two"} {
		proj := filepath.Join(r.Dir, "p-"+name)
		os.MkdirAll(proj, 0o755)
		// Two builds of their own: the second differs by a comment.
		os.WriteFile(filepath.Join(proj, "prog.py"), []byte(leftoverCandidate+"# "+name+"\n"), 0o755)
		builds = append(builds, judgeBuild(t, r, "leftovers", proj))
	}
	for _, b := range builds {
		tr := <-startTime(t, r, b.ID, "leftovers")
		if tr.Status != "scored" || len(tr.Repeats) != 3 {
			t.Fatalf("build %s: %+v", b.ID, tr)
		}
		var out struct {
			Cases struct {
				Found struct {
					Procs    []string `json:"procs"`
					Tmp      any      `json:"tmp"`
					Home     any      `json:"home"`
					Out      any      `json:"out"`
					IPC      int      `json:"ipc"`
					DevShm   any      `json:"devshm"`
					DevShmMk string   `json:"devshm_make"`
					Spawned  int      `json:"spawned"`
					IPCMade  int      `json:"ipc_made"`
				} `json:"found"`
			} `json:"cases"`
		}
		if err := json.Unmarshal([]byte(tr.CheckOutput), &out); err != nil {
			t.Fatalf("check output %q: %v", tr.CheckOutput, err)
		}
		f := out.Cases.Found
		// What the last repeat found of the two before it (and, for the
		// second build, of the first build's three).
		if len(f.Procs) != 0 || f.IPC != 0 || !empty(f.Tmp) || !empty(f.Home) || !empty(f.Out) {
			t.Errorf("build %s's last repeat found what an earlier candidate left: %s", b.ID, tr.CheckOutput)
		}
		// /dev/shm is closed on a rig (closed_tmp: root's 0700); a test
		// rig closes stand-ins, so here the rule set alone keeps the
		// candidate from making anything in it.
		if f.DevShmMk != "error 13" || strings.Contains(tr.CheckOutput, "thermite-left") {
			t.Errorf("build %s: /dev/shm to a candidate: make %q, listing %v; want EACCES (13) and nothing of an earlier one", b.ID, f.DevShmMk, f.DevShm)
		}
		if f.Spawned < 3 || f.IPCMade != 3 {
			t.Errorf("build %s: the candidate left %d processes and %d SysV objects running; want 3 and 3, or finding none proves nothing: %s", b.ID, f.Spawned, f.IPCMade, tr.CheckOutput)
		}
		if left := r.Procs("run"); len(left) != 0 {
			t.Errorf("after build %s's timed run the timing user runs %v", b.ID, left)
		}
		if objs := ipcOf(t, r, "run"); len(objs) != 0 {
			t.Errorf("after build %s's timed run the timing user owns SysV objects %v", b.ID, objs)
		}
	}
}

// empty says whether a listing the candidate made is an empty list.
func empty(v any) bool {
	l, ok := v.([]any)
	return ok && len(l) == 0
}
