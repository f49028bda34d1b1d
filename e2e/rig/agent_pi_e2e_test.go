package rig

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"thermite/internal/config"
	"thermite/internal/standin"
	"thermite/internal/testrig"
)

// Pi (@mariozechner/pi-coding-agent) as the trial's worker agent through
// the pi harness: agent-N runs it, and thermite's extension makes its
// tools act through the harness API as the lane's user.

// piSource is a file of agents/pi as this checkout has it.
func piSource(t *testing.T, name string) []byte {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	src, err := os.ReadFile(filepath.Join(filepath.Dir(here), "..", "..", "agents", "pi", name))
	if err != nil {
		t.Fatalf("agents/pi/%s in the checkout: %v", name, err)
	}
	return src
}

// piExtensionSource is thermite's extension as this checkout has it.
func piExtensionSource(t *testing.T) []byte { return piSource(t, "thermite.ts") }

// piLocalShell is where `make agents` installs Pi's local shell, which
// runs nothing.
func piLocalShell() string {
	return filepath.Join(filepath.Dir(config.DefaultPiExtension), "no-local-shell")
}

// installedPiExtension skips the test unless the rig's default
// agent.pi_extension holds this checkout's extension, byte for byte: a
// test of another version would say nothing of this one.
func installedPiExtension(t *testing.T) {
	t.Helper()
	if agentsDir() != filepath.Dir(filepath.Dir(config.DefaultPiExtension)) {
		t.Skipf("needs the agent programs where the rig's default agent.pi_extension (%s) lies; THERMITE_AGENTS is %s", config.DefaultPiExtension, agentsDir())
	}
	got, err := os.ReadFile(config.DefaultPiExtension)
	if err != nil {
		t.Skipf("needs thermite's Pi extension at %s: run `make agents` (%v)", config.DefaultPiExtension, err)
	}
	if !bytes.Equal(got, piExtensionSource(t)) {
		t.Skipf("the installed Pi extension %s is not agents/pi/thermite.ts of this checkout: run `make agents` to test this one", config.DefaultPiExtension)
	}
	if got, err := os.ReadFile(piLocalShell()); err != nil || !bytes.Equal(got, piSource(t, "no-local-shell")) {
		t.Skipf("the installed %s is not agents/pi/no-local-shell of this checkout (%v): run `make agents`", piLocalShell(), err)
	}
}

// piModels is Pi's models.json for the stand-in: one provider speaking
// Anthropic's Messages API at url, the stand-in's (for tests only: an
// operator's Pi has its real provider).
func piModels(t *testing.T, url string) []byte {
	t.Helper()
	b, err := json.MarshalIndent(map[string]any{"providers": map[string]any{"standin": map[string]any{
		"baseUrl": url, "api": "anthropic-messages", "apiKey": "standin-key",
		"models": []any{map[string]any{"id": "claude-standin", "name": "Claude stand-in", "contextWindow": 200000, "maxTokens": 4096}},
	}}}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestPiAsAgentWorksThroughTheAPIAsTheLane(t *testing.T) {
	pi := agentProgram(t, "pi")
	installedPiExtension(t)
	// The lane's direct connection: to the stand-in itself, which only
	// the agent's egress proxy may reach (and never for a lane).
	var standinPort string
	var forbidden map[string]string
	var names []string
	const written, edited = "written by Pi through thermite\n", "edited by Pi through thermite\n"
	// The tool results in the order the script calls them.
	const (
		bashID = iota
		writeFile
		readBack
		editFile
		lsWorkspace
		findTxt
		grepNeedle
		rootOnlyRead
		systemRead
		researchNote
		researchRead
		researchFetch
		stepCall
		forbiddenReads
	)
	script := func(turn standin.Turn) standin.Step {
		// The note's path, as research_note answered it: research_read's.
		notePath := ""
		if len(turn.Results) > researchNote {
			notePath = strings.TrimPrefix(turn.Results[researchNote].Output, "noted: research_read ")
		}
		steps := []standin.Step{
			{Tool: &standin.Call{Name: "bash", Input: map[string]any{"command": "id -un; pwd"}}},
			{Tool: &standin.Call{Name: "write", Input: map[string]any{"path": "made-by-pi.txt", "content": written}}},
			{Tool: &standin.Call{Name: "read", Input: map[string]any{"path": "made-by-pi.txt"}}},
			{Tool: &standin.Call{Name: "edit", Input: map[string]any{"path": "made-by-pi.txt", "edits": []any{map[string]any{"oldText": "written by", "newText": "edited by"}}}}},
			{Tool: &standin.Call{Name: "ls", Input: map[string]any{"path": "."}}},
			{Tool: &standin.Call{Name: "find", Input: map[string]any{"pattern": "*.txt"}}},
			{Tool: &standin.Call{Name: "grep", Input: map[string]any{"pattern": "need+le", "glob": "**/*.txt"}}},
			{Tool: &standin.Call{Name: "read", Input: map[string]any{"path": "root-only"}}},
			{Tool: &standin.Call{Name: "read", Input: map[string]any{"path": "/etc/passwd"}}},
			{Tool: &standin.Call{Name: "research_note", Input: map[string]any{"title": "from Pi", "body": piNote}}},
			{Tool: &standin.Call{Name: "research_read", Input: map[string]any{"path": notePath}}},
			{Tool: &standin.Call{Name: "research_fetch", Input: map[string]any{"url": "http://127.0.0.1:" + standinPort + "/"}}},
			{Tool: &standin.Call{Name: "step", Input: map[string]any{"kind": "thought", "text": "Pi thought it through"}}},
		}
		for _, name := range names {
			steps = append(steps, standin.Step{Tool: &standin.Call{Name: "read", Input: map[string]any{"path": forbidden[name]}}})
		}
		steps = append(steps, standin.Step{Tool: &standin.Call{Name: "bash", Input: map[string]any{"command": "exec 3<>/dev/tcp/127.0.0.1/" + standinPort + " && echo connected"}}})
		return standin.Steps("Pi is done: the file is written and read back.", steps...)(turn)
	}
	a := newAgentTrial(t, script, testrig.Options{})
	_, standinPort, _ = net.SplitHostPort(a.provider.Addr)
	forbidden = a.forbidden()
	for name := range forbidden {
		names = append(names, name)
	}
	sort.Strings(names)
	// A file in the workspace the lane may not read: the file helper refuses it.
	if err := os.WriteFile(filepath.Join(a.trial.Workspace, "root-only"), []byte("root's\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Agent-N reads the stand-in's CA: every folder on its way must let it by.
	os.Chmod(filepath.Dir(filepath.Dir(a.provider.CAFile)), 0o755)
	var settings struct {
		Extensions []string `json:"extensions"`
		ShellPath  string   `json:"shellPath"`
	}
	raw, err := os.ReadFile(filepath.Join(a.trial.AgentDir, ".pi", "agent", "settings.json"))
	if err != nil || json.Unmarshal(raw, &settings) != nil || len(settings.Extensions) != 1 || settings.Extensions[0] != config.DefaultPiExtension || settings.ShellPath != piLocalShell() {
		t.Fatalf("agent-N's Pi settings: %s %v; want the extension %s and the shell %s", raw, err, config.DefaultPiExtension, piLocalShell())
	}
	models := filepath.Join(a.trial.AgentDir, ".pi", "agent", "models.json")
	if err := os.WriteFile(models, piModels(t, a.provider.URL), 0o644); err != nil {
		t.Fatalf("Pi's models.json in the trial's agent folder (written at the trial's start with its settings.json?): %v", err)
	}

	start := time.Now()
	// a.agent runs it under agentTimeout: a Pi that hangs fails with 124.
	stdout, stderr, code := a.agent("pi", []string{"NODE_EXTRA_CA_CERTS=" + a.provider.CAFile},
		pi, "-p", "--no-session", "--provider", "standin", "--model", "claude-standin",
		"Show who you are and where, write made-by-pi.txt, read it back, try the forbidden places and the network.")
	t.Logf("pi: exit %d in %v\nstdout: %s\nstderr: %s\nprovider paths: %v", code, time.Since(start).Round(time.Millisecond), stdout, stderr, a.provider.Paths())
	if code != 0 {
		t.Fatalf("pi -p: exit %d, want 0; stderr: %s", code, stderr)
	}
	if !strings.Contains(stdout, "Pi is done: the file is written and read back.") {
		t.Errorf("pi -p stdout %q lacks the model's final text", stdout)
	}
	turns := a.provider.Turns()
	if len(turns) == 0 {
		t.Fatal("Pi never asked the stand-in provider")
	}
	for _, tool := range []string{"read", "write", "edit", "bash", "ls", "find", "grep", "research_note", "research_fetch", "research_read", "research_list", "research_grep", "research_find", "step"} {
		if !strings.Contains(" "+strings.Join(turns[0].Tools, " ")+" ", " "+tool+" ") {
			t.Errorf("Pi offered the tools %v, without %s", turns[0].Tools, tool)
		}
	}
	res := a.provider.Results()
	if want := forbiddenReads + len(names) + 1; len(res) != want {
		t.Fatalf("Pi sent back %d tool results, want %d: %+v", len(res), want, res)
	}

	for i, r := range res {
		t.Logf("tool result %d (%s): error %v: %s", i, r.Name, r.IsError, r.Output)
	}
	// Pi's own requests, as agent-N, went through agent-1's proxy alone.
	a.reachedOnlyThroughItsProxy(t, "agent-1")
	lane := a.r.Role("lane-1")
	t.Run("bash runs as the lane in the workspace", func(t *testing.T) {
		if want := lane.User + "\n" + a.trial.Workspace; res[bashID].IsError || !strings.Contains(res[bashID].Output, want) {
			t.Errorf("bash `id -un; pwd`: %+v, want %q", res[bashID], want)
		}
	})
	t.Run("write and edit make the lane's file in the workspace", func(t *testing.T) {
		if res[writeFile].IsError || res[editFile].IsError {
			t.Fatalf("write: %+v; edit: %+v", res[writeFile], res[editFile])
		}
		p := filepath.Join(a.trial.Workspace, "made-by-pi.txt")
		got, err := os.ReadFile(p)
		if err != nil || string(got) != edited {
			t.Fatalf("%s: %q %v, want %q (written, then edited)", p, got, err, edited)
		}
		fi, _ := os.Stat(p)
		if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != lane.UID {
			t.Errorf("%s is uid %d's, want %s's (%d)", p, st.Uid, lane.User, lane.UID)
		}
	})
	t.Run("read gives the file back", func(t *testing.T) {
		if res[readBack].IsError || !strings.Contains(res[readBack].Output, strings.TrimSpace(written)) {
			t.Errorf("read made-by-pi.txt: %+v, want %q", res[readBack], written)
		}
	})
	t.Run("ls, find and grep see the workspace", func(t *testing.T) {
		for _, c := range []struct {
			i          int
			call, want string
		}{
			{lsWorkspace, "ls . (Pi sorts names without case)", "made-by-pi.txt\nREADME\nroot-only\nsrc/"},
			{findTxt, "find *.txt", "made-by-pi.txt\nsrc/main.txt"},
			{grepNeedle, "grep need+le in **/*.txt", "src/main.txt:2: beta needle"},
		} {
			if r := res[c.i]; r.IsError || strings.TrimSpace(r.Output) != c.want {
				t.Errorf("%s: %+v, want %q", c.call, r, c.want)
			}
		}
	})
	t.Run("read of a workspace file the lane may not read is refused", func(t *testing.T) {
		// The file helper's refusal, as the API words it.
		if r := res[rootOnlyRead]; !r.IsError || r.Output != "root-only: permission denied (denied, 403)" {
			t.Errorf("read root-only: %+v, want the tool error %q", r, "root-only: permission denied (denied, 403)")
		}
	})
	t.Run("read outside the workspace is what the lane may read", func(t *testing.T) {
		if r := res[systemRead]; r.IsError || !strings.Contains(r.Output, "root:x:0:0:") {
			t.Errorf("read /etc/passwd: %+v, want its text", r)
		}
	})
	t.Run("research_note lands in the run's research folder and reads back", func(t *testing.T) {
		r := res[researchNote]
		path, ok := strings.CutPrefix(r.Output, "noted: research_read ")
		if r.IsError || !ok || !strings.HasPrefix(path, "notes/") {
			t.Fatalf("research_note: %+v, want \"noted: research_read notes/…\"", r)
		}
		body, err := os.ReadFile(filepath.Join(a.trial.ResearchDir, path))
		if err != nil || !strings.Contains(string(body), piNote) {
			t.Errorf("the note %s in the research folder: %q %v, want Pi's text", path, body, err)
		}
		if r := res[researchRead]; r.IsError || !strings.Contains(r.Output, piNote) {
			t.Errorf("research_read %s: %+v, want the note", path, r)
		}
	})
	t.Run("research_fetch goes through the API, which refuses loopback", func(t *testing.T) {
		if r := res[researchFetch]; !r.IsError || !strings.Contains(r.Output, "fetch_refused") || !strings.Contains(r.Output, "loopback") {
			t.Errorf("research_fetch of the stand-in's loopback address: %+v, want the fetcher's refusal as a tool error", r)
		}
	})
	t.Run("step records in the trial", func(t *testing.T) {
		if r := res[stepCall]; r.IsError || r.Output != "recorded 21 bytes" {
			t.Errorf("step: %+v, want \"recorded 21 bytes\"", r)
		}
	})
	for i, name := range names {
		t.Run("read of "+name+" is refused", func(t *testing.T) {
			r := res[forbiddenReads+i]
			if !r.IsError || !refusedResult(r) {
				t.Errorf("read %s (%s): %+v, want a tool error saying permission denied", forbidden[name], name, r)
			}
		})
	}
	t.Run("Pi loads the extension without its settings too", func(t *testing.T) {
		// A trial begun before the settings were written: the pi harness
		// names the extension on Pi's command line as well.
		settings := filepath.Join(a.trial.AgentDir, ".pi", "agent", "settings.json")
		if err := os.WriteFile(settings, []byte("{}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		before := len(a.provider.Turns())
		if _, stderr, code := a.agent("pi", []string{"NODE_EXTRA_CA_CERTS=" + a.provider.CAFile},
			pi, "-p", "--no-session", "--provider", "standin", "--model", "claude-standin", "again"); code != 0 {
			t.Fatalf("pi -p: exit %d; stderr: %s", code, stderr)
		}
		turns := a.provider.Turns()[before:]
		if len(turns) < 2 || len(turns[1].Results) == 0 || !strings.Contains(turns[1].Results[0].Output, lane.User+"\n") {
			t.Fatalf("bash `id -un` with no settings: %+v, want %s", turns, lane.User)
		}
	})
	t.Run("a direct connection from bash is refused", func(t *testing.T) {
		r := res[len(res)-1]
		if !r.IsError || !refusedResult(r) || strings.Contains(r.Output, "connected") {
			t.Errorf("bash connects to 127.0.0.1:%s: %+v, want a tool error saying the kernel refused", standinPort, r)
		}
	})
	t.Run("the trial ends clean", func(t *testing.T) { a.endsClean(t) })
}

// piNote is the research note Pi writes through thermite's research_note.
const piNote = "Pi-was-here-through-the-harness-API"

// TestPiShowsAnUnlistedProviderAsTheProxysRefusal: Pi, as agent-N, asked
// to use a provider the rig does not list: the egress proxy refuses the
// tunnel (the trial's event, via agent-1, with its reason), Pi shows it
// in its SDK's words, "Connection error." (the proxy's 403 is in the
// error's cause, which Pi does not print), and exits 1; under a.agent's
// --timeout a hang would be 124. Nothing reaches the listed stand-in. Its
// settings turn its retries off, as an operator may, so that it fails at
// once (with its default retries it fails after about 24 s).
func TestPiShowsAnUnlistedProviderAsTheProxysRefusal(t *testing.T) {
	pi := agentProgram(t, "pi")
	installedPiExtension(t)
	a := newAgentTrial(t, standin.Steps("never asked"), testrig.Options{})
	os.Chmod(filepath.Dir(filepath.Dir(a.provider.CAFile)), 0o755)
	// 127.0.0.2:443, in no rig's agent.egress (not port 9, as the other
	// programs' tests use: Pi's fetch refuses the fetch standard's "bad
	// ports" before it asks any proxy).
	const unlisted = "127.0.0.2:443"
	dir := filepath.Join(a.trial.AgentDir, ".pi", "agent")
	if err := os.WriteFile(filepath.Join(dir, "models.json"), piModels(t, "https://"+unlisted), 0o644); err != nil {
		t.Fatal(err)
	}
	var settings map[string]any
	raw, err := os.ReadFile(filepath.Join(dir, "settings.json"))
	if err != nil || json.Unmarshal(raw, &settings) != nil {
		t.Fatalf("agent-N's Pi settings: %s %v", raw, err)
	}
	settings["retry"] = map[string]any{"enabled": false, "provider": map[string]any{"maxRetries": 0}}
	raw, _ = json.Marshal(settings)
	if err := os.WriteFile(filepath.Join(dir, "settings.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	stdout, stderr, code := a.agent("pi", []string{"NODE_EXTRA_CA_CERTS=" + a.provider.CAFile},
		pi, "-p", "--no-session", "--provider", "standin", "--model", "claude-standin", "hello")
	t.Logf("pi -p: exit %d in %v: %q %q", code, time.Since(start).Round(time.Millisecond), stdout, stderr)
	if code != 1 || !strings.Contains(stderr, "Connection error.") {
		t.Errorf("pi -p to an unlisted provider: exit %d, %q %q; want 1 and its connection's failure", code, stdout, stderr)
	}
	if n := len(a.provider.Paths()); n != 0 {
		t.Errorf("the listed stand-in saw %d requests, want none", n)
	}
	ev := egressEvents(t, a.r, "egress.refused", unlisted, 1)
	if len(ev) == 0 || ev[0].Trial != a.trial.ID || ev[0].Data.Via != "agent-1" || ev[0].Data.Why != "not in agent.egress" {
		t.Errorf("egress.refused events for %s: %+v, want the trial %s's via agent-1, not in agent.egress", unlisted, ev, a.trial.ID)
	}
}

func TestPiWithoutThermitesExtensionIsRefused(t *testing.T) {
	pi := agentProgram(t, "pi")
	dir := filepath.Join(t.TempDir(), "pi-extension")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// The controller looks at the file as its own user.
	for d := filepath.Dir(dir); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	ext := filepath.Join(dir, "thermite.ts")
	r := testrig.New(t, testrig.Options{Extra: fmt.Sprintf("\n[agent]\npi_extension = %q\n", ext)})
	trial, _ := startTrial(t, r, 1, makeProject(t, r))
	refusal := func(fault string) string {
		return "thermite: trial agent: harness pi: thermite's Pi extension " + ext + " (agent.pi_extension): " + fault + "; `make agents` installs it root-owned 0644"
	}
	run := func(env []string, argv ...string) (string, int) {
		args := []string{"trial", "agent", trial.ID, "--harness", "pi"}
		for _, e := range env {
			args = append(args, "--env", e)
		}
		_, stderr, code := r.Thermite(append(append(args, "--"), argv...)...)
		return strings.TrimSpace(stderr), code
	}
	for _, c := range []struct {
		name  string
		setup func() error
		want  string
	}{
		{"missing", func() error { return nil }, refusal("missing")},
		{"writable by others", func() error { return os.WriteFile(ext, piExtensionSource(t), 0o666) }, refusal("writable by others (mode 0666)")},
		{"not root's", func() error { return os.Chown(ext, r.Role("agent-1").UID, 0) }, refusal(fmt.Sprintf("owned by uid %d, not root", r.Role("agent-1").UID))},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := c.setup(); err != nil {
				t.Fatal(err)
			}
			os.Chmod(ext, 0o666) // os.WriteFile's mode passes through the umask
			stderr, code := run(nil, pi, "-p", "hello")
			if code == 0 || stderr != c.want {
				t.Errorf("pi with the extension %s: exit %d, stderr %q; want the one line %q", c.name, code, stderr, c.want)
			}
		})
	}
	// In place, root's and 0644: what is refused then is what would skip it.
	if err := os.Chown(ext, 0, 0); err != nil {
		t.Fatal(err)
	}
	os.Chmod(ext, 0o644)
	for _, c := range []struct {
		name string
		env  []string
		argv []string
		want string
	}{
		{"--no-extensions", nil, []string{pi, "--no-extensions", "-p", "hello"}, "--no-extensions: Pi would skip thermite's extension"},
		{"-ne", nil, []string{pi, "-ne", "-p", "hello"}, "-ne: Pi would skip thermite's extension"},
		{"PI_CODING_AGENT_DIR", []string{"PI_CODING_AGENT_DIR=/tmp"}, []string{pi, "-p", "hello"}, "--env PI_CODING_AGENT_DIR: Pi's folder is the trial's"},
	} {
		t.Run(c.name, func(t *testing.T) {
			stderr, code := run(c.env, c.argv...)
			if code == 0 || !strings.Contains(stderr, c.want) {
				t.Errorf("pi %v %v: exit %d, stderr %q; want %q", c.env, c.argv[1:], code, stderr, c.want)
			}
		})
	}
}

func TestPiExtensionWithoutTheAPIRefusesEveryTool(t *testing.T) {
	pi := agentProgram(t, "pi")
	installedPiExtension(t)
	home := t.TempDir()
	local := filepath.Join(home, "local.txt")
	if err := os.WriteFile(local, []byte("agent-N's own file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	made := filepath.Join(home, "made-locally")
	calls := []standin.Call{
		{Name: "read", Input: map[string]any{"path": local}},
		{Name: "write", Input: map[string]any{"path": made, "content": "no\n"}},
		{Name: "edit", Input: map[string]any{"path": local, "edits": []any{map[string]any{"oldText": "own", "newText": "changed"}}}},
		{Name: "bash", Input: map[string]any{"command": "touch " + made}},
		{Name: "ls", Input: map[string]any{"path": home}},
		{Name: "find", Input: map[string]any{"pattern": "*.txt", "path": home}},
		{Name: "grep", Input: map[string]any{"pattern": "own", "path": home}},
		{Name: "research_note", Input: map[string]any{"body": "no"}},
		{Name: "research_fetch", Input: map[string]any{"url": "https://example.com/"}},
		{Name: "research_read", Input: map[string]any{"path": "local.txt"}},
		{Name: "step", Input: map[string]any{"kind": "thought"}},
	}
	var steps []standin.Step
	for i := range calls {
		steps = append(steps, standin.Step{Tool: &calls[i]})
	}
	p := standin.Start(t, home, standin.Steps("no tool worked", steps...))
	os.MkdirAll(filepath.Join(home, ".pi", "agent"), 0o700)
	if err := os.WriteFile(filepath.Join(home, ".pi", "agent", "models.json"), piModels(t, p.URL), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		env  []string
		want string
	}{
		{"no socket", nil, "thermite: THERMITE_API_SOCKET is not set: Pi's tools act only through thermite's harness API (`thermite trial agent TRIAL --harness pi`); refused"},
		{"no token", []string{"THERMITE_API_SOCKET=" + filepath.Join(home, "api.sock"), "THERMITE_TOKEN_FILE=" + filepath.Join(home, "token")},
			"thermite: the trial's token " + filepath.Join(home, "token") + ": ENOENT: no such file or directory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := len(p.Turns())
			cmd := exec.Command(pi, "-p", "--no-session", "-e", config.DefaultPiExtension, "--provider", "standin", "--model", "claude-standin", "use every tool")
			cmd.Dir = home
			cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "NODE_EXTRA_CA_CERTS=" + p.CAFile, "PI_OFFLINE=1", "PI_TELEMETRY=0"}, c.env...)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("pi -p: %v\n%s", err, out)
			}
			var res []standin.Result
			for _, turn := range p.Turns()[before:] {
				if len(turn.Results) > len(res) {
					res = turn.Results
				}
			}
			if len(res) != len(calls) {
				t.Fatalf("Pi sent back %d tool results, want %d: %+v\n%s", len(res), len(calls), res, out)
			}
			for i, r := range res {
				if !r.IsError || !strings.HasPrefix(r.Output, c.want) {
					t.Errorf("%s %v with %s: %+v, want a tool error %q", calls[i].Name, calls[i].Input, c.name, r, c.want)
				}
			}
			if _, err := os.Lstat(made); err == nil {
				t.Errorf("%s exists: a tool acted on the local file system", made)
			}
			if got, _ := os.ReadFile(local); string(got) != "agent-N's own file\n" {
				t.Errorf("%s holds %q: the edit acted on the local file system", local, got)
			}
		})
	}
}

func TestPiLocalShellRunsNothing(t *testing.T) {
	pi := agentProgram(t, "pi")
	installedPiExtension(t)
	// RPC mode's "bash" command is Pi's own, which no extension takes: Pi
	// runs it with settings.json's shellPath, which the trial's settings
	// make no-local-shell.
	home := t.TempDir()
	os.MkdirAll(filepath.Join(home, ".pi", "agent"), 0o700)
	settings := fmt.Sprintf(`{"extensions": [%q], "shellPath": %q}`, config.DefaultPiExtension, piLocalShell())
	if err := os.WriteFile(filepath.Join(home, ".pi", "agent", "settings.json"), []byte(settings), 0o600); err != nil {
		t.Fatal(err)
	}
	// A model Pi never asks: RPC mode starts only with one.
	models := `{"providers": {"none": {"baseUrl": "https://127.0.0.1:1", "api": "anthropic-messages", "apiKey": "k", "models": [{"id": "m"}]}}}`
	if err := os.WriteFile(filepath.Join(home, ".pi", "agent", "models.json"), []byte(models), 0o600); err != nil {
		t.Fatal(err)
	}
	made := filepath.Join(home, "made-locally")
	cmd := exec.Command(pi, "--mode", "rpc", "--no-session", "--provider", "none", "--model", "m")
	cmd.Dir = home
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "PI_OFFLINE=1", "PI_TELEMETRY=0"}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	in, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Pi answers while its input is open, and ends when it closes.
	io.WriteString(in, `{"id":"1","type":"bash","command":"touch `+made+`; id -un"}`+"\n")
	out, _ := bufio.NewReader(stdout).ReadString('\n')
	in.Close()
	cmd.Wait()
	var answer struct {
		Success bool `json:"success"`
		Data    struct {
			Output   string `json:"output"`
			ExitCode int    `json:"exitCode"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(out), &answer); err != nil {
		t.Fatalf("pi --mode rpc answered %q: %v; stderr %s", out, err, stderr.Bytes())
	}
	want := "thermite: Pi's local shell is off: commands run as the lane's user through thermite's extension (the bash tool, !cmd)\n"
	if answer.Data.ExitCode != 126 || answer.Data.Output != want {
		t.Errorf("RPC bash: exit %d, output %q; want 126 and %q", answer.Data.ExitCode, answer.Data.Output, want)
	}
	if _, err := os.Lstat(made); err == nil {
		t.Errorf("%s exists: Pi's local shell ran the command", made)
	}
}

func TestPiUserShellEscapeRunsAsTheLane(t *testing.T) {
	agentProgram(t, "pi")
	installedPiExtension(t)
	// A user's `!cmd` is Pi's interactive mode's, which needs a terminal:
	// testdata/pi-user-bash.mjs calls the extension's user_bash handler as
	// that mode does, as agent-N through the pi harness.
	dir := t.TempDir()
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	driver := filepath.Join(dir, "pi-user-bash.mjs")
	if err := os.WriteFile(driver, piDriver(t), 0o644); err != nil {
		t.Fatal(err)
	}
	r := testrig.New(t, testrig.Options{})
	trial, _ := startTrial(t, r, 1, makeProject(t, r))
	out, stderr, code := r.Thermite("trial", "agent", trial.ID, "--harness", "pi", "--",
		"node", driver, agentsDir(), config.DefaultPiExtension, "id -un; pwd", trial.AgentDir)
	var got struct {
		Output   string `json:"output"`
		ExitCode *int   `json:"exitCode"`
		Error    string `json:"error"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil {
		t.Fatalf("the driver: exit %d %q %s", code, out, stderr)
	}
	lane := r.Role("lane-1")
	if want := lane.User + "\n" + trial.Workspace + "\n"; got.Error != "" || got.ExitCode == nil || *got.ExitCode != 0 || got.Output != want {
		t.Errorf("!id -un; pwd: %+v, want %q with status 0", got, want)
	}
}

// piDriver is testdata/pi-user-bash.mjs.
func piDriver(t *testing.T) []byte {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(here), "testdata", "pi-user-bash.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
