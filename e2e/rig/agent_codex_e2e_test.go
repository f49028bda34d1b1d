package rig

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
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

// codexExec is `codex exec` pointed at a provider of its own at url (the
// stand-in's, or one the rig does not list) with the Responses API, no
// retries (a refusal shows at once), extra flags, and the prompt. It
// passes no sandbox or approval flag: the lane's home chooses those.
func codexExec(codex, url, prompt string, extra ...string) []string {
	argv := []string{codex, "exec", "--skip-git-repo-check", "--color", "never",
		"-c", `model_provider="standin"`,
		"-c", `model="standin-model"`,
		"-c", `model_providers.standin.name="thermite stand-in"`,
		"-c", `model_providers.standin.base_url="` + url + `/v1"`,
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

// codexItem is a tool call as Codex itself reported it (`codex exec
// --json`, an item.completed event): an MCP tool's or a command's, its
// status "completed" or "failed", a command's exit code.
type codexItem struct {
	Type     string `json:"type"`
	Tool     string `json:"tool"`
	Command  string `json:"command"`
	ExitCode *int   `json:"exit_code"`
	Status   string `json:"status"`
	Text     string `json:"text"`
}

// codexReport reads `codex exec --json`'s events: the tool calls Codex
// made, in order, and its final message.
func codexReport(t *testing.T, stdout string) (tools []codexItem, final string) {
	t.Helper()
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var e struct {
			Type string    `json:"type"`
			Item codexItem `json:"item"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("codex exec --json wrote %q: %v", line, err)
		}
		if e.Type != "item.completed" {
			continue
		}
		switch e.Item.Type {
		case "mcp_tool_call", "command_execution":
			tools = append(tools, e.Item)
		case "agent_message":
			final = e.Item.Text
		}
	}
	return tools, final
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
	// The tool calls in the order the script makes them.
	const (
		whoAndWhere = iota
		writeFile
		note
		mcpEscape
		direct
		forbiddenReads
	)
	steps = []standin.Step{
		codexShell("id -un; pwd"),
		codexShell("echo written by codex > codex-wrote.txt"),
		{Tool: &standin.Call{Name: "mcp__thermite__research_note", Input: map[string]any{"title": "codex", "body": "a note from codex in lane 1"}}},
		// thermite's own refusal, through its MCP server.
		{Tool: &standin.Call{Name: "mcp__thermite__fs_read", Input: map[string]any{"path": "../agent/token"}}},
		// A connection to the stand-in that does not go through the
		// proxy (bash's /dev/tcp ignores HTTPS_PROXY): the lane's
		// Landlock lets it connect to the proxy's port only.
		codexShell("exec 3<>/dev/tcp/127.0.0.1/" + port),
	}
	for _, what := range places {
		steps = append(steps, codexShell("cat "+forbidden[what]))
	}

	stdout, stderr, code := a.agent("lane", codexEnv(a.provider), codexExec(codex, a.provider.URL, "do the scripted things", "--json")...)
	reported, final := codexReport(t, stdout)
	if code != 0 || final != "codex is done" {
		t.Fatalf("codex exec: exit %d, final message %q, stdout %q\nstderr %s\nthe stand-in saw %v", code, final, stdout, stderr, a.provider.Paths())
	}
	results := a.provider.Results()
	if len(results) != len(steps) || len(reported) != len(steps) {
		t.Fatalf("Codex sent %d tool results and reported %d tool calls, want %d: %+v %+v\nthe tools offered: %v", len(results), len(reported), len(steps), results, reported, a.provider.Turns()[0].Tools)
	}
	for i, r := range results {
		t.Logf("result %d %s (is_error %v, reported %v; Codex's status %s): %q", i, r.Name, r.IsError, r.Reported, reported[i].Status, r.Output)
	}

	t.Run("each refusal is a tool error as Codex reported it, and nothing else is", func(t *testing.T) {
		for i, r := range results {
			refused := i >= mcpEscape
			if want := map[bool]string{true: "failed", false: "completed"}[refused]; reported[i].Status != want {
				t.Errorf("tool call %d (%s): Codex reported %q, want %q", i, r.Name, reported[i].Status, want)
			}
			// The model sees a command's failure as its exit status;
			// an MCP tool's error is in its text alone.
			if strings.HasPrefix(r.Name, "mcp__") {
				if r.Reported {
					t.Errorf("tool call %d (%s): the stand-in took %q for an error report", i, r.Name, r.Output)
				}
			} else if !r.Reported || r.IsError != refused {
				t.Errorf("tool call %d (%s): reported %v, error %v, want the exit status reported and error %v", i, r.Name, r.Reported, r.IsError, refused)
			}
		}
	})
	t.Run("its shell runs as the lane's user in the workspace", func(t *testing.T) {
		got := results[whoAndWhere]
		if got.IsError || !strings.Contains(got.Output, lane.Name+"\n"+a.trial.Workspace) {
			t.Errorf("id -un; pwd: %+v, want %s then %s", got, lane.Name, a.trial.Workspace)
		}
	})
	t.Run("a file it writes is in the workspace, the lane's", func(t *testing.T) {
		p := filepath.Join(a.trial.Workspace, "codex-wrote.txt")
		data, err := os.ReadFile(p)
		if err != nil || string(data) != "written by codex\n" {
			t.Fatalf("%s: %q %v (tool result %+v)", p, data, err, results[writeFile])
		}
		if st, _ := os.Stat(p); st.Sys().(*syscall.Stat_t).Uid != uint32(lane.UID) {
			t.Errorf("%s is uid %d's, want %s's (%d)", p, st.Sys().(*syscall.Stat_t).Uid, lane.Name, lane.UID)
		}
	})
	t.Run("thermite's MCP tool writes a research note", func(t *testing.T) {
		// Codex shows its model the tool's structured result.
		if got := results[note]; got.Name != "mcp__thermite__research_note" || !strings.Contains(got.Output, `{"path":"notes/`) {
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
	t.Run("thermite's MCP tool refuses what leaves the workspace", func(t *testing.T) {
		if got := results[mcpEscape]; !strings.Contains(got.Output, "leaves the workspace (escape, 403)") {
			t.Errorf("fs_read ../agent/token: %+v, want the API's refusal", got)
		}
	})
	t.Run("a connection past the proxy is refused", func(t *testing.T) {
		if got := results[direct]; !strings.Contains(got.Output, "connect: Permission denied") {
			t.Errorf("a direct connection to %s: %+v, want EACCES", a.provider.Addr, got)
		}
	})
	t.Run("it cannot read the judge's, the other lane's or the agent's places", func(t *testing.T) {
		for i, what := range places {
			if got := results[forbiddenReads+i]; !refusedResult(got) {
				t.Errorf("cat %s (%s): %+v, want a refusal", forbidden[what], what, got)
			}
		}
	})
	t.Run("it reached the stand-in only through the lane's proxy", func(t *testing.T) {
		// Nor did it try another host: the lane's home turns off the
		// update check, analytics, feedback and the plugins' sync.
		a.reachedOnlyThroughItsProxy(t, lane.Name)
	})
	t.Run("the trial ends clean", func(t *testing.T) { a.endsClean(t) })
}

// TestCodexShowsAnUnlistedProviderAsTheProxysRefusal: a provider the rig
// does not list fails Codex's run at once: the proxy refuses the tunnel,
// Codex says its connection failed and exits 1 (the lane's config.toml
// turns off its unbounded retries, with which it waits for network until
// the agent's wall timeout, 124 here), and the refusal is the trial's
// event; nothing reaches the listed stand-in.
func TestCodexShowsAnUnlistedProviderAsTheProxysRefusal(t *testing.T) {
	codex := agentProgram(t, "codex")
	a := newAgentTrial(t, standin.Steps("never asked"), testrig.Options{})
	// Port 9 (discard) of 127.0.0.2: in no rig's agent.egress.
	const unlisted = "127.0.0.2:9"
	stdout, stderr, code := a.agent("lane", codexEnv(a.provider), codexExec(codex, "https://"+unlisted, "hello")...)
	if code != 1 || !strings.Contains(stderr, "ERROR: Connection failed: error sending request") {
		t.Errorf("codex exec to an unlisted provider: exit %d, %q %q; want 1 and its connection's failure", code, stdout, stderr)
	}
	if n := len(a.provider.Paths()); n != 0 {
		t.Errorf("the listed stand-in saw %d requests, want none", n)
	}
	ev := egressEvents(t, a.r, "egress.refused", unlisted, 1)
	if len(ev) == 0 || ev[0].Trial != a.trial.ID || ev[0].Data.Via != "lane-1" || ev[0].Data.Why != "not in agent.egress" {
		t.Errorf("egress.refused events for %s: %+v, want the trial %s's via lane-1, not in agent.egress", unlisted, ev, a.trial.ID)
	}
}

// codexVendor is where Codex's native binary and its packaged bubblewrap
// lie in the installed package.
func codexVendor() string {
	return filepath.Join(agentsDir(), "node_modules", "@openai", "codex-linux-x64", "vendor", "x86_64-unknown-linux-musl")
}

// TestCodexAskedForItsOwnSandboxRefusedInOneLine: the lane's home turns
// Codex's own sandbox off (the rig is its sandbox), so the operator's plain
// `codex exec` runs commands as the lane. A command line that asks for
// Codex's sandbox (-s workspace-write, --full-auto) is refused before
// Codex runs, with one line saying why, where every command of the turn
// would fail with bubblewrap's EACCES. Why it cannot run, measured as the
// lane: Codex's sandbox fails to build its bubblewrap command; its
// packaged bubblewrap cannot make the user namespace it needs (the
// filter refuses every role one); Codex's legacy Landlock mode refuses
// every filesystem-restricted policy itself.
func TestCodexAskedForItsOwnSandboxRefusedInOneLine(t *testing.T) {
	codex := agentProgram(t, "codex")
	a := newAgentTrial(t, standin.Steps("codex is done", codexShell("echo ran > ran.txt; id -un")), testrig.Options{})
	lane := a.r.Role("lane-1")

	stdout, stderr, code := a.agent("lane", codexEnv(a.provider), codexExec(codex, a.provider.URL, "run a command")...)
	res := a.provider.Results()
	if code != 0 || !strings.Contains(stdout, "codex is done") || len(res) != 1 {
		t.Fatalf("codex exec: exit %d, stdout %q, results %+v\nstderr %s", code, stdout, res, stderr)
	}
	if !strings.Contains(stderr, "approval: never\nsandbox: danger-full-access\n") {
		t.Errorf("Codex's header does not show approval never and sandbox danger-full-access, the lane's config.toml's:\n%s", stderr)
	}
	if res[0].IsError || !strings.Contains(res[0].Output, lane.Name) {
		t.Errorf("without a sandbox flag the command's result is %+v, want it run as %s", res[0], lane.Name)
	}
	if data, err := os.ReadFile(filepath.Join(a.trial.Workspace, "ran.txt")); err != nil || string(data) != "ran\n" {
		t.Errorf("ran.txt: %q %v", data, err)
	}

	before := len(a.provider.Paths())
	for _, flags := range [][]string{{"-s", "workspace-write"}, {"--full-auto"}} {
		_, stderr, code := a.agent("lane", codexEnv(a.provider), codexExec(codex, a.provider.URL, "run a command", flags...)...)
		want := "thermite: trial agent: harness lane: codex " + strings.Join(flags, " ") + ": Codex's own sandbox (bubblewrap) cannot start in a lane, which may make no user namespace; the rig is its sandbox (the lane's ~/.codex/config.toml sets sandbox_mode = \"danger-full-access\"): leave it out\n"
		if code != 1 || stderr != want {
			t.Errorf("codex exec %v: exit %d, stderr %q; want 1 and the one line %q", flags, code, stderr, want)
		}
	}
	if n := len(a.provider.Paths()); n != before {
		t.Errorf("the stand-in saw %d requests from the refused runs: Codex ran", n-before)
	}

	// Why, as the lane: its commands (trial exec) may start Codex's sandbox.
	for _, c := range []struct {
		what string
		argv []string
		want string
	}{
		{"Codex's sandbox", []string{codex, "sandbox", "-c", `sandbox_mode="workspace-write"`, "--", "true"}, "error building bubblewrap command: Permission denied"},
		{"its bubblewrap", []string{filepath.Join(codexVendor(), "codex-resources", "bwrap"), "--ro-bind", "/", "/", "true"}, "bwrap: No permissions to create a new namespace"},
		{"its legacy Landlock mode", []string{codex, "sandbox", "-c", `sandbox_mode="workspace-write"`, "-c", "features.use_legacy_landlock=true", "--", "true"}, "filesystem-restricted execution requires bubblewrap"},
	} {
		if _, stderr, code := a.r.Thermite(append([]string{"trial", "exec", a.trial.ID, "--"}, c.argv...)...); code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("%s as the lane: exit %d %q, want it to fail with %q", c.what, code, stderr, c.want)
		}
	}
}
