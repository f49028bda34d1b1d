package rig

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"thermite/controller"
	"thermite/internal/config"
	"thermite/internal/testrig"
)

// Attacker's pass on issues 26 and 27: what a lane's agent can make the
// controller's ledger hold, and what reaches the operator's terminal.

// apiPoster posts to the harness API on one kept-alive connection.
type apiPoster struct {
	t     *testing.T
	c     *http.Client
	token string
}

func newAPIPoster(t *testing.T, socket, token string) *apiPoster {
	tr := &http.Transport{MaxIdleConnsPerHost: 1, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &apiPoster{t: t, c: &http.Client{Transport: tr, Timeout: 30 * time.Second}, token: token}
}

func (p *apiPoster) post(path string, body any) (int, string) {
	p.t.Helper()
	j, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", "http://api"+path, bytes.NewReader(j))
	req.Header.Set("Authorization", "Bearer "+p.token)
	resp, err := p.c.Do(req)
	if err != nil {
		p.t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

// eventBytes is what the ledger holds of a trial's events, as
// `trial events --json` shows them: the ledger's file grows in bbolt's
// steps (doubling), too coarse to measure one event by.
func eventBytes(t *testing.T, r *testrig.Rig, id string) int64 {
	out, stderr, code := r.Thermite("trial", "events", id, "--json")
	if code != 0 {
		t.Fatalf("trial events %s --json: exit %d %s", id, code, stderr)
	}
	return int64(len(out))
}

// blocksUnder is the space the files in dir take (their blocks).
func blocksUnder(t *testing.T, dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

// TestAttackAgentEventsGrowTheLedgerPastTheirCap: what an agent can make
// one trial's ledger and research folder hold. The 50 000 cap counts its
// events, not their bytes; the record budget (api.max_trial_recorded)
// counted a step's or a note's text, not the record: an empty step or a
// one-byte note was one byte of 20 MiB. Measured here: what one empty
// step, one one-byte note and one refused fetch of a 60 kB URL take, how
// many steps and notes the budget admits (lowered to 1 MiB here, scaled
// to the default), and so what one trial may take at most. The calls go
// on the operator's socket (the test is root, whom a lane's socket
// refuses); a lane's own socket serves the same routes with the same
// budgets (TestLaneConnectingToAnotherLanesAPISocketRefused).
func TestAttackAgentEventsGrowTheLedgerPastTheirCap(t *testing.T) {
	const budget = 1 << 20
	r := testrig.New(t, testrig.Options{APIExtra: fmt.Sprintf("max_trial_recorded = %d\n", budget)})
	p := makeProject(t, r)
	info1, _ := startTrial(t, r, 1, p)
	info2, _ := startTrial(t, r, 2, p)
	lane1 := newAPIPoster(t, r.Cfg.APISocket(), tokenOf(t, info1))
	lane2 := newAPIPoster(t, r.Cfg.APISocket(), tokenOf(t, info2))
	scale := float64(config.Default().API.MaxTrialRecorded) / budget
	const gib = 1 << 30

	// admitted posts body to path until the budget refuses it (413), at
	// most limit times, and says how many it took and what they cost.
	admitted := func(a *apiPoster, path string, body map[string]any, limit int, size func() int64) (int, float64) {
		before := size()
		n := 0
		for ; n < limit; n++ {
			code, raw := a.post(path, body)
			if code == 413 {
				break
			}
			if code != 200 {
				t.Fatalf("%s %d: %d %s", path, n, code, raw)
			}
		}
		if n == 0 {
			t.Fatalf("%s: the budget admitted none", path)
		}
		return n, float64(size()-before) / float64(n)
	}
	steps, perStep := admitted(lane1, "/v1/steps", map[string]any{"kind": "x", "text": ""}, 20000, func() int64 { return eventBytes(t, r, info1.ID) })
	if steps == 20000 {
		steps = budget // not refused: one byte each
	}
	t.Logf("an empty step: %.0f bytes of events; %d admitted by %d bytes of budget; at the default budget %.0f: %.2f GiB", perStep, steps, budget, float64(steps)*scale, perStep*float64(steps)*scale/gib)
	notesDir := filepath.Join(info2.ResearchDir, "notes")
	notes, perNote := admitted(lane2, "/v1/research/note", map[string]any{"title": "", "body": "x"}, 5000, func() int64 { return eventBytes(t, r, info2.ID) + blocksUnder(t, notesDir) })
	if notes == 5000 {
		notes = budget
	}
	t.Logf("a one-byte note: %.0f bytes of events and notes folder; %d admitted by %d bytes of budget; at the default budget %.0f files: %.2f GiB", perNote, notes, budget, float64(notes)*scale, perNote*float64(notes)*scale/gib)

	const fetches = 200
	long := "ftp://h/" + strings.Repeat("a", 60000)
	before := eventBytes(t, r, info1.ID)
	for i := 0; i < fetches; i++ {
		if code, raw := lane1.post("/v1/fetch", map[string]any{"url": long}); code == 200 {
			t.Fatalf("fetch %d of ftp: %d %.200s", i, code, raw)
		}
	}
	perFetch := float64(eventBytes(t, r, info1.ID)-before) / fetches
	t.Logf("a refused fetch of a 60 kB URL: %.0f bytes of events; 50 000 recorded: %.2f GiB", perFetch, perFetch*50000/gib)

	// What the lead's budget for one trial's records is: the 20 MiB the
	// budget names, give or take the text's own size on disk.
	for what, bytes := range map[string]float64{
		"empty steps":     perStep * float64(steps) * scale,
		"one-byte notes":  perNote * float64(notes) * scale,
		"refused fetches": perFetch * 50000,
	} {
		if bytes > gib/8 {
			t.Errorf("one trial's %s may take %.2f GiB of the controller's state", what, bytes/gib)
		}
	}
}

// TestAttackEventTextReachesTheOperatorsTerminal: a step's text is the
// agent's. `trial events` escapes it; `trial events --json` is what an
// operator pipes or reads, and must not carry a C1 control (CSI) or a
// bidi override raw either.
func TestAttackEventTextReachesTheOperatorsTerminal(t *testing.T) {
	r := testrig.New(t, testrig.Options{})
	info, _ := startTrial(t, r, 1, makeProject(t, r))
	p := newAPIPoster(t, r.Cfg.APISocket(), tokenOf(t, info))
	evil := "csi \u009b2J esc \x1b]0;owned\x07 rlo \u202eevil.com\u202c bs \\x1b"
	if code, raw := p.post("/v1/steps", map[string]any{"kind": "note", "text": evil}); code != 200 {
		t.Fatalf("step: %d %s", code, raw)
	}
	for _, args := range [][]string{{"trial", "events", info.ID}, {"trial", "events", info.ID, "--json"}} {
		out, stderr, code := r.Thermite(args...)
		if code != 0 {
			t.Fatalf("%v: exit %d %s", args, code, stderr)
		}
		for _, bad := range []string{"\u009b", "\x1b", "\x07", "\u202e"} {
			if strings.Contains(out, bad) {
				t.Errorf("%v prints %q raw: %q", args, bad, out)
			}
		}
	}
}

// TestAttackMapFilesSwapRace: a lane keeps two deleted files by mappings
// alone and swaps the two mappings' places without end (mremap, no
// descriptor), so that what maps names at an address is the other file by
// the time the measure follows map_files there. The broker must neither
// count the wrong file silently nor fall over: the trial ends as hiding
// its files, or its measure counts both.
func TestAttackMapFilesSwapRace(t *testing.T) {
	r := mappedRig(t, 64)
	info, a := startTrial(t, r, 1, makeProject(t, r))
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("needs /usr/bin/python3")
	}
	script := `import ctypes, mmap, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mremap.restype = ctypes.c_void_p
libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
P = 4096
addrs = []
for name in ("f", "g"):
    fd = os.open(name, os.O_RDWR | os.O_CREAT, 0o600)
    os.unlink(name)
    for i in range(4):
        os.write(fd, b"x" * (1 << 20))
    a = libc.mmap(None, P, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    os.close(fd)
    addrs.append(a)
tmp = libc.mmap(None, P, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
A, B = addrs
MAYMOVE, FIXED = 1, 2
n = 0
end = time.time() + 60
while time.time() < end:
    libc.mremap(A, P, P, MAYMOVE | FIXED, tmp)
    libc.mremap(B, P, P, MAYMOVE | FIXED, A)
    libc.mremap(tmp, P, P, MAYMOVE | FIXED, B)
    n += 1
`
	if code, _, raw := a.do("POST", "/v1/fs/write", map[string]any{"path": "swap.py", "data": []byte(script)}); code != 200 {
		t.Fatalf("fs/write: %d %s", code, raw)
	}
	if _, stderr, code := r.Thermite("trial", "exec", info.ID, "--", "sh", "-c", "setsid -f sh -c '/usr/bin/python3 swap.py 2>swap.err' </dev/null >/dev/null 2>&1"); code != 0 {
		t.Fatalf("trial exec: %s", stderr)
	}
	var last controller.TrialStatus
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		last = trialDisk(t, r, info.ID)
		if last.State != "open" {
			break
		}
	}
	t.Logf("after the swapping: state %s, end %q, disk %+v", last.State, last.EndReason, last.Disk)
	if last.State == "open" && (last.Disk == nil || last.Disk.Bytes < 8<<20) {
		t.Errorf("the trial is open and its measure shows %+v, less than the two 4 MiB files the mappings keep", last.Disk)
	}
	if st := r.Status(); st == nil {
		t.Errorf("the broker does not answer after the race")
	}
}

// TestAttackSocketReachedPastItsFolder: a role given an O_PATH descriptor
// of another role's socket (by a role that may pass its folder) connects
// through /proc/self/fd, past the folder's 0710: the kernel lets it, so
// the listener's SO_PEERCRED check is what refuses it, before a byte;
// and a loop of such connects is one line of the controller's log.
func TestAttackSocketReachedPastItsFolder(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("needs /usr/bin/python3")
	}
	r := testrig.New(t, testrig.Options{})
	startTrial(t, r, 1, makeProject(t, r))
	fd, err := unix.Open(r.Cfg.RoleAPISocket("lane-1"), unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "lane-1's socket")
	defer f.Close()
	cmd := exec.Command("/usr/bin/python3", "-c", `import socket
s = socket.socket(socket.AF_UNIX)
try:
    s.connect("/proc/self/fd/3")
except OSError as e:
    print("connect", e.errno); raise SystemExit
s.settimeout(10)
try:
    s.sendall(b"GET /v1/trial HTTP/1.1\r\nHost: api\r\n\r\n")
    got = s.recv(100)
    print("closed" if got == b"" else "read %r" % got)
except OSError as e:
    print("closed", e.errno)
for i in range(2000):
    c = socket.socket(socket.AF_UNIX)
    c.connect("/proc/self/fd/3")
    c.close()
`)
	u := r.Role("lane-2")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(u.GID), Groups: []uint32{}}}
	cmd.ExtraFiles = []*os.File{f}
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(t0)
	t.Logf("lane-2 on lane-1's socket through an O_PATH descriptor, %v: %s %v", took.Round(time.Millisecond), strings.TrimSpace(string(out)), err)
	if got := strings.TrimSpace(string(out)); !strings.HasPrefix(got, "closed") {
		t.Errorf("lane-2 through /proc/self/fd on lane-1's socket: %q, want the connection closed before a byte", got)
	}
	// Refused, and logged: a line every 5 s at most, not once for each of
	// the 2001 (the socket's api.accept_rate of 100 a second spreads them
	// over about 20 s, its own backlog holding the rest meanwhile).
	line := fmt.Sprintf(`"refused a peer on the API socket of lane-1","proc":"controller","uid":%d`, u.UID)
	n := 0
	for deadline := time.Now().Add(5 * time.Second); n == 0 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		n = strings.Count(r.LogText(), line)
	}
	if most := 2 + int(took/(5*time.Second)); n < 1 || n > most {
		t.Errorf("the controller logged lane-2's 2001 refused connections on lane-1's socket in %d lines over %v, want 1 to %d (a line every 5 s at most)", n, took.Round(time.Millisecond), most)
	}
}

// TestAttackLaneAndItsAgentHoldingTheirSharesLeaveOtherLanesServed:
// api.max_conns is one budget of every socket, and a lane holds
// max_conns_per_peer on its own socket and as many again as its agent.
// The configuration refuses a max_conns under a share for every peer
// (config.APIPeers); at that least, lane 1's two roles idle at their
// shares and lane 2's calls on its own socket are all answered.
func TestAttackLaneAndItsAgentHoldingTheirSharesLeaveOtherLanesServed(t *testing.T) {
	const share = 16
	peers := config.APIPeers(2, false)
	r := testrig.New(t, testrig.Options{APIExtra: fmt.Sprintf("max_conns = %d\nmax_conns_per_peer = %d\n", peers*share, share)})
	p := makeProject(t, r)
	startTrial(t, r, 1, p)
	t2, _ := startTrial(t, r, 2, p)
	for _, role := range []string{"lane-1", "agent-1"} {
		idle := startAs(t, r, role, "idle", "ATTACK_SOCKET="+r.Cfg.RoleAPISocket(role), fmt.Sprintf("ATTACK_N=%d", share+8))
		line := idle.expect("idle ", 20*time.Second)
		t.Logf("%s: %s", role, line)
		if alive := field(t, line, "alive"); alive != share {
			t.Errorf("%s keeps %d idle connections, want its share of %d", role, alive, share)
		}
	}
	// Lane 2's socket serves a lane harness run's token alone.
	lane2 := startAs(t, r, "lane-2", "calls", "ATTACK_SOCKET="+r.Cfg.RoleAPISocket("lane-2"), "ATTACK_TOKEN="+startLaneRun(t, r, t2.ID).token, "ATTACK_N=10", "ATTACK_FRESH=1")
	line := lane2.expect("calls ", 30*time.Second)
	t.Logf("lane-2 while lane 1's two roles hold their shares: %s", line)
	if ok := field(t, line, "ok"); ok != 10 {
		t.Errorf("lane-2's calls while lane 1's lane and agent hold their shares: %s, want all 10 answered", line)
	}

	// Under that least, the rig does not start.
	bad := fmt.Sprintf("%s\n[api]\nmax_conns = %d\nmax_conns_per_peer = %d\n", "lanes = 2", 2*share, share)
	path := filepath.Join(t.TempDir(), "rig.toml")
	os.WriteFile(path, []byte(bad), 0o644)
	if _, err := config.Load(path); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("api.max_conns: %d is less than api.max_conns_per_peer (%d) for each of the API's %d peers", 2*share, share, peers)) {
		t.Errorf("config with max_conns %d, %d a peer, 2 lanes: %v, want refused naming the %d peers", 2*share, share, err, peers)
	}
}

// TestAttackMoreMappedDeletedFilesThanTheMeasureStats: a lane keeping
// more deleted files by mappings alone than one measure follows
// (procs.MaxMappedStats, 16 384) ends its own trial as hiding its files,
// and the broker goes on serving.
func TestAttackMoreMappedDeletedFilesThanTheMeasureStats(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("needs /usr/bin/python3")
	}
	r := mappedRig(t, 1024)
	info, a := startTrial(t, r, 1, makeProject(t, r))
	script := `import ctypes, mmap, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
for i in range(16400):
    fd = os.open("m", os.O_RDWR | os.O_CREAT, 0o600)
    os.unlink("m")
    os.write(fd, b"x")
    libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    os.close(fd)
time.sleep(600)
`
	if code, _, raw := a.do("POST", "/v1/fs/write", map[string]any{"path": "many.py", "data": []byte(script)}); code != 200 {
		t.Fatalf("fs/write: %d %s", code, raw)
	}
	if _, stderr, code := r.Thermite("trial", "exec", info.ID, "--", "sh", "-c", "setsid -f sh -c '/usr/bin/python3 many.py 2>many.err' </dev/null >/dev/null 2>&1"); code != 0 {
		t.Fatalf("trial exec: %s", stderr)
	}
	s := waitTrial(t, r, info.ID, "the end of a trial past MaxMappedStats", func(s controller.TrialStatus) bool { return s.State != "open" })
	t.Logf("end: %s", s.EndReason)
	if !strings.Contains(s.EndReason, "keep more than 16384 deleted files by mappings alone") {
		t.Errorf("end reason %q, want it to name the bound of mapped deleted files", s.EndReason)
	}
	if st := r.Status(); st == nil {
		t.Errorf("the broker does not answer")
	}
}
