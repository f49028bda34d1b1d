package rig

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"thermite/controller"
	"thermite/internal/testrig"
)

// sleepers are the pids of role's processes whose command line is
// `sleep 1000`: what an agent left in the background.
func sleepers(r *testrig.Rig, role string) []int {
	var out []int
	for _, pid := range r.Procs(role) {
		cmd, _ := os.ReadFile(filepath.Join("/proc", itoa(pid), "cmdline"))
		if strings.Join(strings.Split(strings.TrimRight(string(cmd), "\x00"), "\x00"), " ") == "sleep 1000" {
			out = append(out, pid)
		}
	}
	return out
}

// alive says whether pid runs role's `sleep 1000`.
func alive(r *testrig.Rig, role string, pid int) bool {
	return slices.Contains(sleepers(r, role), pid)
}

// TestAgentsBackgroundShellEndsWithTheTrial: an agent program that
// starts a shell in the background (`sleep 1000 &`, and one that leaves
// its session with setsid) leaves nothing running past its trial's end.
// As the lane harness (lane-N), whose leftovers live on like a lane
// command's, both sleepers run after the run and are gone at the trial's
// end; as the pi harness (agent-N), both are stopped when the run ends.
// The run returns while its child still holds the output (under its
// --timeout: a run held would be 124).
func TestAgentsBackgroundShellEndsWithTheTrial(t *testing.T) {
	testrig.RequireRoot(t)
	r := testrig.New(t, testrig.Options{})
	project := makeProject(t, r)
	// Each sleeper's pid: the first's from $!, the second's written by
	// its own shell, before it execs its sleep, into the run's HOME; the
	// run ends once it is written.
	const script = `sleep 1000 & echo $!; setsid -f sh -c 'echo $$ > "$HOME/setsid.pid.new"; mv "$HOME/setsid.pid.new" "$HOME/setsid.pid"; exec sleep 1000' </dev/null >/dev/null 2>&1; until [ -s "$HOME/setsid.pid" ]; do sleep 0.05; done`
	for _, c := range []struct {
		harness, role string
		lives         bool // the sleepers outlive the run
	}{{"lane", "lane-1", true}, {"pi", "agent-1", false}} {
		t.Run(c.harness+" harness", func(t *testing.T) {
			info, _ := startTrial(t, r, 1, project)
			home := map[string]string{"lane": filepath.Join(filepath.Dir(info.Workspace), "lane"), "pi": info.AgentDir}[c.harness]
			out, stderr, code := r.Thermite("trial", "agent", info.ID, "--harness", c.harness, "--timeout", "60s", "--", "sh", "-c", script)
			first, err := strconv.Atoi(strings.TrimSpace(out))
			if code != 0 || err != nil {
				t.Fatalf("the agent: exit %d %q %s (124: its background child held the run)", code, out, stderr)
			}
			b, _ := os.ReadFile(filepath.Join(home, "setsid.pid"))
			second, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatalf("the setsid sleeper's pid in %s: %q %v", filepath.Join(home, "setsid.pid"), b, err)
			}
			pids := []int{first, second}
			if c.lives {
				// Its leftovers, like a lane command's, live until the
				// trial's end: both run now (else this proves nothing).
				for _, pid := range pids {
					for deadline := time.Now().Add(20 * time.Second); !alive(r, c.role, pid) && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
					}
					if !alive(r, c.role, pid) {
						t.Fatalf("the agent's background sleeper %d does not run after the lane harness's run", pid)
					}
				}
			} else {
				// agent-N's leftovers are stopped when its run ends.
				for _, pid := range pids {
					if alive(r, c.role, pid) {
						t.Errorf("the agent's background sleeper %d still runs after the pi harness's run ended", pid)
					}
				}
			}
			if _, stderr, code := r.Thermite("trial", "end", info.ID); code != 0 {
				t.Fatalf("trial end: %s", stderr)
			}
			if p := r.Procs(c.role); len(p) != 0 {
				t.Fatalf("%s still runs %s after its trial ended", c.role, cmdlines(p))
			}
		})
	}
}

// waitEndRecorded waits for a trial's trial.end event, recorded once
// its end is done: its processes stopped, its folder retired.
func waitEndRecorded(t *testing.T, r *testrig.Rig, id string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if out, _, _ := r.Thermite("trial", "events", id); strings.Contains(out, "trial.end ") {
			return
		}
	}
	t.Fatalf("trial %s: no trial.end event", id)
}

// TestAgentHomeFilesCountAgainstTheDiskCap: what an agent program writes
// in its home (the lane harness's <trial>/lane, the pi harness's agent
// folder) counts against trial.disk_cap_mb: 3 MiB there ends a trial
// capped at 1 MiB, and the trial's folder is out of every role's reach
// once it ended.
func TestAgentHomeFilesCountAgainstTheDiskCap(t *testing.T) {
	testrig.RequireRoot(t)
	r := testrig.New(t, testrig.Options{Lanes: 2, Extra: "[trial]\ndisk_check = \"300ms\"\ndisk_cap_mb = 1\n"})
	project := makeProject(t, r)
	over := func(s controller.TrialStatus) bool {
		return s.State != "open" && strings.Contains(s.EndReason, "over its disk limit")
	}
	for i, harness := range []string{"lane", "pi"} {
		t.Run(harness+" harness", func(t *testing.T) {
			info, _ := startTrial(t, r, i+1, project)
			out, stderr, code := r.Thermite("trial", "agent", info.ID, "--harness", harness, "--", "sh", "-c", `dd if=/dev/zero of="$HOME/cache.bin" bs=1M count=3 2>/dev/null && echo "$HOME"`)
			if code != 0 {
				t.Fatalf("the agent writes in its home: exit %d %s", code, stderr)
			}
			home := strings.TrimSpace(out)
			if want := map[string]string{"lane": filepath.Join(filepath.Dir(info.Workspace), "lane"), "pi": info.AgentDir}[harness]; home != want {
				t.Errorf("the %s harness's HOME is %s, want %s", harness, home, want)
			}
			waitTrial(t, r, info.ID, "the end for its disk after the agent wrote 3 MiB in its home", over)
			waitEndRecorded(t, r, info.ID)
			role := map[string]string{"lane": "lane-" + itoa(i+1), "pi": "agent-" + itoa(i+1)}[harness]
			if _, _, code := r.RunAs(role, nil, "cat", filepath.Join(home, "cache.bin")); code == 0 {
				t.Errorf("%s reads what its agent wrote in its home after the trial ended", role)
			}
		})
	}
}
