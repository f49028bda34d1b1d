package rig

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"thermite/controller"
	"thermite/internal/testrig"
)

// TestExecStreamKeepsBytesWhole runs commands through the harness API as
// the lane: text whose characters straddle the controller's 32 KiB reads
// comes back as the same text with no U+FFFD, bytes that are not UTF-8
// come back as themselves in data_b64, stdin reaches the command, cwd
// inside the workspace is where it runs, and a cwd outside is refused.
func TestExecStreamKeepsBytesWhole(t *testing.T) {
	r := newRig(t)
	p := makeProject(t, r)
	info, a := startTrial(t, r, 1, p)

	t.Run("a character at a read boundary is not split", func(t *testing.T) {
		// 32767 bytes then é: its two bytes lie across the first read.
		script := `head -c 32767 /dev/zero | tr '\0' a; printf '\303\251'; printf '\342\202\254%.0s' $(seq 1 20000)`
		code, _, raw := a.do("POST", "/v1/exec", map[string]any{"argv": []string{"sh", "-c", script}})
		out, final := frames(t, raw)
		want := strings.Repeat("a", 32767) + "é" + strings.Repeat("€", 20000)
		if code != 200 || final.ExitCode != 0 || out != want {
			t.Fatalf("exit %+v, %d bytes back, want %d", final, len(out), len(want))
		}
		for _, l := range strings.Split(strings.TrimSpace(raw), "\n") {
			var f controller.ExecFrame
			json.Unmarshal([]byte(l), &f)
			if f.DataB64 != nil || strings.ContainsRune(f.Data, utf8.RuneError) {
				t.Fatalf("a text frame went as bytes or with U+FFFD: %.120s", l)
			}
		}
	})

	t.Run("binary output travels as base64 bytes", func(t *testing.T) {
		code, _, raw := a.do("POST", "/v1/exec", map[string]any{"argv": []string{"printf", `ok\377\376\000end`}})
		out, _ := frames(t, raw)
		if code != 200 || out != "ok\xff\xfe\x00end" || !strings.Contains(raw, `"data_b64":"//4="`) {
			t.Fatalf("%d %q %s", code, out, raw)
		}
	})

	t.Run("stdin and cwd", func(t *testing.T) {
		code, _, raw := a.do("POST", "/v1/exec", map[string]any{"argv": []string{"sh", "-c", "pwd; cat"}, "cwd": "src", "stdin": "from stdin\n"})
		out, final := frames(t, raw)
		if code != 200 || final.ExitCode != 0 || out != info.Workspace+"/src\nfrom stdin\n" {
			t.Fatalf("%d %q %+v", code, out, final)
		}
		code, _, raw = a.do("POST", "/v1/exec", map[string]any{"argv": []string{"wc", "-c"}, "stdin_b64": []byte{0xff, 0, 1}})
		if out, _ = frames(t, raw); code != 200 || strings.TrimSpace(out) != "3" {
			t.Fatalf("stdin_b64: %d %q", code, out)
		}
	})

	t.Run("a cwd outside the workspace is refused", func(t *testing.T) {
		for _, cwd := range []string{"../agent", "/etc", info.AgentDir} {
			code, _, raw := a.do("POST", "/v1/exec", map[string]any{"argv": []string{"pwd"}, "cwd": cwd})
			if code != 400 || !strings.Contains(raw, "cwd") {
				t.Errorf("cwd %q: %d %s", cwd, code, raw)
			}
		}
	})
}

// TestHarnessAPIKeepsItsDocument drives a real controller: the scheme
// "bearer" in lower case is taken, a known path with a wrong method is
// 405 with Allow, the file helper's root is refused as an unknown field,
// refusals are RFC 9457 problems naming no type of the server's, the
// served document is docs/openapi.json, and no answer of the whole run
// had a status the document does not declare (the controller logs any).
func TestHarnessAPIKeepsItsDocument(t *testing.T) {
	r := newRig(t)
	p := makeProject(t, r)
	_, a := startTrial(t, r, 1, p)

	lower := &agentClient{t: t, socket: a.socket}
	req := func(method, path, auth, body string) (int, http.Header, string) {
		hr, _ := http.NewRequest(method, "http://api"+path, strings.NewReader(body))
		if auth != "" {
			hr.Header.Set("Authorization", auth)
		}
		resp, err := unixClient(lower.socket).Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(raw)
	}
	if code, _, raw := req("GET", "/v1/trial", "bearer "+a.token, ""); code != 200 {
		t.Errorf("scheme bearer in lower case: %d %s", code, raw)
	}
	if code, h, raw := req("GET", "/v1/fs/read", "Bearer "+a.token, ""); code != 405 || h.Get("Allow") != "POST" || !strings.Contains(raw, `"code":"method_not_allowed"`) {
		t.Errorf("GET /v1/fs/read: %d Allow %q %s", code, h.Get("Allow"), raw)
	}
	for body, code := range map[string]string{
		`{"path":"README","root":1}`:  "unknown_field",
		`{"path":"README","Root":1}`:  "unknown_field",
		`[]`:                          "bad_json",
		`{"path":["README"]}`:         "bad_field",
		`{"path":"../../etc/passwd"}`: "escape",
	} {
		status, h, raw := req("POST", "/v1/fs/read", "Bearer "+a.token, body)
		var prob controller.Problem
		json.Unmarshal([]byte(raw), &prob)
		if status/100 != 4 || prob.Code != code || prob.Status != status || h.Get("Content-Type") != "application/problem+json" ||
			strings.Contains(raw, "lanefs") || strings.Contains(raw, "Go value") || strings.Contains(raw, "controller.") {
			t.Errorf("fs/read %s: %d %s, want code %s", body, status, raw, code)
		}
	}
	code, _, raw := req("GET", "/v1/openapi.json", "", "")
	file, _ := os.ReadFile(filepath.Join(testrig.ModuleRoot(), "docs", "openapi.json"))
	if code != 200 || raw != string(file) {
		t.Errorf("GET /v1/openapi.json: %d, not docs/openapi.json", code)
	}
	// Every route once, well and badly, then the log.
	for _, path := range []string{"/v1/fs/list", "/v1/fs/stat", "/v1/fs/find", "/v1/fs/grep", "/v1/research/list", "/v1/research/search", "/v1/steps", "/v1/research/note", "/v1/fetch", "/v1/exec"} {
		req("POST", path, "Bearer "+a.token, `{}`)
		req("POST", path, "Bearer "+a.token, `{"nope":1}`)
		req("POST", path, "", `{}`)
	}
	if !strings.Contains(r.LogText(), "controller serving") {
		t.Fatal("the rig's log holds none of the controller's lines: the check below would see nothing")
	}
	if strings.Contains(r.LogText(), "not in the API document") {
		t.Errorf("an answer's status is not in the document:\n%s", grepLines(r.LogText(), "not in the API document"))
	}
}

func unixClient(socket string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}}
}

func grepLines(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// asAgent runs thermite-trial (as `thermite trial-client`) as the trial's
// agent-N, in its folder, with the environment thermite gives it, through
// sh so that it may read stdin from a pipe; it returns what the client
// printed and its exit status.
func asAgent(t *testing.T, r *testrig.Rig, trial, script string) (string, string, int) {
	t.Helper()
	out, stderr, code := r.Thermite("trial", "agent", trial, "--", "sh", "-c", "tt() { "+r.Bin+" trial-client \"$@\"; }; "+script)
	return out, stderr, code
}

// TestTrialClientAsAgentReachesOnlyItsTrial drives a trial only through
// thermite-trial, run as agent-1 with the environment thermite gives it:
// it reads and writes its lane's workspace (which agent-1 cannot open
// itself), runs commands as the lane with their exit status, records steps
// and notes that read back; it is refused, in one line and a non-zero
// status, a path out of the workspace, a fetch of loopback, a wrong token,
// and a missing environment.
func TestTrialClientAsAgentReachesOnlyItsTrial(t *testing.T) {
	r := newRig(t)
	p := makeProject(t, r)
	info, _ := startTrial(t, r, 1, p)
	info2, _ := startTrial(t, r, 2, p)
	lane1 := r.Role("lane-1")

	t.Run("the trial and the workspace through the client", func(t *testing.T) {
		out, stderr, code := asAgent(t, r, info.ID, `tt trial && echo "new text" | tt fs write notes/a.txt --parents && tt fs read notes/a.txt && tt fs edit notes/a.txt new old && tt fs read notes/a.txt && tt fs list && tt fs grep needle && tt fs find --glob '*.txt' && tt fs stat README && tt fs mkdir d && tt fs delete d`)
		for _, want := range []string{"trial      " + info.ID, "workspace  " + info.Workspace, "wrote 9 bytes to notes/a.txt", "new text\n", "old text\n", "src/main.txt:2:beta needle", "notes/a.txt", "file 14 bytes", "made d", "removed 1"} {
			if !strings.Contains(out, want) {
				t.Errorf("missing %q", want)
			}
		}
		if code != 0 {
			t.Fatalf("exit %d: %s\n%s", code, stderr, out)
		}
		if _, _, code := asAgent(t, r, info.ID, "cat "+info.Workspace+"/README"); code == 0 {
			t.Fatal("agent-1 reads the workspace itself: the client is not what gives it access")
		}
	})

	t.Run("exec as the lane, with its status", func(t *testing.T) {
		out, _, code := asAgent(t, r, info.ID, "tt exec -- id -u")
		if code != 0 || strings.TrimSpace(out) != itoa(lane1.UID) {
			t.Fatalf("exec id -u: %d %q", code, out)
		}
		if _, _, code := asAgent(t, r, info.ID, "tt exec -- sh -c 'exit 7'"); code != 7 {
			t.Fatalf("exit 7 came back as %d", code)
		}
		out, _, code = asAgent(t, r, info.ID, "printf 'in\\n' | tt exec --stdin --cwd src -- sh -c 'pwd; cat'")
		if code != 0 || out != info.Workspace+"/src\nin\n" {
			t.Fatalf("stdin and cwd: %d %q", code, out)
		}
	})

	t.Run("research: note, read back, step, --json", func(t *testing.T) {
		out, stderr, code := asAgent(t, r, info.ID, "tt research note --title found 'the needle is in src'")
		if code != 0 || !strings.HasPrefix(out, "notes/") {
			t.Fatalf("note: %d %q %s", code, out, stderr)
		}
		out, _, code = asAgent(t, r, info.ID, "tt research read "+strings.TrimSpace(out)+" && tt research search needle && tt step thought 'looked at src' && tt --json trial")
		if code != 0 || !strings.Contains(out, "the needle is in src") || !strings.Contains(out, "recorded 13 bytes") || !strings.Contains(out, `"id": "`+info.ID+`"`) {
			t.Fatalf("read back: %d %q", code, out)
		}
	})

	t.Run("refused in one line with a non-zero status", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		for _, c := range []struct{ script, want string }{
			{"tt fs read ../../" + filepath.Base(filepath.Dir(info2.Workspace)) + "/workspace/README", "(escape, 403)"},
			{"tt fs read " + info2.Workspace + "/README", "(escape, 403)"},
			{"tt research fetch http://" + l.Addr().String() + "/", "(fetch_refused, 403)"},
			{"THERMITE_TOKEN=" + strings.Repeat("0", 64) + " tt trial", "a valid trial token is required (unauthorized, 401)"},
			{"env -u THERMITE_TOKEN_FILE HOME=/nonexistent " + r.Bin + " trial-client trial", "no trial token: THERMITE_TOKEN and THERMITE_TOKEN_FILE are unset"},
			{"tt exec --cwd /etc -- pwd", "field cwd"},
			{"tt fs frobnicate", `no command "fs frobnicate"`},
		} {
			_, stderr, code := asAgent(t, r, info.ID, c.script)
			if code != 1 || !strings.Contains(stderr, c.want) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.HasPrefix(stderr, "thermite-trial: ") {
				t.Errorf("%s: exit %d %q, want 1 and one line with %q", c.script, code, stderr, c.want)
			}
		}
	})

	t.Run("chosen by its name", func(t *testing.T) {
		link := filepath.Join(t.TempDir(), "thermite-trial")
		if err := os.Symlink(r.Bin, link); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(link, "trial")
		cmd.Env = []string{"THERMITE_API_SOCKET=" + r.Cfg.APISocket(), "THERMITE_TOKEN_FILE=" + info.TokenFile}
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "trial      "+info.ID) {
			t.Fatalf("thermite-trial trial: %v %s", err, out)
		}
	})
}

// mcpSession starts `thermite-trial mcp` as role through the broker
// (run-as passes stdio), with env, and connects the MCP SDK's own client:
// the initialize handshake is part of Connect.
func mcpSession(t *testing.T, r *testrig.Rig, role string, env ...string) *mcp.ClientSession {
	t.Helper()
	args := []string{"--config", r.Config, "run-as", role}
	for _, e := range env {
		args = append(args, "--env", e)
	}
	args = append(args, "--", r.Bin, "trial-client", "mcp")
	client := mcp.NewClient(&mcp.Implementation{Name: "thermite-test", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.Command(r.Bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	s, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("MCP initialize as %s: %v\n%s", role, err, stderr.String())
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// callTool calls one tool and returns its text and whether it was a tool
// error.
func callTool(t *testing.T, s *mcp.ClientSession, name string, args map[string]any) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("tools/call %s: %v", name, err)
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String(), res.IsError
}

// TestMCPToolsReachOnlyTheTrial speaks MCP, with the SDK's own client, to
// thermite-trial run as agent-1 (its token file, as thermite gives it)
// and as lane-1 (a lane harness run's token, while the run lasts): the
// tools are listed with input schemas; a fetch of loopback and a path out
// of the workspace are tool errors naming why; a note reads back; exec
// runs as the lane. The lane cannot borrow the agent's token file.
func TestMCPToolsReachOnlyTheTrial(t *testing.T) {
	r := newRig(t)
	p := makeProject(t, r)
	info, _ := startTrial(t, r, 1, p)
	lane1 := r.Role("lane-1")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "secret") }))

	// A lane's socket serves a lane harness run's token alone.
	for _, who := range []struct{ role, env string }{
		{"agent-1", "THERMITE_TOKEN_FILE=" + info.TokenFile},
		{"lane-1", "THERMITE_TOKEN=" + startLaneRun(t, r, info.ID).token},
	} {
		t.Run("as "+who.role, func(t *testing.T) {
			s := mcpSession(t, r, who.role, "THERMITE_API_SOCKET="+r.Cfg.RoleAPISocket(who.role), who.env)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			tools, err := s.ListTools(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			have := map[string]*mcp.Tool{}
			for _, tl := range tools.Tools {
				have[tl.Name] = tl
			}
			for _, want := range []string{"trial_info", "fs_read", "fs_write", "fs_edit", "fs_list", "fs_grep", "fs_find", "fs_stat", "fs_delete", "fs_mkdir", "exec", "research_fetch", "research_note", "research_read", "research_list", "research_grep", "research_find", "research_stat", "step"} {
				tl := have[want]
				if tl == nil || tl.Description == "" || tl.InputSchema == nil {
					t.Errorf("tool %s missing or without description and input schema", want)
				}
			}
			schema, _ := json.Marshal(have["exec"].InputSchema)
			if !strings.Contains(string(schema), `"argv"`) || !strings.Contains(string(schema), `"required":["argv"]`) {
				t.Errorf("exec's input schema %s", schema)
			}

			text, isErr := callTool(t, s, "research_fetch", map[string]any{"url": "http://" + l.Addr().String() + "/"})
			if !isErr || !strings.Contains(text, "fetch_refused") || !strings.Contains(text, "loopback") || strings.Contains(text, "secret") {
				t.Errorf("fetch of loopback: error %v %q", isErr, text)
			}
			text, isErr = callTool(t, s, "research_note", map[string]any{"title": "from " + who.role, "body": "seen by " + who.role})
			path, ok := strings.CutPrefix(text, "noted: research_read ")
			if isErr || !ok {
				t.Fatalf("note: %v %q", isErr, text)
			}
			if text, isErr = callTool(t, s, "research_read", map[string]any{"path": path}); isErr || !strings.Contains(text, "seen by "+who.role) {
				t.Errorf("read the note back: %v %q", isErr, text)
			}
			if text, isErr = callTool(t, s, "exec", map[string]any{"argv": []string{"id", "-u"}}); isErr || !strings.Contains(text, "exit status 0\n--- stdout\n"+itoa(lane1.UID)+"\n") {
				t.Errorf("exec id -u: %v %q", isErr, text)
			}
			if text, isErr = callTool(t, s, "exec", map[string]any{"argv": []string{"sh", "-c", "exit 3"}}); isErr || !strings.HasPrefix(text, "exit status 3") {
				t.Errorf("exec exit 3: %v %q", isErr, text)
			}
			if text, isErr = callTool(t, s, "fs_read", map[string]any{"path": "../agent/token"}); !isErr || !strings.Contains(text, "escape") {
				t.Errorf("fs_read out of the workspace: %v %q", isErr, text)
			}
			if text, isErr = callTool(t, s, "exec", map[string]any{"argv": []string{"pwd"}, "cwd": "/etc"}); !isErr || !strings.Contains(text, "cwd") {
				t.Errorf("exec in /etc: %v %q", isErr, text)
			}
		})
	}

	t.Run("the lane cannot borrow the agent's token file", func(t *testing.T) {
		_, stderr, code := r.Thermite("run-as", "lane-1", "--env", "THERMITE_API_SOCKET="+r.Cfg.RoleAPISocket("lane-1"), "--env", "THERMITE_TOKEN_FILE="+info.TokenFile, "--", r.Bin, "trial-client", "trial")
		if code != 1 || !strings.Contains(stderr, "the trial token (THERMITE_TOKEN_FILE)") || !strings.Contains(stderr, "permission denied") {
			t.Fatalf("exit %d %q", code, stderr)
		}
	})
}

// TestAgentHarnessesWithTheirOwnLimits runs a trial's agent both ways.
// pi: as agent-N under agent.wall_timeout (a request of 2h is taken, one
// over the rig's 12h refused, a short one stops the run with 124), its
// output streamed whole past the lane's 1 MiB cap. lane: as the lane's
// user in the workspace, with a home of its own holding the token and an
// MCP configuration for each agent program, whose command works as the
// lane; the lane harness cannot read the agent's folder, nor agent-N the
// lane harness's token.
func TestAgentHarnessesWithTheirOwnLimits(t *testing.T) {
	r := newRig(t)
	p := makeProject(t, r)
	info, _ := startTrial(t, r, 1, p)
	lane1 := r.Role("lane-1")

	t.Run("pi: hours, not minutes", func(t *testing.T) {
		if _, stderr, code := r.Thermite("trial", "agent", info.ID, "--timeout", "2h", "--", "true"); code != 0 {
			t.Fatalf("--timeout 2h: exit %d %s", code, stderr)
		}
		_, stderr, code := r.Thermite("trial", "agent", info.ID, "--timeout", "13h", "--", "true")
		if code != 1 || !strings.Contains(stderr, "over the rig's agent.wall_timeout of 12h0m0s") {
			t.Fatalf("--timeout 13h: exit %d %q", code, stderr)
		}
		_, stderr, code = r.Thermite("trial", "agent", info.ID, "--timeout", "1s", "--", "sleep", "30")
		if code != 124 || !strings.Contains(stderr, "timed out") {
			t.Fatalf("--timeout 1s -- sleep 30: exit %d %q", code, stderr)
		}
		out, _, code := r.Thermite("trial", "agent", info.ID, "--", "head", "-c", "3000000", "/dev/zero")
		if code != 0 || len(out) != 3000000 {
			t.Fatalf("3 MB of output: exit %d, %d bytes", code, len(out))
		}
	})

	home := filepath.Join(filepath.Dir(info.Workspace), "lane")
	t.Run("lane: the lane's user, in the workspace, with its MCP configuration", func(t *testing.T) {
		out, stderr, code := r.Thermite("trial", "agent", info.ID, "--harness", "lane", "--", "sh", "-c", `id -u; pwd; echo "$HOME"; `+r.Bin+` trial-client trial`)
		want := itoa(lane1.UID) + "\n" + info.Workspace + "\n" + home + "\n"
		if code != 0 || !strings.HasPrefix(out, want) || !strings.Contains(out, "trial      "+info.ID) {
			t.Fatalf("exit %d %q %s; want %q first", code, out, stderr, want)
		}
		var claude struct {
			MCPServers map[string]struct {
				Command string   `json:"command"`
				Args    []string `json:"args"`
			} `json:"mcpServers"`
		}
		raw, err := os.ReadFile(filepath.Join(home, ".claude.json"))
		if err != nil || json.Unmarshal(raw, &claude) != nil {
			t.Fatalf(".claude.json: %v %s", err, raw)
		}
		srv := claude.MCPServers["thermite"]
		if n := len(srv.Args); n == 0 || srv.Args[n-1] != "mcp" {
			t.Fatalf("claude's server %+v", srv)
		}
		// The configured command, asked for the trial instead of MCP, as
		// the lane while a lane harness run holds its token.
		run := startLaneRun(t, r, info.ID)
		argv := append([]string{"run-as", "lane-1", "--", srv.Command}, srv.Args[:len(srv.Args)-1]...)
		if out, stderr, code := r.Thermite(append(argv, "trial")...); code != 0 || !strings.Contains(out, "trial      "+info.ID) {
			t.Fatalf("the configured server's command as lane-1: exit %d %q %s", code, out, stderr)
		}
		run.stop()
		for _, f := range []string{".codex/config.toml", ".config/opencode/opencode.json"} {
			raw, err := os.ReadFile(filepath.Join(home, f))
			if err != nil || !strings.Contains(string(raw), run.file) || !strings.Contains(string(raw), r.Cfg.RoleAPISocket("lane-1")) {
				t.Errorf("%s: %v %s", f, err, raw)
			}
		}
	})

	t.Run("lane: thermite-trial reaches the trial's tools and no more", func(t *testing.T) {
		info2, _ := startTrial(t, r, 2, p)
		tt := r.Bin + " trial-client "
		out, stderr, code := r.Thermite("trial", "agent", info.ID, "--harness", "lane", "--", "sh", "-c",
			tt+"fs read README && "+tt+"exec -- id -u && "+tt+"research note 'from the lane harness' && "+tt+"step thought lane")
		if code != 0 || !strings.Contains(out, "hello project\n"+itoa(lane1.UID)+"\nnotes/") || !strings.Contains(out, "recorded 4 bytes") {
			t.Fatalf("exit %d %q %s", code, out, stderr)
		}
		for _, c := range []struct{ script, want string }{
			{tt + "fs read " + info2.Workspace + "/README", "(escape, 403)"},
			{tt + "fs write ../agent/x < /dev/null", "(escape, 403)"},
			{"touch " + filepath.Join(info.ResearchDir, "notes", "forged.md"), "Permission denied"},
			{"cat " + filepath.Join(info2.Workspace, "README"), "Permission denied"},
		} {
			_, stderr, code := r.Thermite("trial", "agent", info.ID, "--harness", "lane", "--", "sh", "-c", c.script)
			if code == 0 || !strings.Contains(stderr, c.want) {
				t.Errorf("%s: exit %d %q, want %q", c.script, code, stderr, c.want)
			}
		}
	})

	t.Run("each harness stays out of the other's token", func(t *testing.T) {
		if _, _, code := r.Thermite("trial", "agent", info.ID, "--harness", "lane", "--", "cat", info.TokenFile); code == 0 {
			t.Error("the lane harness read the agent's token")
		}
		run := startLaneRun(t, r, info.ID)
		if _, stderr, code := r.Thermite("trial", "agent", info.ID, "--", "cat", run.file); code == 0 || !strings.Contains(stderr, "Permission denied") {
			t.Errorf("agent-1 reads the running lane harness's token %s: exit %d %q, want EACCES", run.file, code, stderr)
		}
		_, stderr, code := r.Thermite("trial", "agent", info.ID, "--harness", "judge", "--", "true")
		if code != 1 || !strings.Contains(stderr, `harness: "judge" is not one of pi, lane`) {
			t.Errorf("--harness judge: exit %d %q", code, stderr)
		}
	})
}

// TestEgressProxyToListedProviderOnly stands a local TLS server in for a
// model provider and lists it in agent.egress (its IP literal, and the
// name localhost): a CONNECT with the trial's token over the API's unix
// socket reaches it and the tunnel is recorded for the trial; one to a
// host not listed, one to a listed name that resolves to loopback
// (checked at dial time), and one without a token are refused; and the
// agent is given HTTPS_PROXY, its own proxy's address.
func TestEgressProxyToListedProviderOnly(t *testing.T) {
	provider := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "provider says hi") }))
	defer provider.Close()
	_, port, _ := net.SplitHostPort(provider.Listener.Addr().String())
	r := testrig.New(t, testrig.Options{Extra: "\n[agent]\negress = [\"127.0.0.1:" + port + "\", \"localhost:" + port + "\"]\n"})
	p := makeProject(t, r)
	info, a := startTrial(t, r, 1, p)

	connect := func(target, auth string) (int, string, net.Conn) {
		conn, err := net.Dial("unix", r.Cfg.APISocket())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n", target, target)
		if auth != "" {
			fmt.Fprintf(conn, "Proxy-Authorization: %s\r\n", auth)
		}
		io.WriteString(conn, "\r\n")
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
		if err != nil {
			t.Fatalf("CONNECT %s: %v", target, err)
		}
		if resp.StatusCode != 200 {
			raw, _ := io.ReadAll(resp.Body)
			conn.Close()
			return resp.StatusCode, string(raw), nil
		}
		return 200, "", conn
	}
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("trial:"+a.token))

	t.Run("the listed provider, over the API's socket", func(t *testing.T) {
		code, raw, conn := connect("127.0.0.1:"+port, basic)
		if code != 200 {
			t.Fatalf("CONNECT: %d %s", code, raw)
		}
		defer conn.Close()
		pool := x509.NewCertPool()
		pool.AddCert(provider.Certificate())
		tc := tls.Client(conn, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
		io.WriteString(tc, "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
		body, _ := io.ReadAll(tc)
		if !strings.Contains(string(body), "provider says hi") {
			t.Fatalf("through the tunnel: %q", body)
		}
	})

	t.Run("refused: not listed, a listed name at loopback, no token", func(t *testing.T) {
		for _, c := range []struct {
			target, auth, want string
			code               int
		}{
			{"example.com:443", basic, `"code":"egress_refused"`, 403},
			{"127.0.0.1:22", basic, "not in the rig's agent.egress", 403},
			{"localhost:" + port, basic, "loopback", 403},
			{"127.0.0.1:" + port, "", `"code":"unauthorized"`, 407},
			{"127.0.0.1:" + port, "Basic " + base64.StdEncoding.EncodeToString([]byte("trial:"+strings.Repeat("0", 64))), "trial's token", 407},
		} {
			if code, raw, _ := connect(c.target, c.auth); code != c.code || !strings.Contains(raw, c.want) {
				t.Errorf("CONNECT %s: %d %s, want %d with %q", c.target, code, raw, c.code, c.want)
			}
		}
	})

	t.Run("each tunnel is recorded for its trial", func(t *testing.T) {
		// A tunnel is recorded when it closes, just after the client's end.
		var out string
		for range 50 {
			if out, _, _ = r.Thermite("ledger", "export"); strings.Contains(out, `"egress"`) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if !strings.Contains(out, `"egress"`) || !strings.Contains(out, "127.0.0.1:"+port) || !strings.Contains(out, "egress.refused") {
			t.Fatalf("no egress events in the ledger")
		}
	})

	t.Run("the agent is given the socket and its own proxy, no TCP address of the API", func(t *testing.T) {
		// The agent's one TCP address is its egress proxy, in its own
		// network namespace (egress_e2e_test.go); the API is its socket.
		out, stderr, code := r.Thermite("trial", "agent", info.ID, "--", "sh", "-c", `echo "[$HTTPS_PROXY|$THERMITE_API_URL|$THERMITE_API_SOCKET]"`)
		if code != 0 || strings.TrimSpace(out) != "[http://127.0.0.1:3128||"+info.APISocket+"]" {
			t.Fatalf("agent's environment: exit %d %q %s", code, out, stderr)
		}
	})
}
