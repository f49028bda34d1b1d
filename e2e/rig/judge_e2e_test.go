package rig

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"thermite/controller/ledger"
	"thermite/internal/testrig"
)

func needCC(t testing.TB) {
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skip("needs a C compiler (cc) for the example kit: .ci/run installs gcc")
	}
}

func example(parts ...string) string {
	return filepath.Join(append([]string{testrig.ModuleRoot(), "examples"}, parts...)...)
}

func judgeBuild(t *testing.T, r *testrig.Rig, kitName, project string) ledger.Build {
	t.Helper()
	out, stderr, code := r.Thermite("judge", "build", "--kit", kitName, "--project", project, "--json")
	if code != 0 {
		t.Fatalf("judge build: exit %d\n%s", code, stderr)
	}
	var b ledger.Build
	testrig.JSON(t, out, &b)
	return b
}

func TestJudgeEndToEnd(t *testing.T) {
	needCC(t)
	r := newRig(t)
	if out, stderr, code := r.Thermite("kit", "import", example("kits", "sum")); code != 0 {
		t.Fatalf("kit import: %s %s", out, stderr)
	}
	b := judgeBuild(t, r, "sum", example("projects", "sum"))
	if b.Status != "stored" || len(b.Manifest) == 0 || !strings.HasPrefix(b.StorePath, r.Cfg.StoreDir()+"/") {
		t.Fatalf("build: %+v", b)
	}
	prog := filepath.Join(b.StorePath, "sum")
	var st syscallStat
	statOf(t, prog, &st)
	if int(st.Uid) != r.Role("thermite").UID || st.Mode&0o222 != 0 {
		t.Fatalf("stored program: uid %d mode %o, want the controller's, read-only", st.Uid, st.Mode&0o777)
	}

	t.Run("the store: no listing, the exact path opens for the timing user", func(t *testing.T) {
		if got := r.Probe("lane-1", "list", r.Cfg.StoreDir()); got != "EACCES" {
			t.Errorf("lane-1 lists the store: %s", got)
		}
		if got := r.Probe("run", "read", prog); got != "ok" {
			t.Errorf("run reads the stored program by its path: %s", got)
		}
		for _, op := range []string{"write", "chmod", "rename"} {
			if got := r.Probe("lane-1", op, prog); got == "ok" {
				t.Errorf("lane-1 %s the stored program: %s", op, got)
			}
		}
	})

	var run ledger.TimedRun
	t.Run("time and check", func(t *testing.T) {
		out, stderr, code := r.Thermite("judge", "time", b.ID, "--kit", "sum", "--json")
		if code != 0 {
			t.Fatalf("judge time: exit %d %s", code, stderr)
		}
		testrig.JSON(t, out, &run)
		if run.Status != "scored" || run.PublicScore == nil || *run.PublicScore != 1 || len(run.Repeats) != 5 || run.MedianWallNS <= 0 || run.Role != "run" {
			t.Fatalf("run: %+v", run)
		}
		if run.CPUs != r.Cfg.JudgeCPUs && run.CPUs == "" {
			t.Fatalf("cpus %q", run.CPUs)
		}
	})

	t.Run("hidden results stay in the hidden table", func(t *testing.T) {
		if strings.Contains(run.CheckOutput, "case3") {
			t.Fatalf("the run's answer holds the hidden case: %s", run.CheckOutput)
		}
		show, _, _ := r.Thermite("judge", "show", run.ID, "--json")
		export, _, _ := r.Thermite("ledger", "export")
		list, _, _ := r.Thermite("judge", "list", "--json")
		for name, text := range map[string]string{"judge show": show, "ledger export": export, "judge list": list} {
			if !strings.Contains(text, run.ID) {
				t.Errorf("%s lacks the run", name)
			}
			if strings.Contains(text, "case3") {
				t.Errorf("%s shows the hidden case", name)
			}
		}
		if !strings.Contains(show, "case1") {
			t.Errorf("judge show lacks the public case: %s", show)
		}
	})

	t.Run("a tampered stored file is refused, named", func(t *testing.T) {
		os.Chmod(prog, 0o755)
		f, _ := os.OpenFile(prog, os.O_WRONLY|os.O_APPEND, 0)
		f.Write([]byte{0})
		f.Close()
		_, stderr, code := r.Thermite("judge", "time", b.ID, "--kit", "sum")
		if code == 0 || !strings.Contains(stderr, "sum: content changed") {
			t.Fatalf("tampered build: exit %d %q", code, stderr)
		}
	})
}

func TestJudgeBuildLeavesNothingRunning(t *testing.T) {
	needCC(t)
	r := newRig(t)
	importKit(t, r, "daemon", `name = "daemon"
[build]
command = ["sh", "-c", "setsid -f sleep 600 </dev/null >/dev/null 2>&1; (sleep 600 &); echo built > out.txt"]
outputs = ["out.txt"]
[run]
command = ["cat", "{build}/out.txt"]
repeats = 1
[check]
command = ["sh", "-c", "echo '{\"score\": 1}'"]
`, nil)
	proj := filepath.Join(r.Dir, "p")
	os.MkdirAll(proj, 0o755)
	judgeBuild(t, r, "daemon", proj)
	if p := r.Procs("builder"); len(p) != 0 {
		t.Fatalf("the build left %v running", p)
	}
}

func TestJudgeKitImportRefusesBadManifests(t *testing.T) {
	r := newRig(t)
	for text, want := range map[string]string{
		"name = \"x\"\n[build]\ncommand = [\"true\"]\noutputs = [\"a\"]\n[run]\ncommand=[\"true\"]\nrepeats = 1\nrepeat = 2\n[check]\ncommand=[\"true\"]\n":                         `unknown key "run.repeat"`,
		"name = \"x\"\n[build]\noutputs = [\"a\"]\n[run]\ncommand=[\"true\"]\nrepeats = 1\n[check]\ncommand=[\"true\"]\n":                                                           "build.command",
		"name = \"x\"\n[build]\ncommand = [\"true\"]\noutputs = [\"a\"]\n[run]\ncommand=[\"true\"]\nrepeats = 1\ncopy = [\"../etc\"]\n[check]\ncommand=[\"true\"]\n":                "run.copy[0]",
		"name = \"x\"\n[build]\ncommand = [\"true\"]\noutputs = [\"a\"]\n[build.limits]\ntimeout = \"soon\"\n[run]\ncommand=[\"true\"]\nrepeats = 1\n[check]\ncommand=[\"true\"]\n": "build.limits.timeout",
	} {
		d := t.TempDir()
		os.WriteFile(filepath.Join(d, "kit.toml"), []byte(text), 0o644)
		_, stderr, code := r.Thermite("kit", "import", d)
		if code == 0 || !strings.Contains(stderr, want) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("want one line naming %q, got exit %d %q", want, code, stderr)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(r.Cfg.ControllerDir(), "kits")); len(ents) != 0 {
		t.Errorf("refused imports left %d entries", len(ents))
	}
}

func TestTimedRunHoldsItsCPUs(t *testing.T) {
	r := newRig(t)
	importKit(t, r, "slow", `name = "slow"
[build]
command = ["sh", "-c", "echo x > x"]
outputs = ["x"]
[run]
command = ["sleep", "2"]
repeats = 1
[check]
command = ["sh", "-c", "echo '{\"score\": 1}'"]
`, nil)
	proj := filepath.Join(r.Dir, "p")
	os.MkdirAll(proj, 0o755)
	b := judgeBuild(t, r, "slow", proj)
	done := make(chan string)
	go func() {
		out, _, _ := r.Thermite("judge", "time", b.ID, "--kit", "slow", "--json")
		done <- out
	}()
	// While it runs, its CPUs are its own.
	deadline := time.Now().Add(5 * time.Second)
	for len(r.Procs("run")) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	judgeCPUs, _ := r.Cfg.JudgeCPUSet()
	_, stderr, code := r.RunAs("lane-1", []string{"--cpus", judgeCPUs.String()}, "true")
	if code == 0 || !strings.Contains(stderr, "held by a timed run") {
		t.Fatalf("lane-1 on the judge's CPUs during a timed run: exit %d %q", code, stderr)
	}
	var tr ledger.TimedRun
	json.Unmarshal([]byte(<-done), &tr)
	if tr.Status != "scored" {
		t.Fatalf("run: %+v", tr)
	}
	// Afterwards they are free again.
	if _, stderr, code := r.RunAs("lane-1", []string{"--cpus", judgeCPUs.String()}, "true"); code != 0 {
		t.Fatalf("after the run: %s", stderr)
	}
}

// importKit writes a kit from its manifest text and imports it.
func importKit(t *testing.T, r *testrig.Rig, name, manifest string, files map[string]string) {
	t.Helper()
	dir := filepath.Join(r.Dir, "kit-"+name)
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "kit.toml"), []byte(manifest), 0o644)
	for p, text := range files {
		os.WriteFile(filepath.Join(dir, p), []byte(text), 0o755)
	}
	if _, stderr, code := r.Thermite("kit", "import", dir); code != 0 {
		t.Fatal(stderr)
	}
}

func TestJudgeRunsCannotReachTheController(t *testing.T) {
	r := newRig(t)
	proj := filepath.Join(r.Dir, "p")
	os.MkdirAll(proj, 0o755)
	victim := filepath.Join(r.Dir, "victim")
	os.WriteFile(victim, []byte("untouched\n"), 0o666)

	// A program that leaves a symlink where the kit's stdout goes: the
	// controller must not write through it.
	importKit(t, r, "evil", fmt.Sprintf(`name = "evil"
[build]
command = ["sh", "-c", "echo x > x"]
outputs = ["x"]
[run]
command = ["sh", "-c", "ln -s %s out/stdout.txt; echo payload"]
repeats = 1
stdout = "out/stdout.txt"
[check]
command = ["sh", "check.sh"]
`, victim), map[string]string{"check.sh": "echo '{\"score\": 1}'\n"})
	b := judgeBuild(t, r, "evil", proj)
	_, stderr, code := r.Thermite("judge", "time", b.ID, "--kit", "evil")
	if code == 0 || !strings.Contains(stderr, "out/stdout.txt is not a plain file") {
		t.Fatalf("a symlink in out/: exit %d %q", code, stderr)
	}
	if data, _ := os.ReadFile(victim); string(data) != "untouched\n" {
		t.Fatalf("the controller wrote through the run's symlink: %q", data)
	}
	// The kit's files are root's and read-only, even to the controller.
	check := filepath.Join(r.Cfg.ControllerDir(), "kits", "evil", "check.sh")
	var st syscallStat
	statOf(t, check, &st)
	if st.Uid != 0 || st.Mode&0o222 != 0 {
		t.Fatalf("kit file %d %o, want root's and read-only", st.Uid, st.Mode&0o777)
	}

	// Each repeat gets an empty out/, and nothing of a run stays in the
	// timing user's HOME.
	importKit(t, r, "fresh", `name = "fresh"
[build]
command = ["sh", "-c", "echo x > x"]
outputs = ["x"]
[run]
command = ["sh", "-c", "test ! -e out/marker && test ! -e $HOME/cache && touch out/marker $HOME/cache"]
repeats = 3
[check]
command = ["sh", "check.sh"]
`, map[string]string{"check.sh": "test -e \"$THERMITE_OUT/marker\" && echo '{\"score\": 1}'\n"})
	b = judgeBuild(t, r, "fresh", proj)
	out, stderr, code := r.Thermite("judge", "time", b.ID, "--kit", "fresh", "--json")
	if code != 0 || !strings.Contains(out, `"scored"`) {
		t.Fatalf("repeats saw each other's out/ or HOME: exit %d %s %s", code, out, stderr)
	}

	// A build output whose path goes through a symlink is refused.
	importKit(t, r, "sneaky", `name = "sneaky"
[build]
command = ["sh", "-c", "ln -s / x"]
outputs = ["x/etc"]
[run]
command = ["true"]
repeats = 1
[check]
command = ["sh", "check.sh"]
`, map[string]string{"check.sh": "echo '{\"score\": 1}'\n"})
	_, stderr, code = r.Thermite("judge", "build", "--kit", "sneaky", "--project", proj)
	if code == 0 || !strings.Contains(stderr, "x is a symlink") {
		t.Fatalf("an output through a symlink: exit %d %q", code, stderr)
	}
}

// Issue 13, point 5: builder folders and a run's out/ were never measured:
// a build or a timed run could fill the disk. Each now has a limit of its
// own ([judge] build_disk_mb, run_out_mb), and going past it fails the
// build or the run with one line naming the limit.
func TestBuildWritesPastItsDiskLimitFails(t *testing.T) {
	r := testrig.New(t, testrig.Options{Extra: "[judge]\nbuild_disk_mb = 16\nrun_out_mb = 16\ndisk_check = \"100ms\"\n"})
	importKit(t, r, "fill", `name = "fill"
[build]
command = ["sh", "-c", "head -c 67108864 /dev/zero > big && echo x > x"]
outputs = ["x"]
[run]
command = ["cat", "{build}/x"]
repeats = 1
[check]
command = ["sh", "-c", "echo '{\"score\": 1}'"]
`, nil)
	proj := filepath.Join(r.Dir, "p")
	os.MkdirAll(proj, 0o755)
	out, stderr, code := r.Thermite("judge", "build", "--kit", "fill", "--project", proj)
	if code == 0 || !strings.Contains(stderr, "over judge.build_disk_mb") || !strings.Contains(stderr, "of 16 MiB") {
		t.Fatalf("a build writing 64 MiB under build_disk_mb = 16: exit %d %q %q", code, out, stderr)
	}
	if strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
		t.Errorf("not one line: %q", stderr)
	}
	if ents, _ := os.ReadDir(r.Cfg.StoreDir()); len(ents) != 0 {
		t.Errorf("the failed build stored %d entries", len(ents))
	}
	if ents, _ := os.ReadDir(filepath.Join(r.Cfg.ScratchDir(), "builds")); len(ents) != 0 {
		t.Errorf("the failed build left %d build folders", len(ents))
	}
}

func TestTimedRunWritesPastItsOutLimitFails(t *testing.T) {
	r := testrig.New(t, testrig.Options{Extra: "[judge]\nrun_out_mb = 16\ndisk_check = \"100ms\"\n"})
	importKit(t, r, "spill", `name = "spill"
[build]
command = ["sh", "-c", "echo x > x"]
outputs = ["x"]
[run]
command = ["sh", "-c", "head -c 67108864 /dev/zero > out/big"]
repeats = 1
[check]
command = ["sh", "-c", "echo '{\"score\": 1}'"]
`, nil)
	proj := filepath.Join(r.Dir, "p")
	os.MkdirAll(proj, 0o755)
	b := judgeBuild(t, r, "spill", proj)
	_, stderr, code := r.Thermite("judge", "time", b.ID, "--kit", "spill")
	if code == 0 || !strings.Contains(stderr, "over judge.run_out_mb") || !strings.Contains(stderr, "of 16 MiB") {
		t.Fatalf("a run writing 64 MiB to out/ under run_out_mb = 16: exit %d %q", code, stderr)
	}
}
