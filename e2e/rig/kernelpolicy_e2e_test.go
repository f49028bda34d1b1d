package rig

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"thermite/internal/testrig"
	"thermite/internal/weaken"
)

// oldKernel is a test build that pretends the kernel has Landlock ABI abi:
// the broker builds that kernel's rule sets, for real, on this one.
func oldKernel(abi int, extra string) testrig.Options {
	return testrig.Options{Tags: "thermite_weaken", Env: []string{"THERMITE_WEAKEN=landlock-abi-" + strconv.Itoa(abi)}, Extra: extra, NoStart: true}
}

// listenTCP is the port of a loopback server that accepts and closes at
// once (listedHost's).
func listenTCP(tb testing.TB) string {
	_, port, err := net.SplitHostPort(listedHost(tb))
	if err != nil {
		tb.Fatal(err)
	}
	return port
}

// Debian 12's 6.1 has Landlock ABI 2: no TCP rules (seccomp covers them:
// no role but an open one gets a TCP socket), no scoping (lost). The rig
// refuses it in one line naming the ABI, the protection and the setting,
// and undoes its start.
func TestOldKernelRefusedUnlessItsLossesAreAccepted(t *testing.T) {
	r := testrig.New(t, oldKernel(2, ""))
	if err := r.Launch(); err != nil {
		t.Fatal(err)
	}
	exitErr, done := r.WaitExit(20 * time.Second)
	if !done || exitErr == nil {
		t.Fatalf("broker on ABI 2 with nothing accepted: exit %v (done %v)\n%s", exitErr, done, r.LogText())
	}
	log := r.LogText()
	for _, w := range []string{"landlock ABI 2 (needs 6): landlock-scope is lost", `[host] accept_lost = [\"landlock-scope\"]`} {
		if !strings.Contains(log, w) {
			t.Errorf("refusal lacks %q:\n%s", w, log)
		}
	}
	if strings.Contains(log, "IOCTL_DEV") {
		t.Errorf("refusal names the wrong feature:\n%s", log)
	}
	if modes := r.PlaceModes(); strings.Contains(strings.Join(modes, " "), "000") {
		t.Errorf("a refused start left places closed: %v", modes)
	}
}

// With the operator's word the rig runs on ABI 2 and says, in the status and
// the verdict, exactly what it runs without; what is covered is really
// covered (no api or none role gets a TCP socket, seccomp's doing), and
// what ABI 2 still has holds (writes stay in the role's own places).
func TestAcceptedLossesNamedInStatusAndVerdict(t *testing.T) {
	r := testrig.New(t, oldKernel(2, "[host]\naccept_lost = [\"landlock-scope\"]\n"))
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	st := r.Status()
	without := strings.Join(st.Without, "; ")
	if without != "landlock-scope (landlock ABI 2 (needs 6))" {
		t.Fatalf("status without: %q", without)
	}
	out, _, _ := r.Thermite("status")
	if !strings.Contains(out, "without") || !strings.Contains(out, "landlock-scope (landlock ABI 2 (needs 6))") {
		t.Errorf("thermite status does not name the losses:\n%s", out)
	}
	res, code := selftestJSON(t, r)
	if code != 0 || !strings.HasPrefix(res.Sentence, "isolation holds, without: landlock-scope (landlock ABI 2 (needs 6)); every other probe") {
		t.Fatalf("verdict (exit %d): %s", code, res.Sentence)
	}
	lostRows := 0
	for _, p := range res.Probes {
		if strings.Contains(p.Got, "lost, accepted") {
			lostRows++
		}
	}
	if lostRows == 0 {
		t.Errorf("no self-test row says a protection was lost: the verdict would hide it")
	}
	port := listenTCP(t)
	if got := r.Probe("lane-1", "tcp", port); got != "EPERM" {
		t.Errorf("lane-1 (network api) to a TCP port on ABI 2: %s, want EPERM from seccomp (landlock-net is covered)", got)
	}
	if got := r.Probe("builder", "tcp", port); got != "EPERM" {
		t.Errorf("builder (network none) on ABI 2: %s, want EPERM from seccomp", got)
	}
	open := filepath.Join(r.Dir, "open")
	os.MkdirAll(open, 0o777)
	os.Chmod(open, 0o777)
	if got := r.Probe("lane-1", "create-in", open); got != "EACCES" {
		t.Errorf("lane-1 writes a world-writable folder on ABI 2: %s", got)
	}
	if _, stderr, code := r.RunAs("lane-1", nil, "sh", "-c", "echo x > $TMPDIR/f && cat $TMPDIR/f"); code != 0 {
		t.Errorf("lane-1 in its own TMPDIR on ABI 2: %q", stderr)
	}
}

// A kernel without Landlock runs only with every loss accepted; file modes
// and seccomp are then the whole line, and the verdict says so.
func TestNoLandlockRunsOnlyWithEveryLossNamed(t *testing.T) {
	r := testrig.New(t, oldKernel(0, "[host]\naccept_lost = [\"landlock-fs\", \"landlock-scope\"]\n"))
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	res, code := selftestJSON(t, r)
	if code != 0 || !strings.Contains(res.Sentence, "isolation holds, without: landlock-fs (no Landlock") {
		t.Fatalf("verdict (exit %d): %s", code, res.Sentence)
	}
	if got := r.Probe("builder", "unshare", ""); got != "EPERM" {
		t.Errorf("builder makes a user namespace without Landlock: %s", got)
	}
}

// A lane's fork loop cannot outrun its stop: the broker kills the role's
// cgroup at once (cgroup.kill on v2, the freezer on v1), then the helper's
// kill(-1) loop finds nothing; the lane runs again afterwards.
func TestForkLoopStoppedThroughTheRolesCgroup(t *testing.T) {
	r := testrig.New(t, testrig.Options{Extra: "[limits]\nprocesses = 2000\n[cgroup]\nenabled = true\npids = 300\n"})
	requireCgroups(t, r)
	go r.RunAs("lane-1", nil, "sh", "-c", "exec >/dev/null 2>&1 </dev/null; f() { while :; do setsid sh -c 'sleep 600' & done; }; f")
	deadline := time.Now().Add(20 * time.Second)
	for len(r.Procs("lane-1")) < 100 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := len(r.Procs("lane-1")); n < 100 {
		t.Fatalf("the fork loop did not grow: %d processes", n)
	}
	out, stderr, code := r.Thermite("stop", "lane-1")
	if code != 0 {
		t.Fatalf("stop: exit %d: %s %s", code, out, stderr)
	}
	if left := r.Procs("lane-1"); len(left) != 0 {
		t.Fatalf("%d processes of lane-1 left after stop", len(left))
	}
	if got, _, code := r.RunAs("lane-1", nil, "echo", "again"); code != 0 || strings.TrimSpace(got) != "again" {
		t.Fatalf("lane-1 after stop: exit %d %q", code, got)
	}
}

// accept_lost names what the kernel lacks; on a kernel that has it, a
// protection that breaks anyway (here: no rule set at all) is still a
// failure: the acceptance never turns a broken row into "lost, accepted".
func TestAcceptLostDoesNotHideABrokenProtection(t *testing.T) {
	r := testrig.New(t, testrig.Options{Tags: "thermite_weaken", Env: []string{"THERMITE_WEAKEN=no-landlock"},
		Extra: "startup_selftest = \"warn\"\n[host]\naccept_lost = [\"landlock-fs\", \"landlock-net\", \"landlock-scope\"]\n"})
	if w := r.Status().Without; len(w) != 0 {
		t.Fatalf("this kernel lacks nothing, yet the status says without %q", w)
	}
	res, _ := selftestJSON(t, r)
	if res.Holds || !strings.HasPrefix(res.Sentence, "isolation does NOT hold") || !strings.Contains(res.Sentence, "abstract unix socket") {
		t.Fatalf("verdict with Landlock broken on a kernel that has it: %s", res.Sentence)
	}
	for _, p := range res.Probes {
		if strings.Contains(p.Got, "lost, accepted") {
			t.Errorf("a row says its protection's loss was accepted: %+v", p)
		}
	}
}

// Issue 27: where roles would see every process in /proc (the broker has
// no /proc of its own with hidepid: here a test build that mounts none,
// as a container without CAP_SYS_ADMIN), the rig refuses to start in one
// line naming proc-hidepid and the setting; with the loss accepted it
// runs, and its status, its rig check and its verdict name the loss, which
// is real: a lane reads the timing user's stat.
func TestRigWithoutHidepidRefusedUnlessAccepted(t *testing.T) {
	visible := func(extra string) testrig.Options {
		return testrig.Options{Tags: "thermite_weaken", Env: []string{"THERMITE_WEAKEN=" + weaken.ProcVisible}, Extra: extra, NoStart: true}
	}
	r := testrig.New(t, visible(""))
	if err := r.Launch(); err != nil {
		t.Fatal(err)
	}
	exitErr, done := r.WaitExit(20 * time.Second)
	if !done || exitErr == nil {
		t.Fatalf("broker without hidepid, nothing accepted: exit %v (done %v)\n%s", exitErr, done, r.LogText())
	}
	for _, w := range []string{"proc-hidepid is lost", `[host] accept_lost = [\"proc-hidepid\"]`, "thermite serve could not mount its own"} {
		if !strings.Contains(r.LogText(), w) {
			t.Errorf("refusal lacks %q:\n%s", w, r.LogText())
		}
	}
	r = testrig.New(t, visible("[host]\naccept_lost = [\"proc-hidepid\"]\n"))
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	st := r.Status()
	if w := strings.Join(st.Without, "; "); !strings.HasPrefix(w, "proc-hidepid (") || !strings.HasPrefix(st.ProcView, "none: ") {
		t.Fatalf("status: without %q, proc view %q", w, st.ProcView)
	}
	out, _, code := r.Thermite("check")
	if code == 0 || !strings.Contains(out, "other users' processes hidden in /proc") {
		t.Errorf("the rig check with /proc showing every process: exit %d\n%s", code, out)
	}
	if out, _, _ := r.Thermite("selftest", "isolation"); !strings.Contains(out, "without: proc-hidepid") {
		t.Errorf("the verdict does not name the loss: %s", out)
	}
	done2 := make(chan struct{})
	go func() { r.RunAs("run", nil, "sleep", "10"); close(done2) }()
	var pids []int
	if !waitFor(10*time.Second, func() bool { pids = r.Procs("run"); return len(pids) > 0 }) {
		t.Fatal("the timing user's sleep did not start")
	}
	if got := r.Probe("lane-1", "read", "/proc/"+strconv.Itoa(pids[0])+"/stat"); got != "ok" {
		t.Errorf("lane-1 reads the timing user's stat where the loss is accepted: %s, want ok (the loss the status names)", got)
	}
	r.Thermite("stop", "run")
	<-done2
}
