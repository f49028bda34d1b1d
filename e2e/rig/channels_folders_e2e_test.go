package rig

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pyProbeFolder tries, for each folder argv[i], every way another role
// could use what a lane left there: list it, read its file "secret", open
// its FIFO "pipe" to read and to write (neither blocks: O_NONBLOCK), and
// connect to its socket "sock".
const pyProbeFolder = `
for d in sys.argv[1:]:
    n = os.path.basename(d.rstrip("/"))
    try_("list " + n, lambda: os.listdir(d))
    try_("read " + n + "/secret", lambda: open(d + "/secret", "rb").read())
    try_("read-open " + n + "/pipe", lambda: os.close(os.open(d + "/pipe", os.O_RDONLY | os.O_NONBLOCK)))
    try_("write-open " + n + "/pipe", lambda: os.close(os.open(d + "/pipe", os.O_WRONLY | os.O_NONBLOCK)))
    def reach():
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        s.connect(d + "/sock")
        if s.recv(5) != b"hello":
            raise OSError(errno.EIO, "no greeting")
    try_("connect " + n + "/sock", reach)
`

// Issue 27: a lane tries to open every folder of its own to the other
// roles: it chmods its workspace and its research area 0777 and leaves in
// each a file anyone may read, a FIFO anyone may open and a socket anyone
// may connect to, listening; its agent opens its agent folder and token
// the same way. The research area's top is the controller's, for the
// lane's group, so its chmod is refused (EPERM); the workspace's top is
// the lane's (git wants it so) and its chmod works, but the trial's folder
// lets only the lane and its agent pass (an ACL), so lane-2, agent-2, the
// timing user and the builder reach nothing in either place (EACCES; the
// judge's users make no unix socket at all, EPERM). The lane itself still
// uses all of it, and git works in its workspace.
func TestLaneOpeningItsFoldersToOtherRolesRefused(t *testing.T) {
	requirePython(t)
	r := newRig(t)
	t1, _ := startTrial(t, r, 1, makeProject(t, r))
	startTrial(t, r, 2, makeProject(t, r))
	setup := `
import os, sys, socket
for d in sys.argv[1:]:
    n = os.path.basename(d.rstrip("/"))
    try_("chmod " + n + " 0777", lambda: os.chmod(d, 0o777))
    with open(d + "/secret", "w") as f:
        f.write("lane-1's own\n")
    os.chmod(d + "/secret", 0o666)
    os.mkfifo(d + "/pipe", 0o666)
    os.chmod(d + "/pipe", 0o666)
`
	areaName := filepath.Base(t1.LaneArea)
	out, stderr, code := r.Thermite("trial", "exec", t1.ID, "--", "/usr/bin/python3", "-c", pyPrelude+setup, t1.Workspace, t1.LaneArea)
	if code != 0 {
		t.Fatalf("lane-1 opens its folders: exit %d %s %s", code, out, stderr)
	}
	got := pyOutcomes(out)
	for what, want := range map[string]string{"chmod workspace 0777": "ok", "chmod " + areaName + " 0777": "EPERM"} {
		if got[what] != want {
			t.Errorf("lane-1: %s: %s, want %s", what, got[what], want)
		}
	}
	listener := `import socket, os, sys
ls = []
for d in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX); s.bind(d + "/sock"); os.chmod(d + "/sock", 0o777); s.listen(64); s.setblocking(False); ls.append(s)
import select
while True:
    for s in select.select(ls, [], [], 120)[0]:
        c, _ = s.accept(); c.setblocking(True); c.sendall(b"hello"); c.close()`
	if _, stderr, code := r.Thermite("trial", "exec", t1.ID, "--", "sh", "-c", `setsid -f /usr/bin/python3 -c "$0" "$@" </dev/null >/dev/null 2>&1`, listener, t1.Workspace, t1.LaneArea); code != 0 {
		t.Fatalf("lane-1 listens in its folders: exit %d %s", code, stderr)
	}
	for _, d := range []string{t1.Workspace, t1.LaneArea} {
		sock := filepath.Join(d, "sock")
		if !waitFor(10*time.Second, func() bool { st, err := os.Stat(sock); return err == nil && st.Mode()&os.ModeSocket != 0 }) {
			t.Fatalf("lane-1's socket %s did not appear", sock)
		}
	}
	// Its agent opens the agent folder and its token.
	agentOut, stderr, code := r.RunAs("agent-1", nil, "/usr/bin/python3", "-c", pyPrelude+`
try_("chmod agent 0777", lambda: os.chmod(sys.argv[1], 0o777))
try_("chmod token 0644", lambda: os.chmod(sys.argv[1] + "/token", 0o644))
`, t1.AgentDir)
	if code != 0 {
		t.Fatalf("agent-1 opens its folder: exit %d %s", code, stderr)
	}
	if got := pyOutcomes(agentOut); got["chmod agent 0777"] != "ok" || got["chmod token 0644"] != "ok" {
		t.Fatalf("agent-1 opens its folder: %v, want both ok (the folder is its own)", got)
	}

	// The lane still has all of it, and git accepts its workspace.
	own := pyAs(t, r, "lane-1", pyProbeFolder, t1.Workspace, t1.LaneArea)
	for _, n := range []string{"workspace", areaName} {
		for _, what := range []string{"list ", "read ", "read-open ", "connect "} {
			key := what + n
			switch what {
			case "read ":
				key += "/secret"
			case "read-open ":
				key += "/pipe"
			case "connect ":
				key += "/sock"
			}
			if own[key] != "ok" {
				t.Errorf("lane-1: %s: %s, want ok", key, own[key])
			}
		}
	}
	if out, stderr, code := r.Thermite("trial", "exec", t1.ID, "--", "sh", "-c", "git init -q && git status --short"); code != 0 || strings.Contains(out+stderr, "dubious") {
		t.Errorf("git in lane-1's workspace: exit %d %s %s", code, out, stderr)
	}

	targets := []string{t1.Workspace, t1.LaneArea}
	for _, role := range []string{"lane-2", "agent-2", "run", "builder"} {
		got := pyAs(t, r, role, pyProbeFolder+fmt.Sprintf(`
try_("read agent/token", lambda: open(%q, "rb").read())
try_("list agent", lambda: os.listdir(%q))
`, filepath.Join(t1.AgentDir, "token"), t1.AgentDir), targets...)
		connect := "EACCES"
		if role == "run" || role == "builder" {
			connect = "EPERM" // no unix socket at all
		}
		for _, n := range []string{"workspace", areaName} {
			for what, want := range map[string]string{
				"list " + n: "EACCES", "read " + n + "/secret": "EACCES",
				"read-open " + n + "/pipe": "EACCES", "write-open " + n + "/pipe": "EACCES",
				"connect " + n + "/sock": connect,
			} {
				if got[what] != want {
					t.Errorf("%s: %s lane-1 opened: %s, want %s", role, what, got[what], want)
				}
			}
		}
		for _, what := range []string{"read agent/token", "list agent"} {
			if got[what] != "EACCES" {
				t.Errorf("%s: %s agent-1 opened: %s, want EACCES", role, what, got[what])
			}
		}
	}
	if got := pyAs(t, r, "agent-1", `try_("read token", lambda: open(sys.argv[1] + "/token", "rb").read())`, t1.AgentDir); got["read token"] != "ok" {
		t.Errorf("agent-1 reads its own token: %s, want ok", got["read token"])
	}
}
