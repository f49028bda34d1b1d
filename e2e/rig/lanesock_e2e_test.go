package rig

import (
	"errors"
	"io"
	"net"
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
	lane2 := startAs(t, r, "lane-2", "calls", "ATTACK_SOCKET="+r.Cfg.RoleAPISocket("lane-2"), "ATTACK_TOKEN="+tokenOf(t, t2), "ATTACK_N=30", "ATTACK_FRESH=1")
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
	if n := field(t, line, "ok"); n < 1000 {
		t.Errorf("lane-1's flood made only %d connections: too few to prove anything", n)
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
	if got := r.Probe("lane-1", "api", sock("lane-2"), tok2); got != "EACCES" {
		t.Errorf("lane-1 calls the API on lane-2's socket with lane 2's token: %s, want EACCES", got)
	}
	// On its own socket: its own trial's token works, another lane's is 401.
	for _, c := range []struct{ role, token, want string }{
		{"lane-1", tok1, "200"},
		{"agent-1", tok1, "200"},
		{"lane-2", tok2, "200"},
		{"lane-1", tok2, "401"},
		{"agent-1", tok2, "401"},
	} {
		if got := r.Probe(c.role, "api", sock(c.role), c.token); got != c.want {
			t.Errorf("%s on its own socket with lane %s's token: %s, want %s", c.role, map[string]string{tok1: "1", tok2: "2"}[c.token], got, c.want)
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
