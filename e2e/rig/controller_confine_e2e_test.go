package rig

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"thermite/internal/testrig"
)

// fromInsideController runs script as a kit's check: the controller runs
// it as its own child, so it is inside the controller's very Landlock
// domain, seccomp filter and cgroup. The script's output is kept in the
// research folder (the controller's own), and returned.
func fromInsideController(t *testing.T, r *testrig.Rig, script string) string {
	t.Helper()
	report := filepath.Join(r.Cfg.ResearchDir(), "confine-report")
	importKit(t, r, "inside", `name = "inside"
[build]
command = ["sh", "-c", "echo x > x"]
outputs = ["x"]
[run]
command = ["true"]
repeats = 1
[check]
command = ["sh", "check.sh"]
`, map[string]string{"check.sh": fmt.Sprintf("{\n%s\n} > %s 2>&1\necho '{\"score\": 1}'\n", script, report)})
	proj := filepath.Join(r.Dir, "p")
	os.MkdirAll(proj, 0o755)
	b := judgeBuild(t, r, "inside", proj)
	if _, stderr, code := r.Thermite("judge", "time", b.ID, "--kit", "inside"); code != 0 {
		t.Fatalf("judge time: exit %d %s", code, stderr)
	}
	data, err := os.ReadFile(report)
	if err != nil {
		t.Fatalf("the check left no report: %v", err)
	}
	return string(data)
}

// A flaw in what the controller parses must not let it write beyond its
// own folders: a folder every user may write by its mode stays shut to
// it, while its research folder stays writable.
func TestControllerCannotWriteOutsideItsFolders(t *testing.T) {
	r := newRig(t)
	open := filepath.Join(r.Dir, "open-to-all")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o777)
	out := fromInsideController(t, r, fmt.Sprintf(`touch %[1]s/from-controller && echo "outside: written" || echo "outside: refused"
touch %[2]s/from-controller && echo "own: written" || echo "own: refused"
mkdir %[3]s/evil && echo "private: made" || echo "private: refused"`,
		open, r.Cfg.ResearchDir(), r.Cfg.ControllerDir()))
	for _, want := range []string{"outside: refused", "Permission denied", "own: written", "private: refused"} {
		if !strings.Contains(out, want) {
			t.Errorf("from inside the controller: no %q in\n%s", want, out)
		}
	}
	if _, err := os.Lstat(filepath.Join(open, "from-controller")); err == nil {
		t.Error("the controller wrote a folder outside its own")
	}
	if _, err := os.Lstat(filepath.Join(r.Cfg.ControllerDir(), "evil")); err == nil {
		t.Error("the controller made a folder in its private folder, where it keeps only its ledger and socket")
	}
}

// The controller makes no namespace (the door to a user's every
// capability over its own copies of the kernel's objects) and runs under
// its seccomp filter with no_new_privs.
func TestControllerCannotMakeNamespaces(t *testing.T) {
	r := newRig(t)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", controllerPID(t, r)))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Seccomp:\t2\n", "NoNewPrivs:\t1\n"} {
		if !strings.Contains(string(status), want) {
			t.Errorf("the controller's status lacks %q", strings.TrimSpace(want))
		}
	}
	out := fromInsideController(t, r, `unshare -U true && echo "userns: made" || echo "userns: refused"
unshare -U -n true && echo "netns: made" || echo "netns: refused"`)
	for _, want := range []string{"userns: refused", "netns: refused", "Operation not permitted"} {
		if !strings.Contains(out, want) {
			t.Errorf("from inside the controller: no %q in\n%s", want, out)
		}
	}
}

// A flood the controller parses is bounded by its own cgroup: memory and
// pids limits as configured, the running controller inside.
func TestControllerMemoryLimited(t *testing.T) {
	r := testrig.New(t, testrig.Options{Extra: "[cgroup]\ncontroller_memory_mb = 640\ncontroller_pids = 300\n"})
	if !strings.Contains(r.Status().Cgroup, "controller: memory 640 MiB, 300 tasks") {
		t.Skipf("needs a writable cgroup tree with memory and pids: %s", r.Status().Cgroup)
	}
	pid := controllerPID(t, r)
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	limits := map[string]string{"memory": "", "pids": ""}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 || !strings.HasSuffix(f[2], "/controller.daemon") {
			continue
		}
		for _, ctl := range strings.Split(f[1], ",") {
			if _, ok := limits[ctl]; ok {
				limits[ctl] = f[2]
			}
		}
		if f[1] == "" { // cgroup v2: one group for both
			limits["memory"], limits["pids"] = f[2], f[2]
		}
	}
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	mount := func(ctl string) string {
		if _, err := os.Stat("/sys/fs/cgroup/" + ctl); err == nil {
			return "/sys/fs/cgroup/" + ctl
		}
		return "/sys/fs/cgroup"
	}
	if limits["memory"] == "" || limits["pids"] == "" {
		t.Fatalf("the controller (pid %d) is not in its own memory and pids group:\n%s", pid, data)
	}
	memDir := filepath.Join(mount("memory"), limits["memory"])
	memFile := filepath.Join(memDir, "memory.limit_in_bytes")
	if _, err := os.Stat(memFile); err != nil {
		memFile = filepath.Join(memDir, "memory.max")
	}
	if got := read(memFile); got != strconv.Itoa(640<<20) {
		t.Errorf("%s = %s, want %d", memFile, got, 640<<20)
	}
	pidsFile := filepath.Join(mount("pids"), limits["pids"], "pids.max")
	if got := read(pidsFile); got != "300" {
		t.Errorf("%s = %s, want 300", pidsFile, got)
	}
	if procs := strings.Fields(read(filepath.Join(memDir, "cgroup.procs"))); !contains(procs, strconv.Itoa(pid)) {
		t.Errorf("the controller (pid %d) is not among %s's processes %v", pid, memDir, procs)
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
