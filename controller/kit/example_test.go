package kit

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The example kit and project in examples/ must work: the manifest loads,
// the project builds with the kit's command, the run produces the cases'
// outputs, and the check prints the contract's JSON for right and wrong
// outputs.

var (
	exampleKit     = filepath.Join("..", "..", "examples", "kits", "sum")
	exampleProject = filepath.Join("..", "..", "examples", "projects", "sum")
)

func loadExample(t *testing.T) *Kit {
	t.Helper()
	k, err := Load(exampleKit)
	if err != nil {
		t.Fatal(err)
	}
	if k.Name != "sum" || len(k.Check.Hidden) == 0 || k.Check.Hidden[0] != "case3" {
		t.Fatalf("%+v", k)
	}
	return k
}

// check runs the kit's check as the judge would: in the kit's folder, with
// CheckEnv, and parses its output.
func check(t *testing.T, k *Kit, out string) (PublicResult, map[string]json.RawMessage) {
	t.Helper()
	argv := k.Expand(k.Check.Command, "", k.Dir, out)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = k.Dir
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, k.CheckEnv(out)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("check: %v: %s", err, stderr.String())
	}
	if !json.Valid(stdout.Bytes()) {
		t.Fatalf("check printed invalid JSON: %s", stdout.String())
	}
	pub, hidden, err := ParseCheck(stdout.Bytes(), k)
	if err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	return pub, hidden
}

func caseOK(t *testing.T, raw json.RawMessage) bool {
	t.Helper()
	var c struct {
		OK *bool `json:"ok"`
	}
	if err := json.Unmarshal(raw, &c); err != nil || c.OK == nil {
		t.Fatalf("case result %s has no ok", raw)
	}
	return *c.OK
}

func TestExampleCheckRightAndWrong(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	k := loadExample(t)
	out := t.TempDir()
	// The right outputs: the expected ones.
	if err := os.CopyFS(out, os.DirFS(filepath.Join(k.Dir, "expected"))); err != nil {
		t.Fatal(err)
	}
	pub, hidden := check(t, k, out)
	if pub.Score != 1 || len(pub.Cases) != 2 || !caseOK(t, pub.Cases["case1"]) || !caseOK(t, pub.Cases["case2"]) {
		t.Fatalf("right outputs: %+v", pub)
	}
	if len(hidden) != 1 || !caseOK(t, hidden["case3"]) {
		t.Fatalf("right outputs, hidden: %s", hidden)
	}
	if _, leaked := pub.Cases["case3"]; leaked {
		t.Fatal("the hidden case is public")
	}

	// A wrong public case lowers the score.
	os.WriteFile(filepath.Join(out, "case2.txt"), []byte("1 100000 10753841\n"), 0o644)
	pub, hidden = check(t, k, out)
	if pub.Score != 0.5 || caseOK(t, pub.Cases["case2"]) || !caseOK(t, pub.Cases["case1"]) || !caseOK(t, hidden["case3"]) {
		t.Fatalf("wrong case2: %+v %s", pub, hidden)
	}

	// A wrong hidden case shows only in the hidden results: the public
	// score counts the public cases.
	os.WriteFile(filepath.Join(out, "case3.txt"), []byte("garbage\n"), 0o644)
	pub, hidden = check(t, k, out)
	if pub.Score != 0.5 || caseOK(t, hidden["case3"]) {
		t.Fatalf("wrong case3: %+v %s", pub, hidden)
	}

	// A missing output, and a symlink planted by the run, are failures,
	// and the symlink is not followed.
	os.Remove(filepath.Join(out, "case1.txt"))
	os.Symlink(filepath.Join(k.Dir, "expected", "case1.txt"), filepath.Join(out, "case1.txt"))
	pub, _ = check(t, k, out)
	if pub.Score != 0 || caseOK(t, pub.Cases["case1"]) {
		t.Fatalf("symlinked case1: %+v", pub)
	}
	if !strings.Contains(string(pub.Cases["case1"]), `"missing":true`) {
		t.Fatalf("case1: %s", pub.Cases["case1"])
	}

	// Without THERMITE_HIDDEN the check refuses to score.
	cmd := exec.Command("sh", "check.sh")
	cmd.Dir = k.Dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "THERMITE_OUT=" + out}
	if b, err := cmd.Output(); err == nil {
		t.Fatalf("check without THERMITE_HIDDEN: %s", b)
	}
}

// TestExampleBuildRunCheck builds the example project with the kit's build
// command, runs the build as the kit says (in a run folder with a copy of
// run.copy and an out/ folder), and checks the outputs.
func TestExampleBuildRunCheck(t *testing.T) {
	k := loadExample(t)
	if _, err := exec.LookPath(k.Build.Command[0]); err != nil {
		t.Skipf("no %s", k.Build.Command[0])
	}
	// The build, in a copy of the project.
	work := filepath.Join(t.TempDir(), "project")
	if err := os.CopyFS(work, os.DirFS(exampleProject)); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(k.Build.Command[0], k.Build.Command[1:]...)
	cmd.Dir = work
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v: %s", err, b)
	}
	store := t.TempDir()
	for _, o := range k.Build.Outputs {
		if err := os.Rename(filepath.Join(work, o), filepath.Join(store, o)); err != nil {
			t.Fatalf("output %s: %v", o, err)
		}
	}
	// The run's folder: kit/ with run.copy, out/.
	runDir := t.TempDir()
	kitCopy, out := filepath.Join(runDir, "kit"), filepath.Join(runDir, "out")
	os.Mkdir(kitCopy, 0o755)
	os.Mkdir(out, 0o755)
	for _, c := range k.Run.Copy {
		src := filepath.Join(k.Dir, c)
		st, err := os.Stat(src)
		if err != nil {
			t.Fatal(err)
		}
		if st.IsDir() {
			err = os.CopyFS(filepath.Join(kitCopy, c), os.DirFS(src))
		} else {
			var b []byte
			if b, err = os.ReadFile(src); err == nil {
				err = os.WriteFile(filepath.Join(kitCopy, c), b, 0o444)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	argv := k.Expand(k.Run.Command, store, kitCopy, out)
	run := exec.Command(argv[0], argv[1:]...)
	run.Dir = runDir
	stdout, err := os.Create(filepath.Join(runDir, k.Run.Stdout))
	if err != nil {
		t.Fatal(err)
	}
	run.Stdout = stdout
	var stderr bytes.Buffer
	run.Stderr = &stderr
	err = run.Run()
	stdout.Close()
	if err != nil {
		t.Fatalf("run %q: %v: %s", argv, err, stderr.String())
	}
	pub, hidden := check(t, k, out)
	if pub.Score != 1 || len(pub.Cases) != 2 || len(hidden) != 1 || !caseOK(t, hidden["case3"]) {
		t.Fatalf("built and run: %+v %s", pub, hidden)
	}
	got, _ := os.ReadFile(filepath.Join(runDir, k.Run.Stdout))
	if !strings.HasPrefix(string(got), "case1 59720\n") {
		t.Fatalf("stdout: %q", got)
	}
}
