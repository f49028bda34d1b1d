package kit

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/rpc"
)

const goodManifest = `
name = "sum"
description = "an example"

[build]
command = ["cc", "-O2", "-o", "sum", "sum.c"]
outputs = ["sum", "lib/"]

[build.limits]
timeout = "5m"
processes = 256
open_files = 1024
file_size_mb = 512

[run]
command = ["{build}/sum", "{kit}/input.txt", "{kit}/cases", "{out}", "--lib={build}/lib"]
copy = ["input.txt", "cases/"]
repeats = 5
stdout = "out/stdout.txt"

[run.limits]
timeout = "30s"
cpu_seconds = 60

[check]
command = ["./check.sh", "{out}"]
hidden = ["case3"]
`

// kitDir writes a kit folder with manifest as its kit.toml.
func kitDir(t *testing.T, manifest string) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"input.txt":          "case1\ncase3\n",
		"cases/case1.txt":    "1 2\n",
		"cases/case3.txt":    "3 4\n",
		"expected/case1.txt": "1 2 1\n",
		"check.sh":           "#!/bin/sh\necho '{\"score\": 1}'\n",
	}
	for p, c := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "check.sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, File), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestLoadGood(t *testing.T) {
	dir := kitDir(t, goodManifest)
	k, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := &Kit{
		Dir:         dir,
		Name:        "sum",
		Description: "an example",
		Build: Build{
			Command: []string{"cc", "-O2", "-o", "sum", "sum.c"},
			Outputs: []string{"sum", "lib"},
			Limits:  Limits{Timeout: 5 * time.Minute, Processes: 256, OpenFiles: 1024, FileSizeMB: 512},
		},
		Run: Run{
			Command: []string{"{build}/sum", "{kit}/input.txt", "{kit}/cases", "{out}", "--lib={build}/lib"},
			Copy:    []string{"input.txt", "cases"},
			Repeats: 5,
			CPUs:    1,
			Cards:   0,
			Stdout:  "out/stdout.txt",
			Limits:  Limits{Timeout: 30 * time.Second, CPUSeconds: 60},
		},
		Check: Check{
			Command: []string{"./check.sh", "{out}"},
			Hidden:  []string{"case3"},
			Public:  "score",
		},
	}
	if !reflect.DeepEqual(k, want) {
		t.Fatalf("got  %+v\nwant %+v", k, want)
	}
	if got := k.Run.Limits.RPC(); got != (rpc.Limits{CPUSeconds: 60, TimeoutMS: 30000}) {
		t.Fatalf("RPC: %+v", got)
	}
	if got := (Limits{Timeout: 1500 * time.Microsecond}).RPC().TimeoutMS; got != 2 {
		t.Fatalf("1.5ms is %d ms, want 2 (never shorter, never 0)", got)
	}
	if !k.IsHidden("case3") || k.IsHidden("case1") {
		t.Fatal("IsHidden")
	}
	if env := k.CheckEnv("/runs/1/out"); !reflect.DeepEqual(env, []string{"THERMITE_OUT=/runs/1/out", "THERMITE_HIDDEN=case3"}) {
		t.Fatalf("CheckEnv: %q", env)
	}
	// A kit reached through a symlinked path is walked all the same.
	link := filepath.Join(t.TempDir(), "kit")
	os.Symlink(dir, link)
	if k, err := Load(link); err != nil || k.Dir != link {
		t.Fatalf("symlinked kit: %v %v", k, err)
	}
	// A relative folder is made absolute.
	wd, _ := os.Getwd()
	defer os.Chdir(wd)
	os.Chdir(filepath.Dir(dir))
	if k, err := Load(filepath.Base(dir)); err != nil || k.Dir != dir {
		t.Fatalf("relative: %v %v", k, err)
	}
}

func TestLoadInlineTablesAndDefaults(t *testing.T) {
	dir := kitDir(t, `
name = "x"
build = { command = ["make"], outputs = ["bin/"] }
run = { command = ["{build}/bin/x"], repeats = 1, limits = { timeout = "1s" } }
check = { command = ["sh", "check.sh"], public = "speedup" }
`)
	k, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if k.Run.CPUs != 1 || k.Run.Cards != 0 || k.Check.Public != "speedup" || len(k.Run.Copy) != 0 || k.Run.Limits.Timeout != time.Second {
		t.Fatalf("%+v", k)
	}
}

func TestExpand(t *testing.T) {
	k := &Kit{}
	got := k.Expand([]string{"{build}/sum", "--in={kit}/input.txt", "{out}", "{out}{out}", "plain"}, "/store/b1", "/runs/r/kit", "/runs/r/{kit}")
	want := []string{"/store/b1/sum", "--in=/runs/r/kit/input.txt", "/runs/r/{kit}", "/runs/r/{kit}/runs/r/{kit}", "plain"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%q", got)
	}
}

// edit replaces old with new in the good manifest, once, and fails the
// test if old is not there.
func edit(t *testing.T, old, new string) string {
	t.Helper()
	if !strings.Contains(goodManifest, old) {
		t.Fatalf("the manifest has no %q", old)
	}
	return strings.Replace(goodManifest, old, new, 1)
}

func TestLoadRefusals(t *testing.T) {
	for _, c := range []struct {
		old, new string
		want     string // after "kit <dir>/kit.toml: "
	}{
		{"repeats = 5", "repeat = 5", `unknown key "run.repeat"`},
		{"[check]", "[checks]\ncommand = []\n[check]", `unknown key "checks"`},
		{"timeout = \"30s\"", "timeout = \"30s\"\nmemory_mb = 1", `unknown key "run.limits.memory_mb"`},
		{"command = [\"cc\", \"-O2\", \"-o\", \"sum\", \"sum.c\"]\n", "", "missing field build.command"},
		{"name = \"sum\"\n", "", "missing field name"},
		{"repeats = 5\n", "", "missing field run.repeats"},
		{"outputs = [\"sum\", \"lib/\"]\n", "", "missing field build.outputs"},
		{"[check]\ncommand = [\"./check.sh\", \"{out}\"]\nhidden = [\"case3\"]\n", "", "missing field check"},
		{"timeout = \"5m\"", "timeout = \"soon\"", `build.limits.timeout: "soon" is not a duration (like "30s" or "5m")`},
		{"timeout = \"5m\"", "timeout = 300", `build.limits.timeout: 300 is not a duration (like "30s" or "5m")`},
		{"timeout = \"5m\"", "timeout = \"-1s\"", `build.limits.timeout: "-1s" is out of range 0 or 1ms..168h`},
		{"timeout = \"30s\"", "timeout = \"200h\"", `run.limits.timeout: "200h" is out of range 0 or 1ms..168h`},
		{"processes = 256", "processes = -1", "build.limits.processes: -1 is out of range 0..4194304"},
		{"open_files = 1024", "open_files = 1.5", "build.limits.open_files: 1.5 is not an integer"},
		{"file_size_mb = 512", "file_size_mb = 2147483648", "build.limits.file_size_mb: 2147483648 is out of range 0..1073741824"},
		{"repeats = 5", "repeats = 0", "run.repeats: 0 is out of range 1..100"},
		{"repeats = 5", "repeats = 101", "run.repeats: 101 is out of range 1..100"},
		{"repeats = 5", "repeats = \"five\"", `run.repeats: "five" is not an integer`},
		{"repeats = 5", "repeats = 5.0", `run.repeats: 5.0 is not an integer`},
		{"repeats = 5", "repeats = 5\ncpus = 0", "run.cpus: 0 is out of range 1..1024"},
		{"repeats = 5", "repeats = 5\ncards = 2", "run.cards: 2 is out of range 0..1"},
		{"name = \"sum\"", "name = \"Sum!\"", `name: "Sum!" is not a kit name ([a-z0-9][a-z0-9._-]{0,63})`},
		{"name = \"sum\"", "name = 3", `name: 3 is not a string`},
		{"command = [\"cc\", \"-O2\", \"-o\", \"sum\", \"sum.c\"]", "command = \"cc -O2\"", `build.command: "cc -O2" is not a list of strings`},
		{"command = [\"cc\", \"-O2\", \"-o\", \"sum\", \"sum.c\"]", "command = []", `build.command: the command is empty`},
		{"command = [\"cc\", \"-O2\", \"-o\", \"sum\", \"sum.c\"]", "command = [\"\", \"x\"]", `build.command[0]: the program is empty`},
		{"command = [\"cc\", \"-O2\", \"-o\", \"sum\", \"sum.c\"]", "command = [\"cc\", 2]", `build.command[1]: 2 is not a string`},
		{"outputs = [\"sum\", \"lib/\"]", "outputs = []", "build.outputs: the list is empty"},
		{"outputs = [\"sum\", \"lib/\"]", "outputs = [\"sum\", \"../sum\"]", `build.outputs[1]: "../sum" leaves the build folder`},
		{"outputs = [\"sum\", \"lib/\"]", "outputs = [\"sum\", \"lib\", \"lib/x\"]", `build.outputs[2]: "lib/x" overlaps build.outputs[1] "lib"`},
		{"outputs = [\"sum\", \"lib/\"]", "outputs = [\".\"]", `build.outputs[0]: "." is the whole of the build folder: name its files or folders`},
		{"outputs = [\"sum\", \"lib/\"]", "outputs = [\"/usr/bin/sum\"]", `build.outputs[0]: "/usr/bin/sum" is absolute: paths are relative to the build folder`},
		{"copy = [\"input.txt\", \"cases/\"]", "copy = [\"input.txt\", \"../secrets\"]", `run.copy[1]: "../secrets" leaves the kit`},
		{"copy = [\"input.txt\", \"cases/\"]", "copy = [\"input.txt\", \"cases/../..\"]", `run.copy[1]: "cases/../.." leaves the kit`},
		{"copy = [\"input.txt\", \"cases/\"]", "copy = [\"./input.txt\", \"cases/\"]", `run.copy[0]: "./input.txt" is not a clean path (write "input.txt")`},
		{"copy = [\"input.txt\", \"cases/\"]", "copy = [\"input.txt\", \"cases//case1.txt\"]", `run.copy[1]: "cases//case1.txt" is not a clean path (write "cases/case1.txt")`},
		{"copy = [\"input.txt\", \"cases/\"]", "copy = [\"input.txt\", \"cases/\", \"nothing.txt\"]", `run.copy[2]: "nothing.txt" is not in the kit`},
		{"copy = [\"input.txt\", \"cases/\"]", "copy = [\"input.txt\", \"cases/\", \"input.txt\"]", `run.copy[2]: "input.txt" overlaps run.copy[0] "input.txt"`},
		{"stdout = \"out/stdout.txt\"", "stdout = \"stdout.txt\"", `run.stdout: "stdout.txt" is not a file under out/`},
		{"stdout = \"out/stdout.txt\"", "stdout = \"out/\"", `run.stdout: "out/" is not a file under out/`},
		{"stdout = \"out/stdout.txt\"", "stdout = \"out/../kit/x\"", `run.stdout: "out/../kit/x" is not a clean path (write "kit/x")`},
		{"stdout = \"out/stdout.txt\"", "stdout = \"out/o\"\nstderr = \"out/o\"", `run.stderr: "out/o" is run.stdout too`},
		{"{build}/sum", "{bulid}/sum", `run.command[0]: "{bulid}/sum": {bulid} is not a placeholder ({build} {kit} {out})`},
		{"{build}/sum", "{build}/summ", `run.command[0]: "{build}/summ" is not among build.outputs`},
		{"{build}/sum", "{build}/../sum", `run.command[0]: "{build}/../sum" is not a clean path inside {build}`},
		{"\"{kit}/input.txt\"", "\"{kit}/expected/case1.txt\"", `run.command[1]: "{kit}/expected/case1.txt" is not among run.copy`},
		{"\"sum.c\"]", "\"{kit}/sum.c\"]", `build.command[4]: "{kit}/sum.c": {kit} has no meaning in build.command (it has no placeholders)`},
		{"\"./check.sh\", \"{out}\"", "\"./check.sh\", \"{build}\"", `check.command[1]: "{build}": {build} has no meaning in check.command (it has {kit} {out})`},
		{"\"./check.sh\"", "\"./missing.sh\"", `check.command[0]: "./missing.sh" is not in the kit`},
		{"\"./check.sh\"", "\"../check.sh\"", `check.command[0]: "../check.sh" leaves the kit`},
		{"\"./check.sh\"", "\"./cases\"", `check.command[0]: "./cases" is not a file`},
		{"\"./check.sh\"", "\"./input.txt\"", `check.command[0]: "./input.txt" is not executable (chmod +x it, or run it with sh)`},
		{"hidden = [\"case3\"]", "hidden = [\"case3\", \"case3\"]", `check.hidden[1]: "case3" is check.hidden[0] too`},
		{"hidden = [\"case3\"]", "hidden = [\"case 3\"]", `check.hidden[0]: "case 3" is not a case name ([A-Za-z0-9._-]{1,128})`},
		{"hidden = [\"case3\"]", "hidden = [\"\"]", `check.hidden[0]: "" is not a case name ([A-Za-z0-9._-]{1,128})`},
		{"hidden = [\"case3\"]", "public = \"cases\"", `check.public: "cases" is not an aggregate's name ([A-Za-z_][A-Za-z0-9_.-]{0,63}, not "cases")`},
		{"repeats = 5", "repeats = 5\nrepeats = 6", `line 19: Key 'run.repeats' has already been defined.`},
		{"[run]", "[run", "line 16: expected '.' or ']' to end table name, but got '\\n' instead"},
	} {
		dir := kitDir(t, edit(t, c.old, c.new))
		_, err := Load(dir)
		want := "kit " + filepath.Join(dir, File) + ": " + c.want
		if err == nil || err.Error() != want {
			t.Errorf("%q -> %q:\n got %v\nwant %s", c.old, c.new, err, want)
		}
	}
}

func TestLoadKitFiles(t *testing.T) {
	for _, c := range []struct {
		name    string
		prepare func(dir string)
		want    string
	}{
		{"absolute symlink", func(dir string) { os.Symlink("/etc/passwd", filepath.Join(dir, "cases/pw")) },
			`cases/pw: symlink to "/etc/passwd" leads out of the kit`},
		{"absolute symlink into the kit", func(dir string) { os.Symlink(filepath.Join(dir, "input.txt"), filepath.Join(dir, "in")) },
			`in: symlink to "` + "%DIR%" + `/input.txt" leads out of the kit`},
		{"relative symlink out", func(dir string) { os.Symlink("../../../../etc", filepath.Join(dir, "expected/etc")) },
			`expected/etc: symlink to "../../../../etc" leads out of the kit`},
		{"dangling symlink", func(dir string) { os.Symlink("nothing", filepath.Join(dir, "expected/n")) },
			`expected/n: symlink to "nothing" points to nothing`},
		{"symlink loop", func(dir string) { os.Symlink("loop", filepath.Join(dir, "loop")) },
			`loop: symlink to "loop" is a loop`},
		{"FIFO", func(dir string) { unix.Mkfifo(filepath.Join(dir, "cases/pipe"), 0o644) },
			`cases/pipe: a FIFO has no place in a kit (only files, folders and symlinks)`},
		{"copied symlink to what is not copied", func(dir string) {
			os.Symlink("../expected/case1.txt", filepath.Join(dir, "cases/answers"))
		}, `run.copy[1]: cases/answers is a symlink to "expected/case1.txt", which run.copy does not copy`},
		{"copy through a symlink", func(dir string) {
			os.Symlink("cases", filepath.Join(dir, "via"))
			b, _ := os.ReadFile(filepath.Join(dir, File))
			os.WriteFile(filepath.Join(dir, File), []byte(strings.Replace(string(b), `"cases/"]`, `"cases/", "via/case1.txt"]`, 1)), 0o644)
		}, `run.copy[2]: "via/case1.txt" goes through a symlink`},
		{"manifest is a symlink", func(dir string) {
			os.Rename(filepath.Join(dir, File), filepath.Join(dir, "real.toml"))
			os.Symlink("real.toml", filepath.Join(dir, File))
		}, `is a symlink`},
	} {
		dir := kitDir(t, goodManifest)
		c.prepare(dir)
		_, err := Load(dir)
		want := "kit " + filepath.Join(dir, File) + ": " + strings.ReplaceAll(c.want, "%DIR%", dir)
		if err == nil || err.Error() != want {
			t.Errorf("%s:\n got %v\nwant %s", c.name, err, want)
		}
	}
}

func TestLoadSymlinksThatStayInside(t *testing.T) {
	dir := kitDir(t, edit(t, `copy = ["input.txt", "cases/"]`, `copy = ["input.txt", "cases/", "list"]`))
	// Inside the kit, and to what run.copy copies: fine.
	os.Symlink("input.txt", filepath.Join(dir, "list"))
	os.Symlink("case1.txt", filepath.Join(dir, "cases/first.txt"))
	os.Symlink("../input.txt", filepath.Join(dir, "cases/list"))
	// Inside the kit but not copied: fine where no run.copy entry carries it.
	os.Symlink("../check.sh", filepath.Join(dir, "expected/check"))
	if _, err := Load(dir); err != nil {
		t.Fatal(err)
	}
	// The copied symlink "list" now leads to what is not copied.
	os.Remove(filepath.Join(dir, "list"))
	os.Symlink("expected/case1.txt", filepath.Join(dir, "list"))
	if _, err := Load(dir); err == nil || !strings.HasSuffix(err.Error(), `run.copy[2]: list is a symlink to "expected/case1.txt", which run.copy does not copy`) {
		t.Fatal(err)
	}
}

func TestLoadMissingFolderOrManifest(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "nope")); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil || err.Error() != "kit "+filepath.Join(dir, File)+": no such file or directory" {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, File), []byte(strings.Repeat("#", MaxManifest+1)), 0o644)
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "is larger than") {
		t.Fatal(err)
	}
}

func TestSectionOfTheWrongType(t *testing.T) {
	m := strings.Replace(goodManifest, "[run.limits]\ntimeout = \"30s\"\ncpu_seconds = 60\n", "", 1)
	m = strings.Replace(m, "repeats = 5", "repeats = 5\nlimits = 3", 1)
	dir := kitDir(t, m)
	if _, err := Load(dir); err == nil || err.Error() != "kit "+filepath.Join(dir, File)+": run.limits: 3 is not a table" {
		t.Fatal(err)
	}
	dir = kitDir(t, "name = \"x\"\n[[build]]\ncommand = [\"make\"]\n")
	if _, err := Load(dir); err == nil || err.Error() != "kit "+filepath.Join(dir, File)+": build: a list is not a table" {
		t.Fatal(err)
	}
}

func TestErrorsAreOneLine(t *testing.T) {
	dir := kitDir(t, "name = \"a\nb\"\n")
	_, err := Load(dir)
	if err == nil || strings.Contains(err.Error(), "\n") {
		t.Fatalf("%q", err)
	}
}

func TestParseWithoutFolder(t *testing.T) {
	k, err := Parse([]byte(goodManifest), "inline")
	if err != nil || k.Dir != "" || k.Name != "sum" {
		t.Fatal(k, err)
	}
	if _, err := Parse([]byte("name = 1"), "inline"); err == nil || err.Error() != "kit inline: name: 1 is not a string" {
		t.Fatal(err)
	}
}
