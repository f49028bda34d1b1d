package rig

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"thermite/internal/rpc"
	"thermite/internal/testrig"
)

// The first run on a fresh machine, and a start that is refused or cut
// short: what an operator sees, and what the machine is left with.

// openModes are the stand-in closed places as the test rig makes them:
// /tmp's 1777, /var/tmp's and /dev/shm's 0755 (all root's).
var openModes = []string{"0:0 01777", "0:0 00755", "0:0 00755"}

var closedModes = []string{"0:0 00700", "0:0 00700", "0:0 00700"}

func wantPlaces(t *testing.T, r *testrig.Rig, when string, want []string) {
	t.Helper()
	if got := r.PlaceModes(); !slices.Equal(got, want) {
		t.Errorf("closed places %s: %v, want %v", when, got, want)
	}
}

// A machine with no /etc/thermite (no secrets folder at all) starts on the
// embedded defaults: the self-test's secret canary needs no such folder.
func TestFreshMachineWithoutSecretsFolderStarts(t *testing.T) {
	r := testrig.New(t, testrig.Options{NoSecretsDir: true})
	st := r.Status()
	if st.Selftest == nil || !st.Selftest.Holds {
		t.Fatalf("self-test on a rig with no secrets folder: %+v", st.Selftest)
	}
	if st.Phase != rpc.PhaseReady {
		t.Errorf("phase %q, want %q", st.Phase, rpc.PhaseReady)
	}
	if _, err := os.Lstat(r.Cfg.SecretsDir); err == nil {
		t.Errorf("the broker or the self-test made %s: nothing outside the state dir may be made", r.Cfg.SecretsDir)
	}
	out, stderr, code := r.Thermite("status")
	if code != 0 || !strings.Contains(out, "ready") {
		t.Errorf("status: exit %d\n%s%s", code, out, stderr)
	}
	// The stand-in canary is gone with the self-test.
	entries, _ := os.ReadDir(r.Cfg.BrokerDir())
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "selftest-") {
			t.Errorf("self-test canary left in the broker's folder: %s", e.Name())
		}
	}
}

// A refused start leaves nothing behind: the closed places keep the modes
// they had, whether the refusal comes before they are closed (a secrets
// folder others can read) or after (a self-test that does not hold).
func TestRefusedStartLeavesClosedPlacesOpen(t *testing.T) {
	t.Run("secrets folder 0755", func(t *testing.T) {
		r := testrig.New(t, testrig.Options{NoStart: true})
		os.Chmod(filepath.Join(r.Dir, "secrets"), 0o755)
		if err := r.Start(); err == nil || !strings.Contains(err.Error(), "is mode 0755") {
			t.Fatalf("start with a 0755 secrets folder: %v", err)
		}
		wantPlaces(t, r, "after a refused start", openModes)
		if _, err := os.Lstat(filepath.Join(r.Cfg.BrokerDir(), "closed-tmp.json")); err == nil {
			t.Error("a refused start left its record of closed places")
		}
	})
	t.Run("self-test does not hold", func(t *testing.T) {
		// startup_selftest = refuse with a capability left to roles.
		r := testrig.New(t, testrig.Options{Tags: "thermite_weaken", Env: []string{"THERMITE_WEAKEN=cap-amb"}, NoStart: true})
		if err := r.Start(); err == nil || !strings.Contains(err.Error(), "isolation does NOT hold") {
			t.Fatalf("start with isolation broken: %v", err)
		}
		wantPlaces(t, r, "after the self-test refused the start", openModes)
	})
}

// A broker killed while the places are closed leaves them closed (roles may
// still run), and the next start restores the modes from before, not the
// 0700 it finds: after its clean stop they are as they were at first.
func TestBrokerKilledThenRestartedRestoresClosedPlaces(t *testing.T) {
	r := testrig.New(t, testrig.Options{})
	wantPlaces(t, r, "while the rig runs", closedModes)
	r.KillBroker()
	wantPlaces(t, r, "after SIGKILL of the broker", closedModes)
	if _, err := os.Lstat(filepath.Join(r.Cfg.BrokerDir(), "closed-tmp.json")); err != nil {
		t.Fatalf("no record of the places' modes survives the crash: %v", err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	wantPlaces(t, r, "while the restarted rig runs", closedModes)
	r.StopBroker()
	wantPlaces(t, r, "after the restarted rig's clean stop", openModes)

	// A crash, then a start that is refused: the refusal restores too.
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	r.KillBroker()
	os.Chmod(filepath.Join(r.Dir, "secrets"), 0o755)
	if err := r.Start(); err == nil {
		t.Fatal("started with a 0755 secrets folder")
	}
	wantPlaces(t, r, "after a crash and a refused start", openModes)
}

// Until the start-up self-test has held, role commands are refused with one
// line saying so, and nothing the self-test does touches them; status says
// the phase and exits non-zero; `status --wait` returns once ready.
func TestRoleCommandsRefusedDuringStartupSelftest(t *testing.T) {
	r := testrig.New(t, testrig.Options{NoStart: true})
	if err := r.Launch(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	var phase string
	for time.Now().Before(deadline) {
		resp, err := rpc.Call(r.Cfg.BrokerSocket(), &rpc.Request{Op: rpc.OpStatus})
		if err == nil {
			phase = resp.Status.Phase
			if phase != rpc.PhaseStarting {
				break
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	if phase != rpc.PhaseSelftest {
		t.Skipf("the start-up self-test was over before the test could see it (phase %q): nothing to race", phase)
	}
	_, stderr, code := r.RunAs("lane-1", nil, "true")
	if code == 0 || !strings.Contains(stderr, "the rig is starting: the start-up self-test is running") {
		t.Errorf("run-as during the start-up self-test: exit %d, %q; want a refusal saying the rig is starting", code, stderr)
	}
	if strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
		t.Errorf("refusal is not one line: %q", stderr)
	}
	_, stderr, code = r.Thermite("status")
	if code == 0 {
		t.Errorf("status exits 0 during the self-test: %s", stderr)
	}
	out, stderr, code := r.Thermite("status", "--wait=30s")
	if code != 0 || !strings.Contains(out, "ready") {
		t.Fatalf("status --wait: exit %d\n%s%s", code, out, stderr)
	}
	if out, stderr, code := r.RunAs("lane-1", nil, "echo", "served"); code != 0 || strings.TrimSpace(out) != "served" {
		t.Fatalf("run-as once ready: exit %d %q %q", code, out, stderr)
	}
	if _, stderr, code := r.Thermite("trial", "list"); code != 0 {
		t.Errorf("trial list once ready: exit %d %s", code, stderr)
	}
}

// status exits non-zero, naming the phase, when the controller does not
// answer (it is stopped), and 0 again once it does.
func TestStatusExitsNonZeroWhenControllerDoesNotAnswer(t *testing.T) {
	r := testrig.New(t, testrig.Options{})
	if _, stderr, code := r.Thermite("status"); code != 0 {
		t.Fatalf("status of a ready rig: exit %d %s", code, stderr)
	}
	pid := r.Status().ControllerPID
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// The stop reaches every thread only once one of them has taken the
	// signal; until then another, woken by the status's ping on a loaded
	// machine, may still answer it.
	for deadline := time.Now().Add(10 * time.Second); !threadsStopped(pid); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGCONT)
			t.Fatalf("the controller %d was never seen stopped, every thread of it", pid)
		}
	}
	out, stderr, code := r.Thermite("status")
	syscall.Kill(pid, syscall.SIGCONT)
	if code != statusNotReady || !strings.Contains(stderr, rpc.PhaseControllerDown) || !strings.Contains(out, rpc.PhaseControllerDown) {
		t.Errorf("status with the controller stopped: exit %d\n%s%s", code, out, stderr)
	}
	var st rpc.Status
	out, _, _ = r.Thermite("status", "--json", "--wait=10s")
	if err := jsonDecode(out, &st); err != nil || st.Phase != rpc.PhaseReady {
		t.Errorf("status --json after SIGCONT: %v %q", err, out)
	}
}

// With NOTIFY_SOCKET set (systemd's Type=notify), the broker says READY=1
// once the controller answers, and STOPPING=1 when it stops.
func TestBrokerNotifiesSystemdWhenReady(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "notify")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	r := testrig.New(t, testrig.Options{Env: []string{"NOTIFY_SOCKET=" + sock}, NoStart: true})
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	read := func(want string) {
		t.Helper()
		buf := make([]byte, 4096)
		l.SetReadDeadline(time.Now().Add(20 * time.Second))
		var got []string
		for {
			n, err := l.Read(buf)
			if err != nil {
				t.Fatalf("no %s from the broker (got %q): %v", want, got, err)
			}
			got = append(got, string(buf[:n]))
			if strings.Contains(string(buf[:n]), want) {
				return
			}
		}
	}
	read("READY=1")
	if _, stderr, code := r.Thermite("status"); code != 0 {
		t.Errorf("status after READY=1: exit %d %s", code, stderr)
	}
	// No role command inherits the socket.
	out, _, _ := r.RunAs("lane-1", nil, "env")
	if strings.Contains(out, "NOTIFY_SOCKET") {
		t.Errorf("a role command has NOTIFY_SOCKET:\n%s", out)
	}
	r.StopBroker()
	read("STOPPING=1")
}

// A state dir that role users cannot reach is refused at start in one line
// naming the folder and its mode, before anything is made or closed.
func TestStateDirBelowClosedFolderRefused(t *testing.T) {
	r := testrig.New(t, testrig.Options{NoStart: true})
	private := filepath.Join(r.Dir, "private")
	os.Mkdir(private, 0o700)
	cfg, _ := os.ReadFile(r.Config)
	text := strings.Replace(string(cfg), filepath.Join(r.Dir, "state"), filepath.Join(private, "state"), 1)
	os.WriteFile(r.Config, []byte(text), 0o644)
	r.Cfg.StateDir = filepath.Join(private, "state")
	err := r.Start()
	if err == nil {
		t.Fatal("serve started with its state dir under a 0700 folder")
	}
	want := "thermite: state_dir: " + private + " is mode 0700: role users cannot pass through it"
	if !strings.Contains(err.Error(), want) {
		t.Errorf("refusal does not name the folder and its mode (want %q):\n%v", want, err)
	}
	if _, err := os.Lstat(filepath.Join(private, "state")); err == nil {
		t.Error("the refused start made the state dir")
	}
	wantPlaces(t, r, "after the refusal", openModes)
}

// The self-test on a live rig, idle or forced on a busy one, leaves the
// controller running and says so: its probe stops nothing of the
// controller's user, whose rows hold against the real controller; and
// nobody may stop that user while the controller runs.
func TestSelftestOnLiveRigLeavesTheController(t *testing.T) {
	r := testrig.New(t, testrig.Options{})
	before := r.Status().ControllerPID
	for _, args := range [][]string{{"selftest", "isolation"}, {"selftest", "isolation", "--force"}} {
		if len(args) == 3 {
			if _, stderr, code := r.Thermite("trial", "start", "--lane", "1", "--project", filepath.Join(testrig.ModuleRoot(), "examples/projects/sum")); code != 0 {
				t.Fatalf("trial start: %s", stderr)
			}
		}
		out, stderr, code := r.Thermite(args...)
		if code != 0 || !strings.HasPrefix(out, "isolation holds") {
			t.Fatalf("%v on a live rig: exit %d\n%s%s", args, code, out, stderr)
		}
		if !strings.Contains(stderr, "was left running") {
			t.Errorf("%v does not say what it did to the controller: %q", args, stderr)
		}
		st := r.Status()
		if st.Phase != rpc.PhaseReady || st.ControllerPID != before || st.ControllerRuns != 1 {
			t.Errorf("after %v: phase %s, controller pid %d (was %d), started %d times", args, st.Phase, st.ControllerPID, before, st.ControllerRuns)
		}
	}
	_, stderr, code := r.Thermite("stop", "thermite")
	if code == 0 || !strings.Contains(stderr, "is the controller's user and the controller runs") {
		t.Errorf("stop of the controller's user: exit %d %q", code, stderr)
	}
	if st := r.Status(); st.ControllerPID != before {
		t.Errorf("the controller changed: %d, was %d", st.ControllerPID, before)
	}
}

// statusNotReady is `thermite status`'s exit code while the rig does not
// serve, as the README's command table gives it.
const statusNotReady = 3

// threadsStopped says whether every thread of process pid is stopped
// (state T).
func threadsStopped(pid int) bool {
	tids, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tids) == 0 {
		return false
	}
	for _, e := range tids {
		tid, err := strconv.Atoi(e.Name())
		if err != nil || !procStopped(tid) {
			return false
		}
	}
	return true
}
