package rig

import (
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"thermite/controller"
	"thermite/internal/standin"
	"thermite/internal/testrig"
)

// The shared set-up of the agent programs' end-to-end tests (Pi, Claude
// Code, Codex, OpenCode, one file each): the program as `make agents`
// installed it, a rig whose agent.egress lists a stand-in provider, and
// the places no agent program may reach.

// agentsDir is where `make agents` installs the agent programs.
func agentsDir() string { return cmp.Or(os.Getenv("THERMITE_AGENTS"), "/opt/thermite/agents") }

// agentProgram is the path of an installed agent program's command
// (node_modules/.bin/NAME), or skips the test saying what it needs.
func agentProgram(t *testing.T, name string) string {
	t.Helper()
	testrig.RequireRoot(t)
	p := filepath.Join(agentsDir(), "node_modules", ".bin", name)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("needs the agent program %s: run `make agents` (installs Pi, Claude Code, Codex and OpenCode into %s)", name, agentsDir())
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("needs node (Debian's nodejs) for the agent programs: run `make agents`")
	}
	if have, min := nodeVersion(t), nodeMinimum(t); versionLess(have, min) {
		t.Skipf("needs Node.js %s or newer for the agent programs (scripts/agents.sh's node_min, what agents/package-lock.json needs); node is %s", min, have)
	}
	return p
}

// nodeMinimum is the oldest Node.js scripts/agents.sh installs the agent
// programs for (its node_min).
func nodeMinimum(t *testing.T) string {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	script, err := os.ReadFile(filepath.Join(filepath.Dir(here), "..", "..", "scripts", "agents.sh"))
	if err != nil {
		t.Fatalf("scripts/agents.sh: %v", err)
	}
	m := regexp.MustCompile(`(?m)^node_min=([0-9.]+)$`).FindSubmatch(script)
	if m == nil {
		t.Fatal("scripts/agents.sh has no node_min line")
	}
	return string(m[1])
}

// nodeVersion is `node --version` without its v.
func nodeVersion(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("node", "--version").Output()
	if err != nil {
		t.Skipf("needs node for the agent programs, which does not run: %v", err)
	}
	return strings.TrimPrefix(strings.TrimSpace(string(out)), "v")
}

// versionLess compares two dotted versions number by number.
func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) || i < len(bs); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x < y
		}
	}
	return false
}

// agentTrial is a rig whose agent.egress lists one stand-in provider, with
// a trial open on lane 1 (the program's) and one on lane 2 (the other
// lane whose workspace it must not reach).
type agentTrial struct {
	r        *testrig.Rig
	provider *standin.Provider
	trial    controller.TrialInfo
	other    controller.TrialInfo
}

// newAgentTrial starts the stand-in with script, the rig, and both trials.
func newAgentTrial(t *testing.T, script standin.Script, o testrig.Options) *agentTrial {
	t.Helper()
	testrig.RequireRoot(t)
	dir := t.TempDir()
	// The lane's user reads the CA file: its folder and the test's
	// folder above it (0700 as t.TempDir makes them) open to all.
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Dir(dir), 0o755)
	p := standin.Start(t, dir, script)
	o.Extra += "\n[agent]\negress = [\"" + p.Addr + "\"]\n"
	r := testrig.New(t, o)
	project := makeProject(t, r)
	a := &agentTrial{r: r, provider: p}
	a.trial, _ = startTrial(t, r, 1, project)
	a.other, _ = startTrial(t, r, 2, project)
	os.WriteFile(filepath.Join(a.other.Workspace, "secret-of-lane-2"), []byte("lane 2's own\n"), 0o600)
	return a
}

// agentTimeout bounds every agent program's run in these tests (trial
// agent's --timeout): a program that hangs fails its test with exit 124
// rather than stalling it for agent.wall_timeout's hours. A whole scripted
// turn takes 5 to 30 s; on a loaded machine Pi alone took 65 s to start.
const agentTimeout = "300s"

// agent runs the program through `thermite trial agent` with harness
// (pi or lane), as an operator does, under agentTimeout.
func (a *agentTrial) agent(harness string, env []string, argv ...string) (stdout, stderr string, code int) {
	args := []string{"trial", "agent", a.trial.ID, "--harness", harness, "--timeout", agentTimeout}
	for _, e := range env {
		args = append(args, "--env", e)
	}
	return a.r.Thermite(append(append(args, "--"), argv...)...)
}

// reachedOnlyThroughItsProxy checks that every connection the stand-in
// saw is a tunnel the egress proxy recorded for this trial, via the
// role the program ran as (its own proxy), and that the proxy refused
// nothing of the trial: the program tried no host beyond its provider
// (update checks, telemetry, catalogues).
func (a *agentTrial) reachedOnlyThroughItsProxy(t *testing.T, via string) {
	t.Helper()
	tunnels := egressEvents(t, a.r, "egress", a.provider.Addr, a.provider.Clients())
	for _, e := range tunnels {
		if e.Trial != a.trial.ID || e.Data.Via != via {
			t.Errorf("tunnel %+v, want trial %s via %s", e, a.trial.ID, via)
		}
	}
	if len(tunnels) == 0 || a.provider.Clients() > len(tunnels) {
		t.Errorf("the stand-in saw %d connections, the proxy made %d tunnels to it: one came another way", a.provider.Clients(), len(tunnels))
	}
	if refused := trialEgressRefused(t, a.r, a.trial.ID); len(refused) != 0 {
		t.Errorf("the proxy refused %+v: the program tried more than its provider", refused)
	}
}

// endsClean ends the trial and checks that nothing of its lane's user or
// its agent's runs after: the program's own children (the MCP server
// `thermite trial-client mcp`, shells, node and bun workers) included.
func (a *agentTrial) endsClean(t *testing.T) {
	t.Helper()
	for _, role := range []string{"lane-1", "agent-1"} {
		if left := a.r.Procs(role); len(left) > 0 {
			t.Logf("%s runs %s before the trial's end", role, cmdlines(left))
		}
	}
	if _, stderr, code := a.r.Thermite("trial", "end", a.trial.ID); code != 0 {
		t.Fatalf("trial end: exit %d %s", code, stderr)
	}
	for _, role := range []string{"lane-1", "agent-1"} {
		if left := a.r.Procs(role); len(left) > 0 {
			t.Errorf("%s still runs %s after its trial ended", role, cmdlines(left))
		}
	}
}

// cmdlines are processes' command lines, for a message.
func cmdlines(pids []int) string {
	var out []string
	for _, pid := range pids {
		cmd, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		out = append(out, fmt.Sprintf("%d %q", pid, strings.ReplaceAll(strings.TrimRight(string(cmd), "\x00"), "\x00", " ")))
	}
	return strings.Join(out, ", ")
}

// forbidden are the places no agent program may read, by what they are:
// the judge's state (the ledger), another lane's workspace, and the
// agent's token (agent-N's, which the lane's user must not read).
func (a *agentTrial) forbidden() map[string]string {
	return map[string]string{
		"the judge's ledger":       filepath.Join(a.r.Cfg.ControllerDir(), "ledger.db"),
		"another lane's workspace": filepath.Join(a.other.Workspace, "secret-of-lane-2"),
		"the agent's token":        a.trial.TokenFile,
	}
}

// refusedResult reports whether the program showed its model a refusal
// for a tool call: the result names EACCES's text or the errno.
func refusedResult(res standin.Result) bool {
	o := strings.ToLower(res.Output)
	return strings.Contains(o, "permission denied") || strings.Contains(o, "eacces") || strings.Contains(o, "operation not permitted")
}
