package rig

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"thermite/internal/standin"
	"thermite/internal/testrig"
)

// Claude Code (make agents' pinned version) as the lane harness's user:
// `claude -p` run through `thermite trial agent --harness lane`, its model
// the stand-in provider reached through the lane's egress proxy, each
// tool call scripted.

// claudeEnv is what the operator gives Claude Code for a provider: its
// address, a key (the stand-in takes any), the provider's CA, and no
// retries (a refused request is shown at once).
func claudeEnv(baseURL, caFile string) []string {
	return []string{"ANTHROPIC_BASE_URL=" + baseURL, "ANTHROPIC_API_KEY=x", "NODE_EXTRA_CA_CERTS=" + caFile, "CLAUDE_CODE_MAX_RETRIES=0"}
}

// claudeAgent runs `claude -p PROMPT --dangerously-skip-permissions` as the
// lane's user with env, under a wall limit (trial agent's --timeout) so
// that a hang fails the test rather than stalling it.
func claudeAgent(a *agentTrial, claude string, env []string, prompt string, flags ...string) (stdout, stderr string, code int, took time.Duration) {
	args := []string{"trial", "agent", a.trial.ID, "--harness", "lane", "--timeout", "60s"}
	for _, e := range env {
		args = append(args, "--env", e)
	}
	start := time.Now()
	stdout, stderr, code = a.r.Thermite(append(append(args, "--", claude, "-p", prompt, "--dangerously-skip-permissions"), flags...)...)
	return stdout, stderr, code, time.Since(start)
}

// trialEgressRefused are the ledger's egress.refused events of a trial,
// whatever their target: every connection the proxy would not make.
func trialEgressRefused(t *testing.T, r *testrig.Rig, trial string) []egressEvent {
	t.Helper()
	out, _, _ := r.Thermite("ledger", "export")
	var got []egressEvent
	for _, line := range strings.Split(out, "\n") {
		var e egressEvent
		line = strings.TrimSuffix(strings.TrimSpace(line), ",")
		if json.Unmarshal([]byte(line), &e) == nil && e.Kind == "egress.refused" && e.Trial == trial {
			got = append(got, e)
		}
	}
	return got
}

// claudeNote is the research note Claude Code writes through thermite's
// MCP tool.
const claudeNote = "claude-code-was-here"

// Claude Code in lane 1 runs a whole scripted turn: its Bash runs as the
// lane's user in the workspace, its Write makes a file the lane owns,
// thermite's MCP tool writes a research note, its reads of the judge's
// ledger, lane 2's file and the agent's token are refused, and a direct
// connection past the proxy fails; it reached the stand-in only through
// the lane's egress proxy, and nothing else at all.
func TestClaudeCodeInALaneDoesAWholeTurn(t *testing.T) {
	claude := agentProgram(t, "claude")
	// The script needs the trial's paths: made once the rig is up, read
	// only when Claude Code asks.
	var steps []standin.Step
	a := newAgentTrial(t, func(tu standin.Turn) standin.Step { return standin.Steps("FINAL: the turn is done", steps...)(tu) }, testrig.Options{})
	lane := a.r.Role("lane-1")
	_, port, _ := net.SplitHostPort(a.provider.Addr)
	what := map[string]string{}
	var forbidden []string
	for name, p := range a.forbidden() {
		what[p] = name
		forbidden = append(forbidden, p)
	}
	sort.Strings(forbidden)
	written := filepath.Join(a.trial.Workspace, "written-by-claude.txt")
	steps = []standin.Step{
		{Tool: &standin.Call{Name: "Bash", Input: map[string]any{"command": "id -un; pwd", "description": "who and where"}}},
		{Tool: &standin.Call{Name: "Write", Input: map[string]any{"file_path": written, "content": "hello from the lane\n"}}},
		// Claude Code defers MCP tools: it offers ToolSearch, whose
		// answer loads the tool, and the tool itself only after.
		{Tool: &standin.Call{Name: "ToolSearch", Input: map[string]any{"query": "select:mcp__thermite__research_note", "max_results": 1}}},
		{Tool: &standin.Call{Name: "mcp__thermite__research_note", Input: map[string]any{"title": "from claude", "body": claudeNote}}},
	}
	// Each forbidden place read twice: by the shell, which shows the
	// kernel's refusal as it is, and by Claude Code's Read.
	for _, p := range forbidden {
		steps = append(steps,
			standin.Step{Tool: &standin.Call{Name: "Bash", Input: map[string]any{"command": "cat -- '" + p + "'", "description": "read it"}}},
			standin.Step{Tool: &standin.Call{Name: "Read", Input: map[string]any{"file_path": p}}})
	}
	// Past the proxy: the stand-in's own address and one beyond the host,
	// by bash's /dev/tcp, which knows no proxy. The run is in the lane's
	// network namespace, where nothing listens at the stand-in's port and
	// nothing routes past lo, so a connection would fail there anyway
	// (curl says "Couldn't connect" whatever the cause): what refuses it,
	// and is asserted, is the lane's Landlock rule, which lets it connect
	// to its proxy's port alone (EACCES, before any route is looked up).
	direct := fmt.Sprintf("(exec 3<>/dev/tcp/127.0.0.1/%s) 2>&1; a=$?; (exec 3<>/dev/tcp/1.1.1.1/443) 2>&1; b=$?; echo \"exits $a $b\"; exit $((a | b))", port)
	steps = append(steps, standin.Step{Tool: &standin.Call{Name: "Bash", Input: map[string]any{"command": direct, "description": "connect directly"}}})

	start := time.Now()
	stdout, stderr, code := a.agent("lane", claudeEnv(a.provider.URL, a.provider.CAFile), claude, "-p", "do the scripted turn", "--dangerously-skip-permissions")
	took := time.Since(start)
	t.Logf("claude -p: exit %d in %v, %d requests", code, took.Round(time.Millisecond), len(a.provider.Paths()))
	if code != 0 || !strings.Contains(stdout, "FINAL: the turn is done") {
		t.Fatalf("claude -p: exit %d, stdout %q, stderr %s; want exit 0 and the final message", code, stdout, stderr)
	}
	results := a.provider.Results()
	for i, r := range results {
		t.Logf("result %d %s (is_error %v): %q", i+1, r.Name, r.IsError, r.Output)
	}
	if len(results) != len(steps) {
		t.Fatalf("%d tool results, want %d (one per scripted call)", len(results), len(steps))
	}
	for i, r := range results {
		if r.Name != steps[i].Tool.Name {
			t.Errorf("result %d answers %s, want %s", i+1, r.Name, steps[i].Tool.Name)
		}
	}

	if want := lane.User + "\n" + a.trial.Workspace; results[0].IsError || strings.TrimSpace(results[0].Output) != want {
		t.Errorf("Bash `id -un; pwd`: %q (is_error %v), want %q", results[0].Output, results[0].IsError, want)
	}

	var st syscall.Stat_t
	if err := syscall.Stat(written, &st); err != nil || results[1].IsError {
		t.Errorf("Write: %q (is_error %v); the file: %v", results[1].Output, results[1].IsError, err)
	} else if int(st.Uid) != lane.UID {
		t.Errorf("the written file is uid %d's, want %s's (%d)", st.Uid, lane.User, lane.UID)
	}

	// The MCP tool is offered only once ToolSearch has loaded it, and
	// writes its note into the run's research folder.
	turns := a.provider.Turns()
	offered := func(i int) bool { return slices.Contains(turns[i].Tools, "mcp__thermite__research_note") }
	if offered(0) || !offered(len(turns)-1) || results[2].Output != "mcp__thermite__research_note" {
		t.Errorf("mcp__thermite__research_note offered at first %v, at last %v; ToolSearch answered %q", offered(0), offered(len(turns)-1), results[2].Output)
	}
	note := results[3]
	var noted struct{ Path string }
	json.Unmarshal([]byte(note.Output), &noted)
	if body, err := os.ReadFile(filepath.Join(a.trial.ResearchDir, noted.Path)); note.IsError || noted.Path == "" || err != nil || !strings.Contains(string(body), claudeNote) {
		t.Errorf("research_note: %q (is_error %v); the note: %q %v", note.Output, note.IsError, body, err)
	}

	for i, p := range forbidden {
		shell, read := results[4+2*i], results[5+2*i]
		if !shell.IsError || !refusedResult(shell) {
			t.Errorf("cat %s (%s): %q (is_error %v), want the kernel's refusal", p, what[p], shell.Output, shell.IsError)
		}
		// Read declines a .db file by its name before opening it, which
		// says nothing of the lane's access: the shell's cat showed that.
		if strings.HasSuffix(p, ".db") {
			if !read.IsError || !strings.Contains(read.Output, "binary") {
				t.Errorf("Read %s (%s): %q (is_error %v), want Read's refusal of a binary file", p, what[p], read.Output, read.IsError)
			}
		} else if !read.IsError || !refusedResult(read) {
			t.Errorf("Read %s (%s): %q (is_error %v), want EACCES", p, what[p], read.Output, read.IsError)
		}
	}

	if r := results[len(results)-1]; !r.IsError || strings.Count(r.Output, "connect: Permission denied") != 2 || !strings.Contains(r.Output, "exits 1 1") {
		t.Errorf("/dev/tcp past the proxy: %q (is_error %v), want both connections refused with EACCES, a tool error", r.Output, r.IsError)
	}

	// Every request came through the lane's proxy: each connection the
	// stand-in saw is a tunnel the proxy recorded for this trial, via
	// lane-1; the direct connections never reached it; and nothing else
	// was tried (update checks, telemetry): the proxy refused nothing.
	a.reachedOnlyThroughItsProxy(t, lane.Name)
	for _, p := range a.provider.Paths() {
		if p != "POST /v1/messages" && p != "POST /v1/messages/count_tokens" {
			t.Errorf("the stand-in saw %s", p)
		}
	}
	a.endsClean(t)
}

// A provider the rig does not list: Claude Code's request is the proxy's
// 403, which it shows (as its own words for a refused tunnel, the status
// in its debug log) and exits on, promptly; the refusal is in the ledger.
func TestClaudeCodeShowsAnUnlistedProviderAsTheProxysRefusal(t *testing.T) {
	claude := agentProgram(t, "claude")
	a := newAgentTrial(t, standin.Steps("never asked"), testrig.Options{})
	// Port 9 (discard) of 127.0.0.2: in no rig's agent.egress.
	const unlisted = "127.0.0.2:9"
	debug := filepath.Join(a.trial.Workspace, "claude-debug.log")
	// Under claudeAgent's --timeout: a hang is exit 124, not the 1 wanted.
	stdout, stderr, code, took := claudeAgent(a, claude, claudeEnv("https://"+unlisted, a.provider.CAFile), "hello", "--debug-file", debug)
	t.Logf("claude -p: exit %d in %v: %q %q", code, took.Round(time.Millisecond), stdout, stderr)
	if code != 1 || !strings.Contains(stdout, "ERR_PROXY_TUNNEL") || !strings.Contains(stdout, "the proxy refused the tunnel") {
		t.Errorf("claude -p to an unlisted provider: exit %d, %q %q; want 1 and a failure saying the proxy refused the tunnel", code, stdout, stderr)
	}
	if log, err := os.ReadFile(debug); err != nil || !strings.Contains(string(log), "Proxy refused to open a tunnel: 403 Forbidden") {
		t.Errorf("Claude Code's debug log (%v) does not show the proxy's 403", err)
	}
	if n := len(a.provider.Paths()); n != 0 {
		t.Errorf("the listed stand-in saw %d requests, want none", n)
	}
	if ev := egressEvents(t, a.r, "egress.refused", unlisted, 1); len(ev) != 1 || ev[0].Trial != a.trial.ID || ev[0].Data.Via != "lane-1" || ev[0].Data.Why != "not in agent.egress" {
		t.Errorf("egress.refused events for %s: %+v, want one (no retry) of trial %s via lane-1, not in agent.egress", unlisted, ev, a.trial.ID)
	}
}

// Without --dangerously-skip-permissions Claude Code runs thermite's MCP
// tools unasked (the rig's settings.json allows mcp__thermite) and asks
// for anything else that changes files, which -p cannot: a refusal the
// model sees.
func TestClaudeCodeRunsThermitesToolsWithoutAsking(t *testing.T) {
	claude := agentProgram(t, "claude")
	a := newAgentTrial(t, standin.Steps("FINAL: asked for nothing",
		standin.Step{Tool: &standin.Call{Name: "ToolSearch", Input: map[string]any{"query": "select:mcp__thermite__research_note", "max_results": 1}}},
		standin.Step{Tool: &standin.Call{Name: "mcp__thermite__research_note", Input: map[string]any{"body": claudeNote}}},
		standin.Step{Tool: &standin.Call{Name: "Bash", Input: map[string]any{"command": "touch made-by-bash", "description": "make a file"}}},
	), testrig.Options{})
	stdout, stderr, code := a.agent("lane", claudeEnv(a.provider.URL, a.provider.CAFile), claude, "-p", "note it")
	results := a.provider.Results()
	if code != 0 || !strings.Contains(stdout, "FINAL: asked for nothing") || len(results) != 3 {
		t.Fatalf("claude -p: exit %d, %q %s, %d results; want exit 0, the final message and 3 results", code, stdout, stderr, len(results))
	}
	if note := results[1]; note.IsError || !strings.Contains(note.Output, "notes/") {
		t.Errorf("research_note without --dangerously-skip-permissions: %q (is_error %v), want it run", note.Output, note.IsError)
	}
	if bash := results[2]; !bash.IsError || !strings.Contains(bash.Output, "needs approval") {
		t.Errorf("Bash touch without --dangerously-skip-permissions: %q (is_error %v), want it refused for approval", bash.Output, bash.IsError)
	}
	if _, err := os.Stat(filepath.Join(a.trial.Workspace, "made-by-bash")); !os.IsNotExist(err) {
		t.Errorf("made-by-bash: %v, want it not made", err)
	}
}
