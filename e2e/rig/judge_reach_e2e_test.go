package rig

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"thermite/controller/ledger"
	"thermite/internal/rpc"
	"thermite/internal/testrig"
)

// Attacks on the judge from issue 12: a build whose outputs are not plain
// files, and a lane reaching a timed run's folder or learning its path.

// storeEntries lists the store's entries (as root).
func storeEntries(t *testing.T, r *testrig.Rig) []string {
	t.Helper()
	ents, err := os.ReadDir(r.Cfg.StoreDir())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// refusedBuild imports a kit whose build runs script, builds it and wants
// the build refused with every one of want in its error, and nothing new
// in the store.
func refusedBuild(t *testing.T, r *testrig.Rig, name, script string, outputs []string, want ...string) {
	t.Helper()
	outs, _ := json.Marshal(outputs)
	importKit(t, r, name, fmt.Sprintf(`name = %q
[build]
command = ["sh", "-c", %q]
outputs = %s
[run]
command = ["true"]
repeats = 1
[check]
command = ["sh", "-c", "echo '{\"score\": 1}'"]
`, name, script, outs), nil)
	proj := filepath.Join(r.Dir, "p-"+name)
	os.MkdirAll(proj, 0o755)
	before := storeEntries(t, r)
	_, stderr, code := r.Thermite("judge", "build", "--kit", name, "--project", proj)
	if code == 0 {
		t.Fatalf("the build was stored; want it refused naming %q", want)
	}
	for _, w := range want {
		if !strings.Contains(stderr, w) {
			t.Errorf("the refusal %q does not name %q", strings.TrimSpace(stderr), w)
		}
	}
	if after := storeEntries(t, r); len(after) != len(before) {
		t.Errorf("a refused build left something in the store: %v, was %v", after, before)
	}
	if ents, _ := os.ReadDir(filepath.Join(r.Cfg.ScratchDir(), "builds")); len(ents) != 0 {
		t.Errorf("a refused build left %d build folders", len(ents))
	}
}

// TestBuildOutputSymlinkRefused: a build that makes bin/prog a symlink
// into a place it still writes (a lane's workspace, say) would run code
// nobody hashed; the build is refused, naming the path, and nothing is
// stored.
func TestBuildOutputSymlinkRefused(t *testing.T) {
	r := newRig(t)
	target := filepath.Join(r.Dir, "workspace-prog")
	os.WriteFile(target, []byte("#!/bin/sh\necho 1\n"), 0o755)
	refusedBuild(t, r, "linked", "mkdir bin && echo '#!/bin/sh' > bin/real && ln -s "+target+" bin/prog", []string{"bin"}, "bin/prog", "symlink")
	refusedBuild(t, r, "linkedtop", "ln -s "+target+" prog", []string{"prog"}, "prog", "symlink")
	// A symlink that stays inside the build is refused too: what runs is
	// a file of its own, hashed as content.
	refusedBuild(t, r, "linkedin", "mkdir bin && echo '#!/bin/sh' > bin/real && ln -s real bin/prog", []string{"bin"}, "bin/prog", "symlink")
}

// TestBuildOutputHardLinkRefused: a stored file must be the build's own,
// with one link, in a folder output or as an output itself.
func TestBuildOutputHardLinkRefused(t *testing.T) {
	r := newRig(t)
	refusedBuild(t, r, "hard", "mkdir bin && echo x > a && ln a bin/prog", []string{"bin"}, "bin/prog", "links")
	refusedBuild(t, r, "hardtop", "echo x > a && ln a prog", []string{"prog"}, "prog", "links")
}

// TestBuildOutputFIFORefused: a FIFO among the outputs would stall the
// hash; the builder makes none (its rule set grants no MAKE_FIFO), so the
// build that tries fails at its mkfifo, naming the path, and nothing is
// stored. (The outputs' own check refuses a FIFO by name as well:
// hashtree's tests.)
func TestBuildOutputFIFORefused(t *testing.T) {
	r := newRig(t)
	refusedBuild(t, r, "fifo", "mkdir bin && echo x > bin/prog && mkfifo bin/pipe", []string{"bin"}, "bin/pipe", "Permission denied")
}

// peekKit is a kit whose candidate copies its kit file to out/ and waits,
// and whose check waits in awk, naming out/answer.txt on its command
// line, as the example kit's does: time for a lane to look around.
func peekKit(t *testing.T, r *testrig.Rig) ledger.Build {
	t.Helper()
	importKit(t, r, "peek", `name = "peek"
[build]
command = ["sh", "-c", "cp prog.sh prog && chmod 755 prog"]
outputs = ["prog"]
[run]
command = ["{build}/prog"]
copy = ["input.txt"]
repeats = 1
[check]
command = ["sh", "check.sh"]
`, map[string]string{
		"input.txt": "the hidden case\n",
		"expected":  "the hidden case\n",
		"check.sh": `awk 'BEGIN { system("sleep 5") }
FILENAME == ARGV[1] { want = want $0 "\n"; next }
{ got = got $0 "\n" }
END { printf "{\"score\": %d}\n", (got != "" && got == want) }' expected "$THERMITE_OUT/answer.txt"
`,
	})
	proj := filepath.Join(r.Dir, "p-peek")
	os.MkdirAll(proj, 0o755)
	os.WriteFile(filepath.Join(proj, "prog.sh"), []byte("#!/bin/sh\ncat kit/input.txt > out/answer.txt\nsleep 5\n"), 0o755)
	return judgeBuild(t, r, "peek", proj)
}

// startTime starts `judge time` and returns the channel its run arrives on.
func startTime(t *testing.T, r *testrig.Rig, build, kitName string) <-chan ledger.TimedRun {
	done := make(chan ledger.TimedRun, 1)
	go func() {
		out, stderr, code := r.Thermite("judge", "time", build, "--kit", kitName, "--json")
		var tr ledger.TimedRun
		if err := json.Unmarshal([]byte(out), &tr); err != nil || code != 0 {
			tr.Status, tr.Error = "judge time failed", fmt.Sprintf("exit %d: %s", code, stderr)
		}
		done <- tr
	}()
	return done
}

// waitFor polls cond until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return false
}

// TestRunFolderUnreadableByLaneDuringTimedRun: a lane that knows the exact
// path of a timed run's folder (as /proc once told it) opens neither the
// folder, nor its kit copy, nor its out/, nor its build link, while the
// candidate runs and while the check runs; the timing user still reads its
// kit copy, and the run scores.
func TestRunFolderUnreadableByLaneDuringTimedRun(t *testing.T) {
	r := newRig(t)
	b := peekKit(t, r)
	runs := filepath.Join(r.Cfg.ScratchDir(), "runs")
	done := startTime(t, r, b.ID, "peek")
	var runDir string
	if !waitFor(20*time.Second, func() bool {
		ents, _ := os.ReadDir(runs)
		if len(ents) == 1 {
			runDir = filepath.Join(runs, ents[0].Name())
		}
		return runDir != "" && len(r.Procs("run")) > 0
	}) {
		t.Fatalf("no timed run started: %+v", <-done)
	}
	attempts := func(phase string) {
		for _, a := range []struct{ role, op, path string }{
			{"lane-1", "list", runDir},
			{"lane-1", "read", filepath.Join(runDir, "kit", "input.txt")},
			{"lane-1", "list", filepath.Join(runDir, "kit")},
			{"lane-1", "list", filepath.Join(runDir, "out")},
			{"lane-1", "readlink", filepath.Join(runDir, "build")},
			{"lane-1", "read", filepath.Join(runDir, "build", "prog")},
			{"builder", "read", filepath.Join(runDir, "kit", "input.txt")},
			{"builder", "readlink", filepath.Join(runDir, "build")},
		} {
			if got := r.Probe(a.role, a.op, a.path); got != "EACCES" {
				t.Errorf("%s: %s %s %s: %s, want EACCES", phase, a.role, a.op, a.path, got)
			}
		}
	}
	attempts("while the candidate runs")
	// The candidate is done and the check (which waits) runs.
	if !waitFor(20*time.Second, func() bool { return len(r.Procs("run")) == 0 }) {
		t.Fatal("the candidate did not end")
	}
	if _, err := os.Lstat(runDir); err != nil {
		t.Fatalf("the run folder went before the check ran: %v", err)
	}
	attempts("while the check runs")
	tr := <-done
	if tr.Status != "scored" || tr.PublicScore == nil || *tr.PublicScore != 1 {
		t.Fatalf("the timing user did not read its kit copy: %+v", tr)
	}
}

// TestCheckArgvNamesNoRunPath: a lane reading every /proc/PID/cmdline and
// /proc/PID/environ it can, all through a timed run and its check, sees
// neither the run's folder nor the stored build's path, and does see the
// check's awk (so it looked at the right moment).
func TestCheckArgvNamesNoRunPath(t *testing.T) {
	r := newRig(t)
	if v := r.Status().ProcView; !strings.HasPrefix(v, "none") {
		t.Skipf("/proc hides other users' processes from every role (%s): the scanner has no process of the check's to read", v)
	}
	b := peekKit(t, r)
	// The scanner's own command line must not match what it looks for, so
	// the patterns are put together from pieces at run time.
	state, store := filepath.Dir(r.Cfg.ScratchDir()), strings.TrimPrefix(r.Cfg.StoreDir(), filepath.Dir(r.Cfg.ScratchDir()))
	scan := fmt.Sprintf(`a=answer; a="$a.txt"; ru=/run; ru="${ru}s/"; s1=%q; s2=%q; st="$s1$s2"
end=$(( $(date +%%s) + 120 ))
while [ -e "$HOME/scan-on" ] && [ "$(date +%%s)" -lt "$end" ]; do
	for p in /proc/[0-9]*; do
		c=$(tr '\0\n' '  ' < "$p/cmdline" 2>/dev/null)
		case $c in *"$a"*|*"$ru"*|*"$st"*) echo "cmdline: $c" ;; esac
		e=$(tr '\0' '\n' < "$p/environ" 2>/dev/null | grep -F -e "$ru" -e "$st" -e THERMITE_)
		[ -n "$e" ] && echo "environ: $e"
	done
done | sort -u
`, state, store)
	// The scanner looks until the run is over: the test removes this file
	// from the lane's HOME then, however long a loaded machine takes.
	on := filepath.Join(r.Cfg.ScratchDir(), "home", "lane-1", "scan-on")
	if err := os.WriteFile(on, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	seen := make(chan string, 1)
	go func() {
		out, stderr, code := r.RunAs("lane-1", nil, "sh", "-c", scan)
		if code != 0 {
			out += fmt.Sprintf("\nscanner: exit %d: %s", code, stderr)
		}
		seen <- out
	}()
	time.Sleep(time.Second)
	tr := <-startTime(t, r, b.ID, "peek")
	os.Remove(on)
	out := <-seen
	if tr.Status != "scored" || tr.PublicScore == nil || *tr.PublicScore != 1 {
		t.Fatalf("run: %+v", tr)
	}
	if !strings.Contains(out, "answer.txt") {
		t.Fatalf("the scanner never saw the check's awk, so it proves nothing:\n%s", out)
	}
	for _, bad := range []string{filepath.Join(r.Cfg.ScratchDir(), "runs"), tr.ID, b.StorePath} {
		if strings.Contains(out, bad) {
			t.Errorf("a lane read %q in another role's process:\n%s", bad, out)
		}
	}
}

// TestRunFolderGroupIsNarrow: the broker sets a timing user's group on a
// folder directly in scratch/runs that the controller owns, and nothing
// else: not for another role, not deeper or elsewhere, not on a folder a
// role owns, not through a symlink.
func TestRunFolderGroupIsNarrow(t *testing.T) {
	r := newRig(t)
	runs := filepath.Join(r.Cfg.ScratchDir(), "runs")
	ctl := r.Role("thermite")
	mk := func(p string, uid int) string {
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		os.Chown(p, uid, uid)
		t.Cleanup(func() { os.RemoveAll(p) })
		return p
	}
	good := mk(filepath.Join(runs, "rgood"), ctl.UID)
	deeper := mk(filepath.Join(good, "kit"), ctl.UID)
	lanes := mk(filepath.Join(runs, "rlane"), r.Role("lane-1").UID)
	link := filepath.Join(runs, "rlink")
	os.Symlink(good, link)
	t.Cleanup(func() { os.Remove(link) })
	ask := func(path, role string) error {
		_, err := rpc.Call(r.Cfg.BrokerSocket(), &rpc.Request{Op: rpc.OpRunFolder, RunFolder: &rpc.RunFolderRequest{Path: path, Role: role}})
		return err
	}
	for _, c := range []struct{ path, role, want string }{
		{good, "lane-1", "not a timing user"},
		{good, "builder", "not a timing user"},
		{deeper, "run", "not a folder directly in"},
		{r.Cfg.StoreDir(), "run", "not a folder directly in"},
		{runs, "run", "not a folder directly in"},
		{lanes, "run", "not the controller's"},
		{link, "run", "rlink"},
	} {
		if err := ask(c.path, c.role); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("run_folder %s for %s: %v, want an error with %q", c.path, c.role, err, c.want)
		}
	}
	var st syscallStat
	statOf(t, good, &st)
	if int(st.Gid) != ctl.GID || st.Mode&0o777 != 0o700 {
		t.Fatalf("a refused request changed %s: gid %d mode %o", good, st.Gid, st.Mode&0o777)
	}
	if err := ask(good, "run"); err != nil {
		t.Fatal(err)
	}
	statOf(t, good, &st)
	if int(st.Uid) != ctl.UID || int(st.Gid) != r.Role("run").GID || st.Mode&0o7777 != 0o750 {
		t.Fatalf("%s: uid %d gid %d mode %o, want the controller's, run's group, 0750", good, st.Uid, st.Gid, st.Mode&0o7777)
	}
	statOf(t, deeper, &st)
	if int(st.Gid) != ctl.GID {
		t.Fatalf("what the folder holds changed group: %d", st.Gid)
	}
}

// TestBuildOutputSparseRefused: a sparse file takes no blocks, so the
// build's disk guard (which counts blocks) lets `truncate -s 1T` pass;
// stored, it would be copied and hashed as a terabyte. The build is
// refused naming the file, its apparent and allocated sizes and
// judge.build_disk_mb, and nothing is stored; so is a set of outputs each
// under the limit that together pass it. A sparse output within the limit
// is stored, its holes kept holes.
func TestBuildOutputSparseRefused(t *testing.T) {
	r := testrig.New(t, testrig.Options{Extra: "[judge]\nbuild_disk_mb = 256\n"})
	refusedBuild(t, r, "sparse", "truncate -s 1T prog", []string{"prog"},
		"prog is 1099511627776 bytes", "allocated", "over judge.build_disk_mb = 256")
	refusedBuild(t, r, "sparsein", "mkdir bin && echo x > bin/prog && truncate -s 1T bin/big", []string{"bin"},
		"bin/big is 1099511627776 bytes", "over judge.build_disk_mb = 256")
	refusedBuild(t, r, "sparsesum", "truncate -s 200M a && truncate -s 200M b", []string{"a", "b"},
		"b is 209715200 bytes", "come to 419430400 bytes", "over judge.build_disk_mb = 256")
	importKit(t, r, "sparseok", `name = "sparseok"
[build]
command = ["sh", "-c", "truncate -s 200M prog && printf data | dd of=prog bs=1 seek=100000000 conv=notrunc 2>/dev/null"]
outputs = ["prog"]
[run]
command = ["true"]
repeats = 1
[check]
command = ["sh", "-c", "echo '{\"score\": 1}'"]
`, nil)
	proj := filepath.Join(r.Dir, "p-sparseok")
	os.MkdirAll(proj, 0o755)
	b := judgeBuild(t, r, "sparseok", proj)
	var st syscallStat
	statOf(t, filepath.Join(b.StorePath, "prog"), &st)
	if st.Size != 200<<20 || st.Blocks*512 > 1<<20 {
		t.Errorf("the stored sparse output: %d bytes, %d allocated; want 200 MiB with its holes kept", st.Size, st.Blocks*512)
	}
}

// TestTimedRunSparseOutputRefused: the same for a timed run's out/, which
// the run's guard measures by blocks and the kit's check reads by path: a
// 1 TiB sparse file there fails the run naming it and judge.run_out_mb,
// and the check never reads it.
func TestTimedRunSparseOutputRefused(t *testing.T) {
	r := testrig.New(t, testrig.Options{Extra: "[judge]\nrun_out_mb = 16\n"})
	importKit(t, r, "sparserun", `name = "sparserun"
[build]
command = ["sh", "-c", "echo x > x"]
outputs = ["x"]
[run]
command = ["sh", "-c", "echo 1 > out/answer && truncate -s 1T out/big"]
repeats = 1
[check]
command = ["sh", "-c", "wc -c \"$THERMITE_OUT/big\" >&2; echo '{\"score\": 1}'"]
`, nil)
	proj := filepath.Join(r.Dir, "p")
	os.MkdirAll(proj, 0o755)
	b := judgeBuild(t, r, "sparserun", proj)
	out, stderr, code := r.Thermite("judge", "time", b.ID, "--kit", "sparserun", "--json")
	if code == 0 || !strings.Contains(stderr, "big is 1099511627776 bytes") || !strings.Contains(stderr, "over judge.run_out_mb = 16") {
		t.Fatalf("a run leaving a 1 TiB sparse file in out/: exit %d %q %q", code, out, stderr)
	}
}
