package rig

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/testrig"
)

// Issue 27: nothing shared on the way to the controller. Each lane and
// each agent reaches the harness API on a socket of its own
// (state_dir/api/<role>/api.sock), so one lane's flood of connections
// fills only its own listener's backlog.

// TestLaneFloodingItsAPISocketLeavesOtherLanesServed: lane-1 connects and
// closes in a loop on 8 goroutines (main saw 1.2 million such connections
// make 3 of lane 2's 28 calls fail at connect with EAGAIN, both lanes
// queued on one listener's backlog). Meanwhile lane 2's lane user and its
// agent each make 30 ordinary calls, each on a fresh connection as a
// per-call trial-client does: every one is answered 200.
func TestLaneFloodingItsAPISocketLeavesOtherLanesServed(t *testing.T) {
	r := testrig.New(t, testrig.Options{Alone: true}) // a connection flood loads the machine
	p := makeProject(t, r)
	startTrial(t, r, 1, p)
	t2, _ := startTrial(t, r, 2, p)

	flood := startAs(t, r, "lane-1", "connect-close", "ATTACK_SOCKET="+r.Cfg.RoleAPISocket("lane-1"), "ATTACK_N=8", "ATTACK_MS=9000")
	flood.expect("flooding", 20*time.Second)
	// Let the flood fill lane-1's backlog before lane 2 calls.
	time.Sleep(500 * time.Millisecond)
	// Lane 2's socket serves a lane harness run's token alone.
	lane2 := startAs(t, r, "lane-2", "calls", "ATTACK_SOCKET="+r.Cfg.RoleAPISocket("lane-2"), "ATTACK_TOKEN="+startLaneRun(t, r, t2.ID).token, "ATTACK_N=30", "ATTACK_FRESH=1")
	agent2 := startAs(t, r, "agent-2", "calls", "ATTACK_SOCKET="+t2.APISocket, "ATTACK_TOKEN="+tokenOf(t, t2), "ATTACK_N=30", "ATTACK_FRESH=1")
	for who, p := range map[string]*roleProc{"lane-2": lane2, "agent-2": agent2} {
		line := p.expect("calls ", 30*time.Second)
		t.Logf("%s under lane-1's flood: %s", who, line)
		if ok := field(t, line, "ok"); ok != 30 {
			t.Errorf("%s's calls under lane-1's flood of its own socket: %s, want all 30 answered 200", who, line)
		}
	}
	flood.stdin.Close()
	line := flood.expect("connect-close ", 20*time.Second)
	t.Logf("lane-1: %s", line)
	if strings.Contains(line, "stopped-by limit") {
		t.Errorf("lane-1's flood ended by its time limit before lane 2's calls were done: they were not all made under it: %s", line)
	}
	// Past api.accept_rate most of its connects fail with EAGAIN, its
	// own backlog full: each was tried all the same.
	if n := field(t, line, "ok") + eagains(t, line); n < 1000 {
		t.Errorf("lane-1's flood tried only %d connections: too few to prove anything", n)
	}
	if n, list := openTrials(t, r); n != 2 {
		t.Fatalf("a trial ended under lane-1's flood:\n%s", list)
	}
}

// TestLaneConnectingToAnotherLanesAPISocketRefused: a lane or an agent
// that connects to another lane's API socket, to its own lane's other
// role's, or to the operator's, is refused by the kernel with EACCES (the
// socket's folder is 0710 with the owner's role's group; the operator's
// socket is 0600). On its own socket, another lane's token gets the same
// 401 as a wrong one, and a peer that is not the socket's role, root
// included, is closed before a byte is read. What is allowed works.
func TestLaneConnectingToAnotherLanesAPISocketRefused(t *testing.T) {
	r := testrig.New(t, testrig.Options{})
	p := makeProject(t, r)
	t1, a1 := startTrial(t, r, 1, p)
	t2, _ := startTrial(t, r, 2, p)
	tok1, tok2 := tokenOf(t, t1), tokenOf(t, t2)
	// A lane's socket serves the token of a lane harness run of its trial.
	run1, run2 := startLaneRun(t, r, t1.ID).token, startLaneRun(t, r, t2.ID).token
	sock := r.Cfg.RoleAPISocket

	for _, c := range []struct{ role, target string }{
		{"lane-1", sock("lane-2")},
		{"lane-1", sock("agent-2")},
		{"lane-1", sock("agent-1")},
		{"agent-1", sock("agent-2")},
		{"agent-1", sock("lane-1")},
		{"lane-2", sock("lane-1")},
		{"lane-1", r.Cfg.APISocket()},
		{"agent-1", r.Cfg.APISocket()},
	} {
		if got := r.Probe(c.role, "connect", c.target); got != "EACCES" {
			t.Errorf("%s connects to %s: %s, want EACCES", c.role, c.target, got)
		}
	}
	// The same, with a token that works on the right socket: the refusal
	// is the kernel's, before any request.
	if got := r.Probe("lane-1", "api", sock("lane-2"), run2); got != "EACCES" {
		t.Errorf("lane-1 calls the API on lane-2's socket with lane 2's run's token: %s, want EACCES", got)
	}
	// On its own socket: the agent its trial's token, the lane its lane
	// harness run's; another lane's is 401, and so is the trial's own
	// token on the lane's socket.
	name := map[string]string{tok1: "trial 1's", tok2: "trial 2's", run1: "lane 1's run's", run2: "lane 2's run's"}
	for _, c := range []struct{ role, token, want string }{
		{"lane-1", run1, "200"},
		{"agent-1", tok1, "200"},
		{"lane-2", run2, "200"},
		{"lane-1", tok1, "401"},
		{"lane-1", tok2, "401"},
		{"lane-1", run2, "401"},
		{"agent-1", tok2, "401"},
		{"agent-1", run1, "401"},
	} {
		if got := r.Probe(c.role, "api", sock(c.role), c.token); got != c.want {
			t.Errorf("%s on its own socket with %s token: %s, want %s", c.role, name[c.token], got, c.want)
		}
	}

	// Who the sockets' files let through.
	ctl := r.Role("thermite")
	for _, role := range []string{"lane-1", "agent-1", "lane-2", "agent-2"} {
		var st unix.Stat_t
		if err := unix.Lstat(r.Cfg.RoleAPIDir(role), &st); err != nil {
			t.Fatal(err)
		}
		if u := r.Role(role); int(st.Uid) != ctl.UID || int(st.Gid) != u.GID || st.Mode&0o7777 != 0o710 {
			t.Errorf("%s: owner %d:%d mode %04o, want %d:%d 0710", r.Cfg.RoleAPIDir(role), st.Uid, st.Gid, st.Mode&0o7777, ctl.UID, u.GID)
		}
	}
	var st unix.Stat_t
	if err := unix.Lstat(r.Cfg.APISocket(), &st); err != nil || st.Mode&0o777 != 0o600 || int(st.Uid) != ctl.UID {
		t.Errorf("the operator's socket %s: %v owner %d mode %04o, want %d 0600", r.Cfg.APISocket(), err, st.Uid, st.Mode&0o7777, ctl.UID)
	}

	// Root passes every folder, but lane-1's listener serves lane-1 alone:
	// the connection is closed before a byte is read or written.
	conn, err := net.Dial("unix", sock("lane-1"))
	if err != nil {
		t.Fatalf("root connects to lane-1's socket: %v", err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := conn.Read(make([]byte, 1))
	conn.Close()
	if n != 0 || !errors.Is(err, io.EOF) {
		t.Errorf("root on lane-1's socket: read %d bytes, %v; want the connection closed (EOF)", n, err)
	}
	logged := false
	for deadline := time.Now().Add(5 * time.Second); !logged && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		logged = strings.Contains(r.LogText(), "refused a peer on the API socket of lane-1")
	}
	if !logged {
		t.Errorf("the controller did not log root's refused connection on lane-1's socket")
	}
	// Root's own socket, the operator's, takes any open trial's token, and
	// the trial's details name the socket the call came in on.
	if code, m, body := a1.do("GET", "/v1/trial", nil); code != 200 || m["id"] != t1.ID || m["api_socket"] != r.Cfg.APISocket() {
		t.Errorf("root on the operator's socket: %d %s", code, body)
	}
}

// laneRun is a lane harness run held open (startLaneRun): its token,
// served on the lane's own API socket while the run lasts, and its file.
type laneRun struct {
	token, file string
	cmd         *exec.Cmd
	t           testing.TB
	stopped     bool
}

// startLaneRun starts a lane harness run of trial id that says its token
// file and token, then waits; stop (or the test's end) ends it.
func startLaneRun(t testing.TB, r *testrig.Rig, id string) *laneRun {
	t.Helper()
	cmd := exec.Command(r.Bin, "--config", r.Config, "trial", "agent", id, "--harness", "lane", "--timeout", "10m", "--",
		"sh", "-c", `echo "$THERMITE_TOKEN_FILE $(cat "$THERMITE_TOKEN_FILE")"; exec sleep 600`)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	l := &laneRun{cmd: cmd, t: t}
	t.Cleanup(l.stop)
	// The run says its line, or ends, closing the pipe.
	line, _ := bufio.NewReader(out).ReadString('\n')
	f := strings.Fields(line)
	if len(f) != 2 {
		l.stop()
		t.Fatalf("the lane harness run said %q, not its token file and token; stderr %s", line, stderr.String())
	}
	l.file, l.token = f[0], f[1]
	return l
}

// stop ends the run (its `trial agent`, which this test started) and
// waits until its token file is gone, as the run's end leaves it.
func (l *laneRun) stop() {
	if l.stopped {
		return
	}
	l.stopped = true
	l.cmd.Process.Kill()
	l.cmd.Wait()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := os.Lstat(l.file); errors.Is(err, os.ErrNotExist) {
			return
		}
	}
	l.t.Errorf("the lane harness run's token file %s is still there 30 s after its run ended", l.file)
}

// TestLaneCommandAfterALaneHarnessRunFindsNoToken: a lane harness run
// gets a token of its own, on the lane's own API socket only. A lane
// command that copied it during the run, and runs after it (as trial exec
// does, or a Pi's bash through /v1/exec), finds its file gone and the
// copy refused with 401 on the lane's socket; the trial's own token (the
// agent's) is refused there too, though the agent's socket serves it; and
// during the run the configured MCP server's command works as the lane.
func TestLaneCommandAfterALaneHarnessRunFindsNoToken(t *testing.T) {
	r := testrig.New(t, testrig.Options{})
	p := makeProject(t, r)
	info, a := startTrial(t, r, 1, p)
	sock := r.Cfg.RoleAPISocket("lane-1")
	tok := tokenOf(t, info)

	// The run copies its token where the lane's later commands find it.
	out, stderr, code := r.Thermite("trial", "agent", info.ID, "--harness", "lane", "--", "sh", "-c",
		`cp "$THERMITE_TOKEN_FILE" copied-token && echo "$THERMITE_TOKEN_FILE" && `+r.Bin+` trial-client research note 'from the lane harness run'`)
	if code != 0 || !strings.Contains(out, "notes/") {
		t.Fatalf("the lane harness run: exit %d %q %s", code, out, stderr)
	}
	file := strings.SplitN(out, "\n", 2)[0]
	copied, err := os.ReadFile(filepath.Join(info.Workspace, "copied-token"))
	if err != nil || len(strings.TrimSpace(string(copied))) != 64 {
		t.Fatalf("the run's copy of its token: %q %v", copied, err)
	}
	laneTok := strings.TrimSpace(string(copied))
	if laneTok == tok {
		t.Fatalf("the lane harness run was given the trial's own token")
	}

	// After the run: a lane command finds no file and no token that works.
	if _, stderr, code := r.Thermite("trial", "exec", info.ID, "--", "cat", file); code == 0 || !strings.Contains(stderr, "No such file or directory") {
		t.Errorf("trial exec cat %s after the run: exit %d %q, want the file gone", file, code, stderr)
	}
	if got := r.Probe("lane-1", "api", sock, laneTok); got != "401" {
		t.Errorf("lane-1 calls its socket with the run's token after the run: %s, want 401", got)
	}
	// What Pi's bash runs: a lane command through the API's exec.
	code2, _, raw := a.do("POST", "/v1/exec", map[string]any{"argv": []string{r.Bin, "__probe", "try", "api", sock, laneTok}})
	if code2 != 200 || !strings.Contains(string(raw), `401`) {
		t.Errorf("a lane command through /v1/exec calls the lane's socket with the run's token: %d %s, want 401", code2, raw)
	}
	// The trial's own token: the agent's socket serves it, the lane's not.
	if got := r.Probe("lane-1", "api", sock, tok); got != "401" {
		t.Errorf("lane-1 calls its socket with the trial's own token: %s, want 401", got)
	}
	if got := r.Probe("agent-1", "api", info.APISocket, tok); got != "200" {
		t.Errorf("agent-1 calls its socket with the trial's token: %s, want 200", got)
	}

	// During a run: its token works on the lane's socket alone, and the
	// MCP server's command the lane's home configures reaches the trial.
	run := startLaneRun(t, r, info.ID)
	if run.token == laneTok || run.token == tok {
		t.Errorf("a second run's token is the first run's or the trial's")
	}
	if got := r.Probe("lane-1", "api", sock, run.token); got != "200" {
		t.Errorf("lane-1 calls its socket with the running run's token: %s, want 200", got)
	}
	if got := r.Probe("agent-1", "api", info.APISocket, run.token); got != "401" {
		t.Errorf("agent-1 calls its socket with the lane run's token: %s, want 401", got)
	}
	var claude struct {
		MCPServers map[string]struct {
			Command string   `json:"command"`
			Args    []string `json:"args"`
		} `json:"mcpServers"`
	}
	conf, err := os.ReadFile(filepath.Join(filepath.Dir(info.Workspace), "lane", ".claude.json"))
	if err != nil || json.Unmarshal(conf, &claude) != nil || len(claude.MCPServers["thermite"].Args) == 0 {
		t.Fatalf(".claude.json: %v %s", err, conf)
	}
	srv := claude.MCPServers["thermite"]
	if !slices.Contains(srv.Args, run.file) || !slices.Contains(srv.Args, sock) {
		t.Errorf("the MCP server's arguments %v name neither the run's token file %s nor the lane's socket", srv.Args, run.file)
	}
	argv := append([]string{"run-as", "lane-1", "--", srv.Command}, srv.Args[:len(srv.Args)-1]...)
	if out, stderr, code := r.Thermite(append(argv, "research", "note", "from the MCP server's command")...); code != 0 || !strings.Contains(out, "notes/") {
		t.Errorf("the configured MCP server's command as lane-1 during a run: exit %d %q %s", code, out, stderr)
	}
	// A second lane harness run while one runs is refused: the token
	// file is the running one's.
	if _, stderr, code := r.Thermite("trial", "agent", info.ID, "--harness", "lane", "--", "true"); code == 0 || !strings.Contains(stderr, "a lane harness run of this trial is running") {
		t.Errorf("a second lane harness run beside one: exit %d %q, want it refused", code, stderr)
	}
	run.stop()
	if got := r.Probe("lane-1", "api", sock, run.token); got != "401" {
		t.Errorf("lane-1 calls its socket with the run's token after its end: %s, want 401", got)
	}
}
