package rig

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"

	"thermite/internal/standin"
	"thermite/internal/testrig"
)

// Codex (@openai/codex) as the lane's user, through `thermite trial agent
// --harness lane`, against the stand-in provider: the rig's home gives it
// its sandbox settings (none of its own: the rig is its sandbox) and
// thermite's MCP tools; the operator gives it the provider with -c.

// codexStandinKey is the variable Codex reads the stand-in's API key from
// (the provider's env_key).
const codexStandinKey = "STANDIN_API_KEY"

// codexExec is `codex exec` pointed at the stand-in: a provider of its own
// with the Responses API, no retries (a refusal shows at once), and the
// prompt. It passes no sandbox or approval flag: the lane's home chooses
// those.
func codexExec(codex string, p *standin.Provider, prompt string, extra ...string) []string {
	argv := []string{codex, "exec", "--skip-git-repo-check", "--color", "never",
		"-c", `model_provider="standin"`,
		"-c", `model="standin-model"`,
		"-c", `model_providers.standin.name="thermite stand-in"`,
		"-c", `model_providers.standin.base_url="` + p.URL + `/v1"`,
		"-c", `model_providers.standin.wire_api="responses"`,
		"-c", `model_providers.standin.env_key="` + codexStandinKey + `"`,
		"-c", `model_providers.standin.request_max_retries=0`,
		"-c", `model_providers.standin.stream_max_retries=0`}
	return append(append(argv, extra...), prompt)
}

// codexEnv is what the operator gives Codex: the stand-in's key and its
// CA, which Codex adds to its roots from CODEX_CA_CERTIFICATE.
func codexEnv(p *standin.Provider) []string {
	return []string{codexStandinKey + "=standin-key", "CODEX_CA_CERTIFICATE=" + p.CAFile}
}

// codexShell is a call of Codex's shell tool.
func codexShell(cmd string) standin.Step {
	return standin.Step{Tool: &standin.Call{Name: "exec_command", Input: map[string]any{"cmd": cmd}}}
}

func TestCodexInALaneDoesAWholeTurn(t *testing.T) {
	codex := agentProgram(t, "codex")
	// The script needs the trial's paths, known once the rig is up; the
	// stand-in asks it only when Codex calls.
	var steps []standin.Step
	script := func(turn standin.Turn) standin.Step { return standin.Steps("codex is done", steps...)(turn) }
	a := newAgentTrial(t, script, testrig.Options{})
	lane := a.r.Role("lane-1")
	forbidden := a.forbidden()
	places := make([]string, 0, len(forbidden))
	for what := range forbidden {
		places = append(places, what)
	}
	sort.Strings(places)
	_, port, _ := net.SplitHostPort(a.provider.Addr)
	steps = []standin.Step{
		codexShell("id -un; pwd"),
		codexShell("echo written by codex > codex-wrote.txt"),
		{Tool: &standin.Call{Name: "mcp__thermite__research_note", Input: map[string]any{"title": "codex", "body": "a note from codex in lane 1"}}},
		// A connection to the stand-in that does not go through the
		// proxy (bash's /dev/tcp ignores HTTPS_PROXY): the lane's
		// Landlock lets it connect to the proxy's port only.
		codexShell("exec 3<>/dev/tcp/127.0.0.1/" + port),
	}
	for _, what := range places {
		steps = append(steps, codexShell("cat "+forbidden[what]))
	}

	stdout, stderr, code := a.agent("lane", codexEnv(a.provider), codexExec(codex, a.provider, "do the scripted things")...)
	if code != 0 || !strings.Contains(stdout, "codex is done") {
		t.Fatalf("codex exec: exit %d, stdout %q\nstderr %s\nthe stand-in saw %v", code, stdout, stderr, a.provider.Paths())
	}
	results := a.provider.Results()
	if len(results) != len(steps) {
		t.Fatalf("Codex sent %d tool results, want %d: %+v\nthe tools offered: %v", len(results), len(steps), results, a.provider.Turns()[0].Tools)
	}

	t.Run("the lane's home chose no sandbox of Codex's and no approvals", func(t *testing.T) {
		if !strings.Contains(stderr, "approval: never\nsandbox: danger-full-access\n") {
			t.Errorf("Codex's header does not show approval never and sandbox danger-full-access:\n%s", stderr)
		}
	})
	t.Run("its shell runs as the lane's user in the workspace", func(t *testing.T) {
		got := results[0]
		if got.IsError || !strings.Contains(got.Output, lane.Name+"\n"+a.trial.Workspace) {
			t.Errorf("id -un; pwd: %+v, want %s then %s", got, lane.Name, a.trial.Workspace)
		}
	})
	t.Run("a file it writes is in the workspace, the lane's", func(t *testing.T) {
		p := filepath.Join(a.trial.Workspace, "codex-wrote.txt")
		data, err := os.ReadFile(p)
		if err != nil || string(data) != "written by codex\n" {
			t.Fatalf("%s: %q %v (tool result %+v)", p, data, err, results[1])
		}
		if st, _ := os.Stat(p); st.Sys().(*syscall.Stat_t).Uid != uint32(lane.UID) {
			t.Errorf("%s is uid %d's, want %s's (%d)", p, st.Sys().(*syscall.Stat_t).Uid, lane.Name, lane.UID)
		}
	})
	t.Run("thermite's MCP tool writes a research note", func(t *testing.T) {
		// Codex shows its model the tool's structured result.
		if got := results[2]; got.Name != "mcp__thermite__research_note" || got.IsError || !strings.Contains(got.Output, `{"path":"notes/`) {
			t.Fatalf("research_note's result: %+v", got)
		}
		notes, _ := filepath.Glob(filepath.Join(a.trial.ResearchDir, "notes", "*"))
		found := false
		for _, n := range notes {
			data, _ := os.ReadFile(n)
			found = found || strings.Contains(string(data), "a note from codex in lane 1")
		}
		if !found {
			t.Errorf("no note in %s holds Codex's text (notes %v)", a.trial.ResearchDir, notes)
		}
	})
	t.Run("a connection past the proxy is refused", func(t *testing.T) {
		if got := results[3]; !got.IsError || !strings.Contains(got.Output, "connect: Permission denied") {
			t.Errorf("a direct connection to %s: %+v, want EACCES", a.provider.Addr, got)
		}
	})
	t.Run("it cannot read the judge's, the other lane's or the agent's places", func(t *testing.T) {
		for i, what := range places {
			if got := results[4+i]; !got.IsError || !refusedResult(got) {
				t.Errorf("cat %s (%s): %+v, want a refusal", forbidden[what], what, got)
			}
		}
	})
	t.Run("it reached the stand-in only through the proxy", func(t *testing.T) {
		turns := len(a.provider.Turns())
		ev := egressEvents(t, a.r, "egress", a.provider.Addr, 1)
		if len(ev) == 0 || !slices.ContainsFunc(ev, func(e egressEvent) bool { return e.Trial == a.trial.ID }) {
			t.Errorf("no egress event for trial %s to %s (%d turns answered): %+v", a.trial.ID, a.provider.Addr, turns, ev)
		}
		// Nor did it try another host: the lane's home turns off the
		// update check, analytics, feedback and the plugins' sync.
		if refused := ledgerKinds(t, a.r, "egress.refused"); len(refused) != 0 {
			t.Errorf("Codex tried hosts the rig does not list: %v", refused)
		}
	})
}

// ledgerKinds are the ledger's records of kind, each as its line.
func ledgerKinds(t *testing.T, r *testrig.Rig, kind string) []string {
	t.Helper()
	out, stderr, code := r.Thermite("ledger", "export")
	if code != 0 {
		t.Fatalf("ledger export: exit %d %s", code, stderr)
	}
	var lines []string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, `"kind":"`+kind+`"`) {
			lines = append(lines, strings.TrimSpace(line))
		}
	}
	return lines
}

// Codex's own sandbox (bubblewrap, for its workspace-write and read-only
// modes) cannot start in a lane; the lane's home turns it off, so the
// operator passes no flag of Codex's for commands to run. This shows both:
// the operator's plain `codex exec` runs a command, and one that asks for
// Codex's sandbox gets every command refused.
func TestCodexRunsCommandsWithoutItsOwnSandbox(t *testing.T) {
	codex := agentProgram(t, "codex")
	a := newAgentTrial(t, standin.Steps("codex is done", codexShell("echo ran > ran.txt; id -un")), testrig.Options{})
	lane := a.r.Role("lane-1")

	stdout, stderr, code := a.agent("lane", codexEnv(a.provider), codexExec(codex, a.provider, "run a command")...)
	res := a.provider.Results()
	if code != 0 || !strings.Contains(stdout, "codex is done") || len(res) != 1 {
		t.Fatalf("codex exec: exit %d, stdout %q, results %+v\nstderr %s", code, stdout, res, stderr)
	}
	if res[0].IsError || !strings.Contains(res[0].Output, lane.Name) {
		t.Errorf("without a sandbox flag the command's result is %+v, want it run as %s", res[0], lane.Name)
	}
	if data, err := os.ReadFile(filepath.Join(a.trial.Workspace, "ran.txt")); err != nil || string(data) != "ran\n" {
		t.Errorf("ran.txt: %q %v", data, err)
	}

	// The same turn with Codex's own sandbox asked for.
	before := len(a.provider.Turns())
	_, stderr, code = a.agent("lane", codexEnv(a.provider), codexExec(codex, a.provider, "run a command", "-s", "workspace-write")...)
	turns := a.provider.Turns()[before:]
	var got []standin.Result
	for _, tr := range turns {
		if len(tr.Results) > len(got) {
			got = tr.Results
		}
	}
	if code != 0 || len(got) != 1 || !got[0].IsError || !strings.Contains(got[0].Output, "error building bubblewrap command: Permission denied") {
		t.Errorf("with -s workspace-write: exit %d, results %+v, want the bubblewrap error\nstderr %s", code, got, stderr)
	}
}
