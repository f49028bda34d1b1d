package rig

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/caps"
	"thermite/internal/rpc"
	"thermite/internal/testrig"
)

const secretValue = "s3cr3t-canary-value-9f2c"

func newRig(t *testing.T) *testrig.Rig {
	return testrig.New(t, testrig.Options{Secrets: map[string]string{"api_key": secretValue}})
}

// aloneRig is newRig for a test that must not run beside others: it
// bounds a command by wall time, or loads the machine for its neighbours.
func aloneRig(t *testing.T) *testrig.Rig {
	return testrig.New(t, testrig.Options{Secrets: map[string]string{"api_key": secretValue}, Alone: true})
}

// One rig serves the tests that do not break it.
func TestBrokerAsOperator(t *testing.T) {
	r := newRig(t)
	lane := r.Role("lane-1")

	t.Run("id as lane", func(t *testing.T) {
		out, stderr, code := r.RunAs("lane-1", nil, "id", "-u")
		if code != 0 || strings.TrimSpace(out) != strconv.Itoa(lane.UID) {
			t.Fatalf("id -u as lane-1: %q %q exit %d; want %d", out, stderr, code, lane.UID)
		}
		out, _, _ = r.RunAs("lane-1", nil, "id", "-G")
		if strings.TrimSpace(out) != strconv.Itoa(lane.GID) {
			t.Fatalf("id -G as lane-1: %q, want only %d", out, lane.GID)
		}
	})

	t.Run("status of a role command", func(t *testing.T) {
		out, _, code := r.RunAs("lane-1", []string{"--cpus", "0"}, "cat", "/proc/self/status")
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
		want := map[string]string{"CapEff": "0000000000000000", "CapPrm": "0000000000000000", "CapAmb": "0000000000000000", "CapInh": "0000000000000000", "CapBnd": "0000000000000000", "NoNewPrivs": "1", "Cpus_allowed_list": "0"}
		for _, l := range strings.Split(out, "\n") {
			k, v, _ := strings.Cut(l, ":")
			if w, ok := want[k]; ok {
				if strings.TrimSpace(v) != w {
					t.Errorf("%s = %q, want %q", k, strings.TrimSpace(v), w)
				}
				delete(want, k)
			}
		}
		if len(want) > 0 {
			t.Errorf("status lacks %v", want)
		}
	})

	t.Run("only stdio is open", func(t *testing.T) {
		out, _, code := r.RunAs("lane-1", nil, "ls", "/proc/self/fd")
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
		// ls opens one descriptor for the listing itself: 3.
		if got := strings.Fields(out); strings.Join(got, " ") != "0 1 2 3" {
			t.Fatalf("open descriptors %v, want 0 1 2 and the listing's 3", got)
		}
		if got := r.Probe("lane-1", "fds", ""); got != "ok" {
			t.Fatal(got)
		}
		_, stderr, _ := r.RunAs("lane-1", nil, r.Bin, "__probe", "try", "fds")
		if strings.TrimSpace(stderr) != "0,1,2" {
			t.Fatalf("probe sees descriptors %q, want 0,1,2", stderr)
		}
	})

	t.Run("environment", func(t *testing.T) {
		out, _, code := r.RunAs("lane-1", []string{"--env", "FOO=bar", "--env", "HOME=/etc"}, "env")
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
		var names []string
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			k, v, _ := strings.Cut(l, "=")
			names = append(names, k)
			if strings.Contains(v, secretValue) {
				t.Errorf("secret value in %s", k)
			}
			if k == "HOME" && v != filepath.Join(r.Cfg.ScratchDir(), "home", "lane-1") {
				t.Errorf("HOME = %q: a request must not set it", v)
			}
			if k == "TMPDIR" && v != filepath.Join(r.Cfg.ScratchDir(), "tmp", "lane-1") {
				t.Errorf("TMPDIR = %q", v)
			}
		}
		got := strings.Join(sorted(names), ",")
		// The fence's two variables are there, empty, for a role without a card.
		if got != "CUDA_VISIBLE_DEVICES,FOO,HOME,LOGNAME,NVIDIA_VISIBLE_DEVICES,PATH,TMPDIR,USER" {
			t.Fatalf("environment names %s, want CUDA_VISIBLE_DEVICES,FOO,HOME,LOGNAME,NVIDIA_VISIBLE_DEVICES,PATH,TMPDIR,USER", got)
		}
		if !strings.Contains(out, "\nCUDA_VISIBLE_DEVICES=\n") && !strings.HasPrefix(out, "CUDA_VISIBLE_DEVICES=\n") {
			t.Errorf("CUDA_VISIBLE_DEVICES is not empty for a role without a card:\n%s", out)
		}
	})

	t.Run("refusals as a role", func(t *testing.T) {
		other := filepath.Join(r.Cfg.ScratchDir(), "tmp", "lane-2")
		cases := []struct{ op, path, want string }{
			{"read", filepath.Join(r.Dir, "secrets", "api_key"), "EACCES"},
			{"list", filepath.Join(r.Dir, "secrets"), "EACCES"},
			{"list", r.Cfg.ControllerDir(), "EACCES"},
			{"read", filepath.Join(r.Cfg.ControllerDir(), "ledger.db"), "EACCES"},
			{"list", other, "EACCES"},
			{"create-in", other, "EACCES"},
			{"connect", r.Cfg.BrokerSocket(), "EACCES"},
			{"create-in", filepath.Join(r.Dir, "closed-tmp"), "EACCES"},
			{"create-in", filepath.Join(r.Dir, "closed-vartmp"), "EACCES"},
			{"create-in", filepath.Join(r.Dir, "closed-shm"), "EACCES"},
			{"list", r.Cfg.StoreDir(), "EACCES"},
			// What must still work:
			{"create-in", filepath.Join(r.Cfg.ScratchDir(), "tmp", "lane-1"), "ok"},
			{"create-in", filepath.Join(r.Cfg.ScratchDir(), "home", "lane-1"), "ok"},
		}
		for _, c := range cases {
			if got := r.Probe("lane-1", c.op, c.path); got != c.want {
				t.Errorf("lane-1 %s %s: got %s, want %s", c.op, c.path, got, c.want)
			}
		}
		// The closed places are root's, 0700.
		for _, d := range []string{"closed-tmp", "closed-vartmp", "closed-shm"} {
			st, err := os.Stat(filepath.Join(r.Dir, d))
			if err != nil || st.Mode().Perm() != 0o700 || st.Sys().(*syscall.Stat_t).Uid != 0 {
				t.Errorf("%s: %v %v, want root 0700", d, st.Mode(), err)
			}
		}
	})

	t.Run("exit codes", func(t *testing.T) {
		if _, _, code := r.RunAs("builder", nil, "sh", "-c", "exit 7"); code != 7 {
			t.Errorf("exit 7 came back as %d", code)
		}
		if _, _, code := r.RunAs("builder", nil, "sh", "-c", "kill -TERM $$"); code != 128+15 {
			t.Errorf("SIGTERM came back as %d, want 143", code)
		}
		_, stderr, code := r.RunAs("builder", nil, "no-such-program-here")
		if code != 127 || !strings.Contains(stderr, "no-such-program-here: not found") {
			t.Errorf("missing program: exit %d %q", code, stderr)
		}
		start := time.Now()
		_, stderr, code = r.RunAs("builder", []string{"--timeout", "300ms"}, "sleep", "30")
		if code != 124 || !strings.Contains(stderr, "timed out") || time.Since(start) > 10*time.Second {
			t.Errorf("timeout: exit %d %q after %s", code, stderr, time.Since(start))
		}
	})

	t.Run("bad requests answer one line and the broker serves on", func(t *testing.T) {
		bad := []struct {
			args []string
			want string
		}{
			{[]string{"run-as", "nobody-role", "--", "true"}, `role "nobody-role" is not in the role table`},
			{[]string{"run-as", "lane-1", "--cpus", "63", "--", "true"}, "cpus: lane-1 may not use CPUs 63"},
			{[]string{"run-as", "lane-1", "--cwd", "../../../etc", "--", "true"}, "../../../etc"},
			{[]string{"run-as", "lane-1", "--cwd", "/etc", "--", "true"}, "/etc: not inside"},
			{[]string{"run-as", "lane-1", "--processes", "100000", "--", "true"}, "limits.processes: 100000 is above the rig's limit of 512"},
			{[]string{"run-as", "lane-1", "--env", "NOT VALID", "--", "true"}, `env: "NOT VALID" is not NAME=value`},
		}
		for _, b := range bad {
			_, stderr, code := r.Thermite(b.args...)
			if code == 0 || !strings.Contains(stderr, b.want) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
				t.Errorf("%v: exit %d, stderr %q; want one line with %q", b.args, code, stderr, b.want)
			}
		}
		// A symlink a lane plants in its own folder is not a way out.
		home := filepath.Join(r.Cfg.ScratchDir(), "home", "lane-1")
		if _, _, code := r.RunAs("lane-1", nil, "ln", "-s", "/etc", filepath.Join(home, "escape")); code != 0 {
			t.Fatal("ln -s as lane-1 failed")
		}
		_, stderr, code := r.Thermite("run-as", "lane-1", "--cwd", filepath.Join(home, "escape"), "--", "true")
		if code == 0 || !strings.Contains(stderr, "escape") || !strings.Contains(stderr, "symlink") {
			t.Errorf("cwd through a planted symlink: exit %d %q", code, stderr)
		}
		// Raw frames: garbage, oversized, unknown op, wrong version.
		frames := [][]byte{
			[]byte("this is not json"),
			append([]byte(`{"v":1,"op":"ping","x":"`), append(make([]byte, rpc.MaxFrame+10), '"', '}')...),
			[]byte(`{"v":1,"op":"format_disk"}`),
			[]byte(`{"v":99,"op":"ping"}`),
			[]byte(`{"v":1,"op":"ping","extra_field":1}`),
		}
		for i := range frames[1][len(`{"v":1,"op":"ping","x":"`) : len(frames[1])-2] {
			frames[1][len(`{"v":1,"op":"ping","x":"`)+i] = 'a'
		}
		for _, f := range frames {
			ans := rawFrame(t, r.Cfg.BrokerSocket(), f)
			if !strings.Contains(ans, `"error"`) {
				t.Errorf("frame %.40q: answer %q, want an error", f, ans)
			}
		}
		if _, err := rpc.Call(r.Cfg.BrokerSocket(), &rpc.Request{Op: rpc.OpPing}); err != nil {
			t.Fatalf("broker stopped serving: %v", err)
		}
	})

	t.Run("leftovers of a non-lane role end with its command", func(t *testing.T) {
		_, _, code := r.RunAs("builder", nil, "sh", "-c", "setsid -f sleep 600; (sleep 600 &) ; sleep 600 </dev/null >/dev/null 2>&1 & exit 0")
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
		if p := r.Procs("builder"); len(p) != 0 {
			t.Fatalf("builder still runs %v after its command", p)
		}
	})

	t.Run("a lane's leftovers live until StopUser", func(t *testing.T) {
		_, _, code := r.RunAs("lane-1", nil, "sh", "-c", "exec >/dev/null 2>&1 </dev/null; setsid -f sleep 600; (sleep 600 &); exit 0")
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
		if p := r.Procs("lane-1"); len(p) != 2 {
			t.Fatalf("lane-1 runs %v, want its 2 leftovers", p)
		}
		out, _, code := r.Thermite("stop", "lane-1")
		if code != 0 || !strings.Contains(out, "stopped 2 processes") {
			t.Fatalf("stop lane-1: %q exit %d", out, code)
		}
		if p := r.Procs("lane-1"); len(p) != 0 {
			t.Fatalf("lane-1 still runs %v", p)
		}
	})

	t.Run("a fork loop is held by its process limit", func(t *testing.T) {
		start := time.Now()
		done := make(chan int)
		go func() {
			_, _, code := r.RunAs("lane-2", []string{"--processes", "40", "--timeout", "4s"}, "sh", "-c", "exec >/dev/null 2>&1; while :; do sleep 60 & done")
			done <- code
		}()
		// Wait until the loop runs into its limit (or 10 s pass).
		n := 0
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if n = len(r.Procs("lane-2")); n >= 30 {
				break
			}
		}
		if n == 0 || n > 40 {
			t.Errorf("lane-2 runs %d processes under a limit of 40", n)
		}
		// The broker and the other roles stay responsive.
		t0 := time.Now()
		out, _, code := r.RunAs("lane-1", nil, "echo", "alive")
		if code != 0 || strings.TrimSpace(out) != "alive" {
			t.Errorf("lane-1 while lane-2 forks: %q exit %d", out, code)
		}
		t.Logf("lane-1 answered in %s while lane-2 ran %d processes", time.Since(t0), n)
		// dash gives up with status 2 when it cannot fork; otherwise the
		// timeout ends it with 124.
		if code := <-done; code != 2 && code != 124 {
			t.Errorf("fork loop: exit %d, want 2 (cannot fork) or 124 (timeout)", code)
		}
		r.Thermite("stop", "lane-2")
		if p := r.Procs("lane-2"); len(p) != 0 {
			t.Fatalf("lane-2 still runs %v", p)
		}
		t.Logf("fork loop held and stopped in %s", time.Since(start))
	})

	t.Run("no role can make a set-id file", func(t *testing.T) {
		_, stderr, code := r.RunAs("lane-1", nil, "sh", "-c", "cp /bin/true $HOME/su && chmod 4755 $HOME/su")
		if code == 0 || !strings.Contains(stderr, "Operation not permitted") {
			t.Fatalf("chmod 4755 as lane-1: exit %d %q", code, stderr)
		}
		_, stderr, code = r.RunAs("builder", nil, "sh", "-c", "mkdir $HOME/d && chmod g+s $HOME/d")
		if code == 0 || !strings.Contains(stderr, "Operation not permitted") {
			t.Fatalf("chmod g+s as builder: exit %d %q", code, stderr)
		}
	})

	t.Run("status", func(t *testing.T) {
		out, _, code := r.Thermite("status")
		if code != 0 || !strings.Contains(out, "controller") || !strings.Contains(out, "answers") {
			t.Fatalf("status: %q", out)
		}
		var st rpc.Status
		out, _, _ = r.Thermite("status", "--json")
		testrig.JSON(t, out, &st)
		if len(st.Roles) != len(r.Table.Roles) || !st.ControllerUp || st.LandlockABI < 1 {
			t.Fatalf("status --json: %+v", st)
		}
	})
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}

// rawFrame sends bytes as one frame and returns the answer frame.
func rawFrame(t *testing.T, socket string, b []byte) string {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(b); err != nil {
		return "write: " + err.Error()
	}
	buf := make([]byte, rpc.MaxFrame)
	n, err := c.Read(buf)
	if err != nil {
		return "read: " + err.Error()
	}
	// The broker closes the connection after a refused frame.
	if _, err := c.Read(buf); err == nil {
		t.Errorf("connection still open after a refused frame")
	}
	return string(buf[:n])
}

func TestSecretReadableByOthersRefusesStart(t *testing.T) {
	r := testrig.New(t, testrig.Options{Secrets: map[string]string{"token": "x"}, NoStart: true})
	bad := filepath.Join(r.Dir, "secrets", "token")
	os.Chmod(bad, 0o644)
	err := r.Start()
	if err == nil {
		t.Fatal("broker started with a secret file of mode 0644")
	}
	if !strings.Contains(err.Error(), bad+" is mode 0644") {
		t.Fatalf("refusal does not name the file and its mode:\n%v", err)
	}
	// Nothing half-done: no socket, no controller.
	if _, err := os.Stat(r.Cfg.BrokerSocket()); err == nil {
		t.Errorf("socket left behind")
	}
	if p := r.Procs("thermite"); len(p) != 0 {
		t.Errorf("controller processes left: %v", p)
	}
}

func TestControllerKilledStopsRoleCommands(t *testing.T) {
	r := newRig(t)
	before := r.Status()
	done := make(chan int)
	go func() {
		_, _, code := r.RunAs("builder", nil, "sh", "-c", "sleep 600 & sleep 600")
		done <- code
	}()
	deadline := time.Now().Add(5 * time.Second)
	for len(r.Procs("builder")) < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if len(r.Procs("builder")) < 2 {
		t.Fatal("builder command did not start")
	}
	if err := syscall.Kill(before.ControllerPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 128+9 {
			t.Errorf("builder command ended with %d, want 137 (SIGKILL)", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("builder command still running 10s after the controller died")
	}
	// The broker stops every role before it starts a new controller.
	deadline = time.Now().Add(15 * time.Second)
	var st *rpc.Status
	for time.Now().Before(deadline) {
		st = r.Status()
		if st.ControllerUp && st.ControllerPID != before.ControllerPID {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !st.ControllerUp || st.ControllerPID == before.ControllerPID {
		t.Fatal("no new controller answers")
	}
	for _, role := range r.Table.Roles {
		want := 0
		if role.Name == "thermite" {
			want = 1 // the new controller
		}
		if p := r.Procs(role.Name); len(p) != want {
			t.Errorf("%s runs %v, want %d processes", role.Name, p, want)
		}
	}
}

func TestBrokerStopsCleanly(t *testing.T) {
	r := newRig(t)
	r.RunAs("lane-1", nil, "sh", "-c", "setsid -f sleep 600 </dev/null >/dev/null 2>&1")
	if len(r.Procs("lane-1")) != 1 {
		t.Fatal("lane leftover did not start")
	}
	r.StopBroker()
	if err, ok := r.WaitExit(time.Second); !ok || err != nil {
		t.Fatalf("broker exit: %v", err)
	}
	for _, role := range r.Table.Roles {
		if p := r.Procs(role.Name); len(p) != 0 {
			t.Errorf("%s still runs %v after the broker stopped", role.Name, p)
		}
	}
	if _, err := os.Stat(r.Cfg.BrokerSocket()); err == nil {
		t.Error("socket left behind")
	}
	// The closed places are open again as they were.
	st, _ := os.Stat(filepath.Join(r.Dir, "closed-tmp"))
	if st.Mode()&os.ModePerm != 0o777 || st.Mode()&os.ModeSticky == 0 {
		t.Errorf("closed-tmp after stop: %v, want drwxrwxrwt", st.Mode())
	}
}

func TestBrokerCapabilities(t *testing.T) {
	r := newRig(t)
	st := r.Status()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", st.BrokerPID))
	if err != nil {
		t.Fatal(err)
	}
	// On a host `serve` clears the bounding set (it holds CAP_SETPCAP): the
	// broker keeps its six, and CAP_CHECKPOINT_RESTORE for the disk
	// measure where the kernel has it (00000100000000eb), through the exec
	// as inheritable, then clears that too, so nothing it forks has a
	// capability even to lose.
	own := fmt.Sprintf("%016x", caps.Mask(caps.BrokerFor(false, caps.Bounded([]int{caps.Measure}))))
	want := map[string]string{"CapEff": own, "CapPrm": own, "CapBnd": "0000000000000000", "CapInh": "0000000000000000", "CapAmb": "0000000000000000", "NoNewPrivs": "1"}
	for _, l := range strings.Split(string(data), "\n") {
		k, v, _ := strings.Cut(l, ":")
		if w, ok := want[k]; ok && strings.TrimSpace(v) != w {
			t.Errorf("broker %s = %s, want %s", k, strings.TrimSpace(v), w)
		}
	}
	ctl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", st.ControllerPID))
	if !strings.Contains(string(ctl), "CapEff:\t0000000000000000") || !strings.Contains(string(ctl), "CapBnd:\t0000000000000000") || !strings.Contains(string(ctl), "NoNewPrivs:\t1") {
		t.Errorf("controller status:\n%s", ctl)
	}
	if !strings.Contains(string(ctl), fmt.Sprintf("Uid:\t%d", r.Role("thermite").UID)) {
		t.Errorf("controller does not run as thermite:\n%s", ctl)
	}
	var sst unix.Stat_t
	if err := unix.Stat(r.Cfg.BrokerSocket(), &sst); err != nil {
		t.Fatal(err)
	}
	if sst.Mode&0o777 != 0o660 || sst.Uid != 0 || int(sst.Gid) != r.Role("thermite").GID {
		t.Errorf("socket %o %d:%d, want root:thermite 0660", sst.Mode&0o777, sst.Uid, sst.Gid)
	}
}

func jsonDecode(s string, v any) error { return json.Unmarshal([]byte(s), v) }

// Behind the filter, the sweep after each command is a second lock: with
// the filter switched off (a test build), set-id bits a lane makes are gone
// once its command ends, and a symlink swapped in during the sweep changes
// nothing outside.
func TestSetIDSweepBehindTheFilter(t *testing.T) {
	r := testrig.New(t, testrig.Options{Tags: "thermite_weaken", Env: []string{"THERMITE_WEAKEN=no-landlock"}, Extra: `startup_selftest = "warn"`})
	lane := r.Role("lane-1")
	t.Run("set-id bits do not outlive a lane command", func(t *testing.T) {
		home := filepath.Join(r.Cfg.ScratchDir(), "home", "lane-1")
		_, _, code := r.RunAs("lane-1", nil, "sh", "-c", "cp /bin/true $HOME/su && chmod 4755 $HOME/su && mkdir -p $HOME/d && chmod 2755 $HOME/d && cp /bin/true $HOME/d/sg && chmod 2755 $HOME/d/sg")
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
		for _, p := range []string{"su", "d", "d/sg"} {
			st, err := os.Lstat(filepath.Join(home, p))
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
				t.Errorf("%s keeps its set-id bit: %v", p, st.Mode())
			}
		}
	})

	t.Run("a symlink swapped in during the sweep changes nothing outside", func(t *testing.T) {
		outside := filepath.Join(r.Dir, "outside")
		os.MkdirAll(outside, 0o755)
		victim := filepath.Join(outside, "victim")
		os.WriteFile(victim, []byte("x"), 0o755)
		// The lane's own uid owns it, so only the walk's refusal to follow
		// a symlink keeps the sweep off it.
		os.Chown(victim, lane.UID, lane.GID)
		os.Chmod(victim, 0o755|os.ModeSetuid)
		if st, _ := os.Stat(victim); st.Mode()&os.ModeSetuid == 0 {
			t.Fatal("victim has no setuid bit to lose")
		}
		setup := fmt.Sprintf(`cd $HOME && mkdir -p w && i=0; while [ $i -lt 300 ]; do : > w/f$i; i=$((i+1)); done
setsid -f sh -c 'cd $HOME; while :; do mv w w.real 2>/dev/null; ln -s %s w 2>/dev/null; rm -f w; mv w.real w 2>/dev/null; done' </dev/null >/dev/null 2>&1`, outside)
		if _, stderr, code := r.RunAs("lane-1", nil, "sh", "-c", setup); code != 0 {
			t.Fatalf("exit %d %s", code, stderr)
		}
		// Each command sets the bits again, and each sweep after it walks
		// the folder while the swapper runs.
		for i := 0; i < 20; i++ {
			r.RunAs("lane-1", nil, "sh", "-c", "chmod 4755 $HOME/w/f* $HOME/w.real/f* 2>/dev/null; true")
		}
		r.Thermite("stop", "lane-1")
		st, _ := os.Stat(victim)
		if st.Mode()&os.ModeSetuid == 0 {
			t.Fatalf("the sweep followed a symlink out of the lane's folder and cleared %s", victim)
		}
	})

}
