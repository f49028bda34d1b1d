package rig

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"thermite/controller"
	"thermite/internal/standin"
	"thermite/internal/testrig"
)

// openCodeProvider is the stand-in as OpenCode's provider, in the form an
// operator gives it (docs/agents-opencode.md): a custom provider on the
// bundled @ai-sdk/openai-compatible package, its base URL both as the
// provider's api (where this version takes a model's URL from) and as
// options.baseURL.
func openCodeProvider(url string) string {
	cfg, _ := json.Marshal(map[string]any{
		"model": "standin/standin-model",
		"provider": map[string]any{"standin": map[string]any{
			"npm": "@ai-sdk/openai-compatible", "name": "thermite stand-in", "api": url + "/v1",
			"options": map[string]any{"baseURL": url + "/v1", "apiKey": "standin-key"},
			"models":  map[string]any{"standin-model": map[string]any{"name": "stand-in model", "tool_call": true}},
		}},
	})
	return string(cfg)
}

// openCodeTool is a tool call as OpenCode itself reported it (`opencode
// run --format json`, a tool_use event): its status ("completed" or
// "error"), a command's exit status, and what it showed.
type openCodeTool struct {
	Tool  string `json:"tool"`
	State struct {
		Status   string `json:"status"`
		Error    string `json:"error"`
		Output   string `json:"output"`
		Metadata struct {
			Exit *int `json:"exit"`
		} `json:"metadata"`
	} `json:"state"`
}

// openCodeReport reads `opencode run --format json`'s events: the tool
// calls OpenCode made, in order, and its text.
func openCodeReport(t *testing.T, stdout string) (tools []openCodeTool, text string) {
	t.Helper()
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var e struct {
			Type string          `json:"type"`
			Part json.RawMessage `json:"part"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("opencode run --format json wrote %q: %v", line, err)
		}
		switch e.Type {
		case "tool_use":
			var tool openCodeTool
			json.Unmarshal(e.Part, &tool)
			tools = append(tools, tool)
		case "text":
			var part struct{ Text string }
			json.Unmarshal(e.Part, &part)
			text += part.Text
		}
	}
	return tools, text
}

// TestOpenCodeInALaneDoesAWholeTurn: OpenCode, run by an operator with the
// lane harness and the stand-in as its provider, does a scripted turn as
// lane-1 in the workspace: its shell, its file writing, one of thermite's
// MCP tools, reads of the places no agent may reach (refused by the
// system, each a tool error as OpenCode reports it), the same by its shell
// (a command that failed), a connection that skips the proxy (refused),
// and its final answer; the trial is still open after, and ends clean.
func TestOpenCodeInALaneDoesAWholeTurn(t *testing.T) {
	opencode := agentProgram(t, "opencode")
	const final = "the stand-in's last word to OpenCode"
	// The prompt goes as words: `opencode run` joins its arguments with
	// spaces, one that holds a space in double quotes.
	const prompt = "do the scripted turn"
	// The steps name the trial's paths, known once it is open.
	var steps atomic.Pointer[[]standin.Step]
	script := func(turn standin.Turn) standin.Step {
		s := standin.Steps(final, *steps.Load()...)(turn)
		// OpenCode names an MCP server's tools SERVER_TOOL: call the one
		// it offered whose name ends with the tool's.
		if s.Tool != nil && strings.HasPrefix(s.Tool.Name, "mcp:") {
			want := strings.TrimPrefix(s.Tool.Name, "mcp:")
			name := want
			for _, offered := range turn.Tools {
				if strings.HasSuffix(offered, "_"+want) {
					name = offered
				}
			}
			s = standin.Step{Tool: &standin.Call{Name: name, Input: s.Tool.Input}}
		}
		return s
	}
	empty := []standin.Step{}
	steps.Store(&empty)
	a := newAgentTrial(t, script, testrig.Options{})
	lane1 := a.r.Role("lane-1")
	ws := a.trial.Workspace
	home := filepath.Join(filepath.Dir(ws), "lane")
	wrote := filepath.Join(ws, "written-by-opencode.txt")
	const note = "a research note OpenCode wrote through thermite's MCP server"
	forbidden := a.forbidden()
	places := slices.Sorted(func(yield func(string) bool) {
		for what := range forbidden {
			if !yield(what) {
				return
			}
		}
	})
	call := func(name string, input map[string]any) standin.Step {
		return standin.Step{Tool: &standin.Call{Name: name, Input: input}}
	}
	s := []standin.Step{
		call("bash", map[string]any{"command": "id -un; pwd", "description": "who and where"}),
		call("write", map[string]any{"filePath": wrote, "content": "OpenCode was here\n"}),
		call("mcp:research_note", map[string]any{"title": "from opencode", "body": note}),
	}
	for _, what := range places {
		s = append(s, call("read", map[string]any{"filePath": forbidden[what]}))
	}
	// The same places read by the shell, whose refusal is the errno's
	// text.
	var cat []string
	for _, what := range places {
		cat = append(cat, "cat "+forbidden[what])
	}
	s = append(s, call("bash", map[string]any{"command": strings.Join(cat, "; "), "description": "read what no agent may"}))
	// The stand-in's own address, straight: the lane harness has TCP to
	// its proxy alone.
	s = append(s, call("bash", map[string]any{"command": "exec 3<>/dev/tcp/127.0.0.1/" + strings.Split(a.provider.Addr, ":")[1] + " && echo connected", "description": "skip the proxy"}))
	steps.Store(&s)

	start := time.Now()
	stdout, stderr, code := a.agent("lane", []string{
		"NODE_EXTRA_CA_CERTS=" + a.provider.CAFile,
		"OPENCODE_CONFIG_CONTENT=" + openCodeProvider(a.provider.URL),
	}, append([]string{opencode, "run", "--format", "json", "--model", "standin/standin-model"}, strings.Fields(prompt)...)...)
	t.Logf("opencode run: exit %d in %v, %d requests", code, time.Since(start).Round(time.Millisecond), len(a.provider.Paths()))
	reported, text := openCodeReport(t, stdout)
	if code != 0 || !strings.Contains(text, final) {
		state, reason := trialState(t, a.r, a.trial.ID)
		t.Fatalf("opencode run: exit %d, stdout %q, stderr %s; want 0 and %q (stand-in saw %v; the trial is %s: %s)", code, stdout, stderr, final, a.provider.Paths(), state, reason)
	}

	res := a.provider.Results()
	if len(res) != len(s) {
		t.Fatalf("OpenCode showed its model %d tool results, want %d: %+v", len(res), len(s), res)
	}
	if len(reported) != len(s) {
		t.Fatalf("OpenCode reported %d tool calls, want %d: %+v", len(reported), len(s), reported)
	}
	for i, r := range res {
		t.Logf("result %d %s (OpenCode's status %s): %q", i, r.Name, reported[i].State.Status, r.Output)
	}
	for _, turn := range a.provider.Turns() {
		if turn.API != standin.OpenAIChat || turn.Model != "standin-model" || turn.Prompt != prompt {
			t.Errorf("turn %+v: want chat completions for standin-model with the prompt", turn)
		}
	}

	t.Run("its shell runs as lane-1 in the workspace", func(t *testing.T) {
		if want := lane1.User + "\n" + ws; !strings.Contains(res[0].Output, want) {
			t.Errorf("bash showed %q, want %q", res[0].Output, want)
		}
	})

	t.Run("the file it writes is in the workspace, lane-1's", func(t *testing.T) {
		data, err := os.ReadFile(wrote)
		if err != nil || string(data) != "OpenCode was here\n" {
			t.Fatalf("%s: %v %q (tool said %q)", wrote, err, data, res[1].Output)
		}
		fi, _ := os.Stat(wrote)
		if uid := fi.Sys().(*syscall.Stat_t).Uid; int(uid) != lane1.UID {
			t.Errorf("%s is uid %d's, want lane-1's %d", wrote, uid, lane1.UID)
		}
	})

	t.Run("thermite's MCP tool writes its research note", func(t *testing.T) {
		if !strings.HasSuffix(res[2].Name, "research_note") || !strings.Contains(res[2].Output, "noted: research_read notes/") {
			t.Fatalf("%s showed %q, want the note's path", res[2].Name, res[2].Output)
		}
		path := strings.Fields(res[2].Output[strings.Index(res[2].Output, "notes/"):])[0]
		data, err := os.ReadFile(filepath.Join(a.trial.ResearchDir, path))
		if err != nil || !strings.Contains(string(data), note) {
			t.Errorf("the note %s: %v %q", path, err, data)
		}
	})

	t.Run("each refusal is a failure as OpenCode reported it", func(t *testing.T) {
		// Its read tool's refusal is a tool error; its shell's a command
		// that exited non-zero, which OpenCode reports as completed (its
		// model sees the output alone). The Chat Completions API carries
		// neither: the stand-in sees text.
		for i, r := range res {
			got := reported[i].State
			exit := -1
			if got.Metadata.Exit != nil {
				exit = *got.Metadata.Exit
			}
			switch {
			case r.Reported:
				t.Errorf("result %d (%s): the stand-in took %q for an error report, which the Chat Completions API has no place for", i, r.Name, r.Output)
			case i >= 3 && i < 3+len(places):
				if got.Status != "error" || got.Error != r.Output {
					t.Errorf("read %d: OpenCode reported %q (error %q), want an error, the one its model saw (%q)", i, got.Status, got.Error, r.Output)
				}
			case r.Name == "bash":
				if want := map[bool]int{true: 1, false: 0}[i >= 3]; got.Status != "completed" || exit != want {
					t.Errorf("bash %d: OpenCode reported %q, exit %d; want completed, exit %d", i, got.Status, exit, want)
				}
			case got.Status != "completed":
				t.Errorf("%s %d: OpenCode reported %q, want completed", r.Name, i, got.Status)
			}
		}
	})

	t.Run("what no agent may read is refused by the system", func(t *testing.T) {
		shell := res[3+len(places)]
		for i, what := range places {
			r := res[3+i]
			if r.Name != "read" || !openCodeRefused(r) {
				t.Errorf("read %s (%s): %s showed %q, want a refusal (EACCES)", forbidden[what], what, r.Name, r.Output)
			}
			if want := "cat: " + forbidden[what] + ": Permission denied"; !strings.Contains(shell.Output, want) {
				t.Errorf("bash cat %s (%s) showed %q, want %q", forbidden[what], what, shell.Output, want)
			}
		}
		for _, r := range res[3 : 4+len(places)] {
			if strings.Contains(r.Output, "lane 2's own") || strings.Contains(r.Output, tokenOf(t, a.trial)) {
				t.Errorf("%s: what no agent may read reached the model: %q", r.Name, r.Output)
			}
		}
	})

	t.Run("a connection that skips the proxy is refused", func(t *testing.T) {
		if r := res[len(res)-1]; !refusedResult(r) || strings.Contains(r.Output, "connected") {
			t.Errorf("bash straight to %s showed %q, want Permission denied", a.provider.Addr, r.Output)
		}
	})

	t.Run("it reached nothing but the provider, through the lane's proxy", func(t *testing.T) {
		// Nothing refused: no models.dev, npm or update check.
		a.reachedOnlyThroughItsProxy(t, lane1.Name)
	})

	t.Run("its state and caches are in the lane harness's home", func(t *testing.T) {
		for _, d := range []string{".cache/opencode", ".local/share/opencode"} {
			fi, err := os.Stat(filepath.Join(home, d))
			if err != nil {
				t.Errorf("~/%s: %v", d, err)
				continue
			}
			if uid := fi.Sys().(*syscall.Stat_t).Uid; int(uid) != lane1.UID {
				t.Errorf("~/%s is uid %d's, want lane-1's %d", d, uid, lane1.UID)
			}
		}
	})

	t.Run("the trial is still open", func(t *testing.T) {
		if state, reason := trialState(t, a.r, a.trial.ID); state != "open" || reason != "" {
			t.Errorf("trial %s is %s: %s", a.trial.ID, state, reason)
		}
	})
	t.Run("the trial ends clean", func(t *testing.T) { a.endsClean(t) })
}

// trialState is a trial's state in `trial list` and why it ended.
func trialState(t *testing.T, r *testrig.Rig, id string) (state, endReason string) {
	t.Helper()
	out, stderr, code := r.Thermite("trial", "list", "--json")
	var ts []controller.TrialStatus
	if code != 0 || json.Unmarshal([]byte(out), &ts) != nil {
		t.Fatalf("trial list: exit %d %s", code, stderr)
	}
	for _, tr := range ts {
		if tr.ID == id {
			return tr.State, tr.EndReason
		}
	}
	t.Fatalf("trial list has no %s: %s", id, out)
	return "", ""
}

// TestOpenCodeShowsAnUnlistedProviderAsTheProxysRefusal: a provider that
// is not in agent.egress fails the run at once, with the proxy's refusal
// on OpenCode's stderr, recorded for the trial; nothing reaches the
// listed stand-in.
func TestOpenCodeShowsAnUnlistedProviderAsTheProxysRefusal(t *testing.T) {
	opencode := agentProgram(t, "opencode")
	a := newAgentTrial(t, standin.Steps("never asked"), testrig.Options{})
	// Port 9 (discard) of 127.0.0.2: in no rig's agent.egress.
	const unlisted = "127.0.0.2:9"
	// Under a.agent's --timeout: a hang is exit 124, not the 1 wanted.
	stdout, stderr, code := a.agent("lane", []string{
		"NODE_EXTRA_CA_CERTS=" + a.provider.CAFile,
		"OPENCODE_CONFIG_CONTENT=" + openCodeProvider("https://"+unlisted),
	}, opencode, "run", "--model", "standin/standin-model", "hello")
	if code != 1 || !strings.Contains(stderr, "Forbidden") || !strings.Contains(stderr, "not in the rig's agent.egress") {
		t.Errorf("opencode run to an unlisted provider: exit %d, %q %q; want 1 and the proxy's 403 and reason", code, stdout, stderr)
	}
	if n := len(a.provider.Paths()); n != 0 {
		t.Errorf("the listed stand-in saw %d requests, want none", n)
	}
	if ev := egressEvents(t, a.r, "egress.refused", unlisted, 1); len(ev) == 0 || ev[0].Trial != a.trial.ID || ev[0].Data.Via != "lane-1" || ev[0].Data.Why != "not in agent.egress" {
		t.Errorf("egress.refused events for %s: %+v, want the trial %s's via lane-1, not in agent.egress", unlisted, ev, a.trial.ID)
	}
}

// openCodeRefused is refusedResult for OpenCode's own file tools, which
// show a refused stat or read by its file system layer's name for EACCES
// and EPERM ("PermissionDenied: FileSystem.stat (PATH)").
func openCodeRefused(res standin.Result) bool {
	return refusedResult(res) || strings.Contains(res.Output, "PermissionDenied: FileSystem.")
}
