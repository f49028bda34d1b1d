package rig

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"thermite/internal/rpc"
	"thermite/internal/testrig"
	"thermite/selftest"
)

func requireCgroups(t *testing.T, r *testrig.Rig) {
	t.Helper()
	if st := r.Status(); strings.HasPrefix(st.Cgroup, "none") {
		t.Skipf("needs a writable cgroup tree: %s", st.Cgroup)
	}
}

func TestLandlockKeepsWritesInTheRolesOwnPlaces(t *testing.T) {
	r := newRig(t)
	open := filepath.Join(r.Dir, "open")
	os.MkdirAll(filepath.Join(open, "sub"), 0o777)
	os.Chmod(open, 0o777)
	os.Chmod(filepath.Join(open, "sub"), 0o777)
	os.WriteFile(filepath.Join(open, "file"), []byte("keep"), 0o666)
	os.Chmod(filepath.Join(open, "file"), 0o666)
	// Every write right, in a folder whose mode lets everyone write: each is
	// refused; the same in the role's TMPDIR works.
	ops := map[string]string{
		"make a file":        "touch %s/new",
		"make a folder":      "mkdir %s/newdir",
		"make a FIFO":        "mkfifo %s/fifo",
		"make a symlink":     "ln -s /etc %s/link",
		"write a file":       "echo x >> %s/file",
		"truncate a file":    "truncate -s 0 %s/file",
		"remove a file":      "rm %s/file",
		"remove a folder":    "rmdir %s/sub",
		"move a file in":     "touch $TMPDIR/moved && mv $TMPDIR/moved %s/moved",
		"make a unix socket": "true",
	}
	for what, tmpl := range ops {
		if tmpl == "true" {
			continue
		}
		cmd := strings.ReplaceAll(tmpl, "%s", open)
		_, stderr, code := r.RunAs("lane-1", nil, "sh", "-c", cmd)
		if code == 0 || !(strings.Contains(stderr, "Permission denied") || strings.Contains(stderr, "Invalid cross-device link")) {
			t.Errorf("%s outside its places (%s): exit %d %q", what, cmd, code, stderr)
		}
	}
	for what, tmpl := range ops {
		if tmpl == "true" {
			continue
		}
		setup := "mkdir -p $TMPDIR/t/sub && echo keep > $TMPDIR/t/file && "
		cmd := setup + strings.ReplaceAll(tmpl, "%s", "$TMPDIR/t")
		if _, stderr, code := r.RunAs("lane-1", nil, "sh", "-c", cmd+" && rm -rf $TMPDIR/t"); code != 0 {
			t.Errorf("%s in its own TMPDIR: %q", what, stderr)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(open, "file")); string(b) != "keep" {
		t.Errorf("the open folder's file changed: %q", b)
	}
}

func TestNetworkPolicies(t *testing.T) {
	r := newRig(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	cases := []struct{ role, op, target, want string }{
		{"lane-1", "tcp", port, "EPERM"},  // api: no AF_INET socket
		{"agent-1", "tcp", port, "EPERM"}, // api
		{"lane-1", "udp", "", "EPERM"},    // api: no UDP at all
		{"builder", "tcp", port, "EPERM"}, // none: no AF_INET socket
		{"run", "udp", "", "EPERM"},       // none
		{"planner", "tcp", port, "ok"},    // open
		{"model-check", "udp", "", "ok"},  // open
	}
	for _, c := range cases {
		if got := r.Probe(c.role, c.op, c.target); got != c.want {
			t.Errorf("%s %s %s: %s, want %s", c.role, c.op, c.target, got, c.want)
		}
	}
}

// Issue 13, point 3: the api policy was a port, not an address. A lane
// connected to any address on the API's TCP port: a listener on 127.0.0.2
// at that port received its data, and on a host with a network that port
// is egress to the world. Now a lane and an agent make no TCP socket at
// all (EPERM), whatever the address, and reach the API through its unix
// socket.
func TestLaneReachesPastTheAPIOnItsTCPPortRefused(t *testing.T) {
	r := newRig(t)
	apiPort := apiTCPPort(t, r)
	other, err := net.Listen("tcp4", "127.0.0.2:"+apiPort)
	if err != nil {
		t.Fatalf("a listener on another loopback address at the API's port: %v", err)
	}
	defer other.Close()
	var reached atomic.Int64
	go func() {
		for {
			c, err := other.Accept()
			if err != nil {
				return
			}
			reached.Add(1)
			c.Close()
		}
	}()
	// The listener is there: the operator's own connect reaches it.
	if c, err := net.Dial("tcp4", "127.0.0.2:"+apiPort); err != nil {
		t.Fatalf("the listener on 127.0.0.2 is not reachable: %v", err)
	} else {
		c.Close()
	}
	for deadline := time.Now().Add(2 * time.Second); reached.Load() != 1 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	reached.Store(0)
	info, _ := startTrial(t, r, 1, makeProject(t, r))
	tok, err := os.ReadFile(info.TokenFile)
	if err != nil {
		t.Fatal(err)
	}
	targets := []string{
		"127.0.0.2:" + apiPort,     // another loopback address
		"127.0.0.1:" + apiPort,     // the API's own TCP listener
		"[::1]:" + apiPort,         // loopback over IPv6
		"203.0.113.1:" + apiPort,   // the world (TEST-NET-3)
		"[2001:db8::1]:" + apiPort, // the world over IPv6
	}
	for _, role := range []string{"lane-1", "agent-1"} {
		for _, target := range targets {
			if got := r.Probe(role, "tcp", target); got != "EPERM" {
				t.Errorf("%s connects to %s: %s, want EPERM (no TCP socket for the api policy)", role, target, got)
			}
		}
	}
	if n := reached.Load(); n != 0 {
		t.Errorf("the listener on 127.0.0.2 at the API's port accepted %d connections from the roles", n)
	}
	// What the roles use instead still works: each its own unix socket of
	// the API, the agent with its trial's token, the lane with a lane
	// harness run's.
	if want := r.Cfg.RoleAPISocket("agent-1"); info.APISocket != want {
		t.Errorf("trial details name the API socket %q, want the agent's own %q", info.APISocket, want)
	}
	for role, token := range map[string]string{"agent-1": strings.TrimSpace(string(tok)), "lane-1": startLaneRun(t, r, info.ID).token} {
		if got := r.Probe(role, "api", r.Cfg.RoleAPISocket(role), token); got != "200" {
			t.Errorf("%s calls the API on its unix socket: %s, want 200", role, got)
		}
	}
}

// apiTCPPort asks the controller for the harness API's TCP port.
func apiTCPPort(t *testing.T, r *testrig.Rig) string {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", r.Cfg.ControllerSocket())
	}}}
	resp, err := client.Get("http://controller/v1/ping")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ping map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&ping); err != nil {
		t.Fatal(err)
	}
	_, p, _ := net.SplitHostPort(ping["api_tcp"].(string))
	return p
}

func TestSeccompInRoleCommands(t *testing.T) {
	r := newRig(t)
	for _, c := range []struct{ cmd, want string }{
		{"unshare -U true", "Operation not permitted"},
		{"touch $TMPDIR/f && chmod u+s $TMPDIR/f", "Operation not permitted"},
	} {
		_, stderr, code := r.RunAs("lane-1", nil, "sh", "-c", c.cmd)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("%s: exit %d %q", c.cmd, code, stderr)
		}
	}
	out, _, _ := r.RunAs("lane-1", nil, "grep", "Seccomp:", "/proc/self/status")
	if !strings.Contains(out, "2") {
		t.Errorf("a role command is not under a seccomp filter: %q", out)
	}
}

func TestMemoryBombEndsOnlyThatTrial(t *testing.T) {
	r := testrig.New(t, testrig.Options{Extra: "[cgroup]\nenabled = true\nmemory_mb = 128\npids = 256\n"})
	requireCgroups(t, r)
	p := makeProject(t, r)
	t1, _ := startTrial(t, r, 1, p)
	t2, _ := startTrial(t, r, 2, p)
	done := make(chan string)
	go func() {
		out, _, _ := r.Thermite("trial", "exec", t2.ID, "--", "sh", "-c", "sleep 3; echo alive")
		done <- out
	}()
	_, stderr, code := r.Thermite("trial", "exec", t1.ID, "--", "sh", "-c", "head -c 1000000000 /dev/zero | tail")
	if code == 0 || !strings.Contains(stderr, "limit:memory") {
		t.Fatalf("memory bomb: exit %d %q", code, stderr)
	}
	if got := <-done; strings.TrimSpace(got) != "alive" {
		t.Fatalf("lane 2's command: %q", got)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, _, _ := r.Thermite("trial", "list", "--json")
		if strings.Contains(out, "over its memory limit") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("trial 1 not ended over its memory limit:\n%s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	out, _, _ := r.Thermite("trial", "list", "--json")
	if strings.Count(out, `"open"`) != 1 {
		t.Fatalf("lane 2's trial should still be open:\n%s", out)
	}
}

func TestForkBombHeldByThePidsLimit(t *testing.T) {
	r := testrig.New(t, testrig.Options{Extra: "[cgroup]\nenabled = true\nmemory_mb = 512\npids = 48\n"})
	requireCgroups(t, r)
	done := make(chan int)
	go func() {
		_, _, code := r.RunAs("lane-1", []string{"--timeout", "3s"}, "sh", "-c", "exec >/dev/null 2>&1; while :; do sleep 60 & done")
		done <- code
	}()
	max := 0
	for deadline := time.Now().Add(2500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if n := len(r.Procs("lane-1")); n > max {
			max = n
		}
	}
	<-done
	r.Thermite("stop", "lane-1")
	if max == 0 || max > 48 {
		t.Fatalf("lane-1 ran up to %d processes under a pids limit of 48", max)
	}
	t.Logf("at most %d processes", max)
}

func TestDiskCapEndsTheTrial(t *testing.T) {
	r := testrig.New(t, testrig.Options{Extra: "[trial]\ndisk_cap_mb = 8\ndisk_check = \"200ms\"\n"})
	p := makeProject(t, r)
	info, a := startTrial(t, r, 1, p)
	r.Thermite("trial", "exec", info.ID, "--", "sh", "-c", "head -c 20000000 /dev/urandom > big; sleep 10")
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, _, _ := r.Thermite("trial", "list", "--json")
		if strings.Contains(out, "over its disk limit") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ended over its disk limit:\n%s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for deadline := time.Now().Add(5 * time.Second); len(r.Procs("lane-1")) != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("lane-1 still runs %v", r.Procs("lane-1"))
		}
	}
	if code, _, _ := a.do("GET", "/v1/trial", nil); code != 401 {
		t.Fatalf("token after the disk cap: %d", code)
	}
	export, _, _ := r.Thermite("ledger", "export")
	if !strings.Contains(export, "trial.disk") {
		t.Fatal("no trial.disk event")
	}
}

// Issue 13, point 5: 200 MiB in a file the lane unlinked but keeps open
// did not end a trial with a 64 MiB cap: no folder walk sees it, yet the
// disk holds it until the last descriptor closes. The broker now counts
// what the role's processes keep in unlinked files, once per inode.
func TestLaneHidesDiskInAnUnlinkedOpenFileEndsItsTrial(t *testing.T) {
	r := testrig.New(t, testrig.Options{Extra: "[trial]\ndisk_cap_mb = 64\ndisk_check = \"200ms\"\n"})
	info, a := startTrial(t, r, 1, makeProject(t, r))
	// Unlinked before a byte is written, so no walk ever sees it; kept
	// open by a process that outlives the command.
	reason := holdUnlinkedUntilEnded(t, r, info.ID, 200)
	if !strings.Contains(reason, "deleted files its processes kept open") || !strings.Contains(reason, "of 64 MiB") {
		t.Errorf("the end reason does not say where the space was: %q", reason)
	}
	for deadline := time.Now().Add(5 * time.Second); len(r.Procs("lane-1")) != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("lane-1 still runs %v", r.Procs("lane-1"))
		}
	}
	if code, _, _ := a.do("GET", "/v1/trial", nil); code != 401 {
		t.Fatalf("token after the disk cap: %d", code)
	}
	export, _, _ := r.Thermite("ledger", "export")
	if !strings.Contains(export, `"unlinked_bytes"`) {
		t.Error("the trial.disk event does not record the unlinked bytes")
	}
}

// The measure reads each process's descriptors as the lane's own user; a
// process that hides them (not dumpable: here, a program the lane made
// execute-only) would hide what it holds, so it counts as over every cap.
func TestLaneHidesItsOpenFilesFromTheMeasureEndsItsTrial(t *testing.T) {
	r := testrig.New(t, testrig.Options{Extra: "[trial]\ndisk_cap_mb = 64\ndisk_check = \"200ms\"\n"})
	info, _ := startTrial(t, r, 1, makeProject(t, r))
	_, stderr, code := r.Thermite("trial", "exec", info.ID, "--", "sh", "-c",
		`cp /bin/sleep ./s && chmod 0111 ./s && setsid -f ./s 600 </dev/null >/dev/null 2>&1`)
	if code != 0 {
		t.Fatalf("trial exec: exit %d %s", code, stderr)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out, _, _ := r.Thermite("trial", "list", "--json")
		if strings.Contains(out, "over its disk limit: its processes keep their open files from the measure") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a lane process that is not dumpable did not end the trial:\n%s", out)
		}
	}
}

// A lane whose processes keep unlinked files well under its cap goes on,
// and its measure counts them.
func TestLaneUnlinkedOpenFileUnderTheCapCounted(t *testing.T) {
	r := testrig.New(t, testrig.Options{Extra: "[trial]\ndisk_cap_mb = 64\ndisk_check = \"200ms\"\n"})
	// The binary as the image installs it, root's 0711: the trial's file
	// helper (thermite itself, started by the broker) is then not
	// dumpable, and must not count as hiding its descriptors.
	fi, err := os.Stat(r.Bin)
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(r.Bin, 0o711)
	t.Cleanup(func() { os.Chmod(r.Bin, fi.Mode().Perm()) })
	info, _ := startTrial(t, r, 1, makeProject(t, r))
	r.Thermite("trial", "exec", info.ID, "--", "sh", "-c",
		`setsid -f sh -c 'exec 3>small && rm small && head -c 8388608 /dev/zero >&3 && exec sleep 600' </dev/null >/dev/null 2>&1`)
	var got int64
	for deadline := time.Now().Add(10 * time.Second); got < 8<<20; time.Sleep(100 * time.Millisecond) {
		out, _, _ := r.Thermite("trial", "list", "--json")
		var list []struct {
			State string `json:"state"`
			Disk  *struct {
				Bytes int64 `json:"bytes"`
			} `json:"disk"`
		}
		testrig.JSON(t, out, &list)
		if len(list) != 1 || list[0].State != "open" {
			t.Fatalf("the trial under its cap: %s", out)
		}
		if list[0].Disk != nil {
			got = list[0].Disk.Bytes
		}
		if time.Now().After(deadline) {
			t.Fatalf("the measure shows %d bytes, want at least the 8 MiB kept in the unlinked file", got)
		}
	}
}

func TestDecoyCredentials(t *testing.T) {
	r := newRig(t)
	p := makeProject(t, r)
	t1, a1 := startTrial(t, r, 1, p)
	t2, a2 := startTrial(t, r, 2, p)
	key1, _, _ := r.Thermite("trial", "exec", t1.ID, "--", "sh", "-c", "echo $AWS_ACCESS_KEY_ID")
	key2, _, _ := r.Thermite("trial", "exec", t2.ID, "--", "sh", "-c", "echo $AWS_ACCESS_KEY_ID")
	key1, key2 = strings.TrimSpace(key1), strings.TrimSpace(key2)
	if !strings.HasPrefix(key1, "AKIA") || len(key1) != 20 || key1 == key2 {
		t.Fatalf("decoy keys %q %q", key1, key2)
	}
	agentKey, _, _ := r.Thermite("trial", "agent", t1.ID, "--", "sh", "-c", "echo $AWS_SECRET_ACCESS_KEY")
	if len(strings.TrimSpace(agentKey)) != 40 {
		t.Fatalf("the agent's decoy secret: %q", agentKey)
	}
	// Through fetch's URL.
	code, _, raw := a1.do("POST", "/v1/fetch", map[string]any{"url": "https://example.com/?k=" + key1})
	if code != 403 || !strings.Contains(raw, "decoy") {
		t.Fatalf("fetch with the decoy: %d %s", code, raw)
	}
	// Through a recorded step.
	secret2, _, _ := r.Thermite("trial", "exec", t2.ID, "--", "sh", "-c", "echo $AWS_SECRET_ACCESS_KEY")
	code, _, raw = a2.do("POST", "/v1/steps", map[string]any{"kind": "thought", "text": "found " + strings.TrimSpace(secret2)})
	if code != 403 {
		t.Fatalf("step with the decoy: %d %s", code, raw)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		c1, _, _ := a1.do("GET", "/v1/trial", nil)
		c2, _, _ := a2.do("GET", "/v1/trial", nil)
		if c1 == 401 && c2 == 401 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("trials not ended after the decoy showed: %d %d", c1, c2)
		}
		time.Sleep(50 * time.Millisecond)
	}
	export, _, _ := r.Thermite("ledger", "export")
	if strings.Count(export, "security.decoy") != 2 || !strings.Contains(export, "the body of POST /v1/steps") {
		t.Fatalf("security events:\n%.2000s", export)
	}
}

func TestNoCgroupsIsSaid(t *testing.T) {
	r := testrig.New(t, testrig.Options{Extra: "[cgroup]\nenabled = false\n"})
	st := r.Status()
	if !strings.HasPrefix(st.Cgroup, "none: ") || !strings.Contains(st.Cgroup, "rlimits only") {
		t.Fatalf("status: %q", st.Cgroup)
	}
	res, code := selftestJSON(t, r)
	if code != 0 {
		t.Fatalf("self-test: %s", res.Sentence)
	}
	// Without cgroups there is no cpuset: timed runs are refused, and the
	// self-test says so rather than probing a timing user.
	refused := 0
	for _, p := range res.Probes {
		if p.OK && strings.HasPrefix(p.Got, "timed runs refused: ") || p.Role == "run" && strings.HasPrefix(p.Got, "refused: ") {
			refused++
		}
	}
	if refused != 2 {
		t.Errorf("the self-test does not say timed runs are refused (%d rows)", refused)
	}
	b := sleepKit(t, r, "slow", "true", 0)
	if _, stderr, code := r.Thermite("judge", "time", b.ID, "--kit", "slow"); code == 0 || !strings.Contains(stderr, "cannot be held in the kernel") || !strings.Contains(stderr, `accept_lost = ["judge-cpuset"]`) {
		t.Errorf("a timed run without a cpuset: exit %d %q", code, stderr)
	}
	// No CPU weights either: the rig runs, and the status, the check and
	// the self-test's verdict say they are off and why; none says they
	// hold.
	const off = "off: cgroups are off in the configuration (cgroup.enabled = false)"
	if st.CPUWeights != off {
		t.Errorf("status's cpu weights %q, want %q", st.CPUWeights, off)
	}
	if out, _, _ := r.Thermite("status"); !strings.Contains(out, "cpu weights  "+off) {
		t.Errorf("thermite status does not say the CPU weights are off:\n%s", out)
	}
	out, _, _ := r.Thermite("check", "--json")
	var v selftest.HostVerdict
	if err := jsonDecode(out, &v); err != nil {
		t.Fatal(err)
	}
	weights := false
	for _, row := range v.Rows {
		if row.Name == "CPU weights" {
			weights = true
			if row.OK || row.Severity != selftest.SevWarning || row.Got != off || !strings.Contains(row.Fix, "cpu controller") {
				t.Errorf("check's CPU weights row: %+v", row)
			}
		}
	}
	if !weights || !strings.Contains(v.Sentence, "CPU weights") {
		t.Errorf("check says nothing of the CPU weights: %s", v.Sentence)
	}
	if !strings.HasSuffix(res.Sentence, "; CPU weights "+off) || res.CPUWeights != off {
		t.Errorf("the self-test's verdict: %q (weights %q), want it to end with the weights off", res.Sentence, res.CPUWeights)
	}
	rows := map[string]rpc.Probe{}
	for _, p := range res.Probes {
		rows[p.Attempt] = p
	}
	if p := rows["per-role cgroups"]; !strings.Contains(p.Got, "cgroups are off") {
		t.Errorf("the self-test's cgroup row: %+v", p)
	}
	found := false
	for a, p := range rows {
		if strings.Contains(a, ": CPU weights as the kernel holds them") {
			found = true
			if !p.OK || p.Got != off {
				t.Errorf("the self-test's CPU weights row: %+v", p)
			}
		}
	}
	if !found {
		t.Error("no CPU weights row in the self-test")
	}
}

// Where no writable cpuset exists, the operator may accept running timed
// runs on affinity alone: they run, and the status and the verdict name the
// loss, the judge CPU rows recording it as accepted, never as holding.
func TestTimedRunsOnAffinityAloneOnlyWithTheLossAccepted(t *testing.T) {
	r := testrig.New(t, testrig.Options{Extra: "[cgroup]\nenabled = false\n[host]\naccept_lost = [\"judge-cpuset\"]\n"})
	st := r.Status()
	if w := strings.Join(st.Without, "; "); !strings.Contains(w, "judge-cpuset (") {
		t.Fatalf("status without: %q", w)
	}
	res, code := selftestJSON(t, r)
	if code != 0 || !strings.HasPrefix(res.Sentence, "isolation holds, without: ") || !strings.Contains(res.Sentence, "judge-cpuset (") {
		t.Fatalf("verdict (exit %d): %s", code, res.Sentence)
	}
	accepted := 0
	for _, p := range res.Probes {
		if strings.Contains(p.Got, "lost, accepted (host.accept_lost has judge-cpuset)") {
			accepted++
		}
	}
	if accepted == 0 {
		t.Errorf("no judge CPU row records the accepted loss: the verdict would hide it")
	}
	b := sleepKit(t, r, "slow", "true", 0)
	if out, stderr, code := r.Thermite("judge", "time", b.ID, "--kit", "slow"); code != 0 {
		t.Fatalf("a timed run with judge-cpuset accepted: exit %d %s %s", code, out, stderr)
	}
}

// holdUnlinkedUntilEnded has a process of trial id's lane that outlives
// its command write mib MiB into a file it unlinks but keeps open, and
// returns the trial's end reason once the disk check ends it (the test
// fails if it is not ended within 30 s).
func holdUnlinkedUntilEnded(t *testing.T, r *testrig.Rig, id string, mib int) string {
	t.Helper()
	script := fmt.Sprintf(`setsid -f sh -c 'exec 3>big && rm big && head -c %d /dev/zero >&3 && exec sleep 600' </dev/null >/dev/null 2>&1`, mib<<20)
	if _, stderr, code := r.Thermite("trial", "exec", id, "--", "sh", "-c", script); code != 0 {
		t.Fatalf("trial exec: exit %d %s", code, stderr)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out, _, _ := r.Thermite("trial", "list", "--json")
		if i := strings.Index(out, "over its disk limit"); i >= 0 {
			reason := out[i:]
			return reason[:strings.IndexByte(reason, '"')]
		}
		if time.Now().After(deadline) {
			t.Fatalf("a lane holding %d MiB in an unlinked open file was not ended by its disk cap:\n%s", mib, out)
		}
	}
}
