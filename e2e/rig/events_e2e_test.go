package rig

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"thermite/controller/ledger"
	"thermite/internal/testrig"
)

// follower is `thermite trial events ID --follow` running, its lines
// gathered as they come.
type follower struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
	done  chan error
}

func follow(t *testing.T, r *testrig.Rig, id string) *follower {
	t.Helper()
	f := &follower{cmd: exec.Command(r.Bin, "--config", r.Config, "trial", "events", id, "--follow"), done: make(chan error, 1)}
	out, err := f.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.cmd.Process.Kill() })
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f.mu.Lock()
			f.lines = append(f.lines, sc.Text())
			f.mu.Unlock()
		}
		f.done <- f.cmd.Wait()
	}()
	return f
}

// wait waits for a line holding want, or fails saying what it saw after
// a minute (a liveness bound: an agent program starts slowly on a busy
// machine).
func (f *follower) wait(t *testing.T, want string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		f.mu.Lock()
		text := strings.Join(f.lines, "\n")
		f.mu.Unlock()
		if strings.Contains(text, want) {
			return
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	t.Fatalf("trial events --follow did not show %q; it showed:\n%s", want, strings.Join(f.lines, "\n"))
}

// freePort is a port of 127.0.0.1 nothing listens on.
func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(l.Addr().String())
	l.Close()
	return port
}

// TestTrialEventsShowTunnelsRefusalsCallsAndCommands: what an operator
// sees of a trial's agent with `thermite trial events`: its commands,
// the agent's start and end, each tunnel, each refusal with its reason
// (a host not in agent.egress; a listed provider that does not answer),
// its API calls by route, and by tool where the trial client's MCP server
// made them; --follow shows what happens after it started
// and exits 0 at the trial's end; an ended trial reads the same from the
// ledger; an unknown trial is one line naming it.
func TestTrialEventsShowTunnelsRefusalsCallsAndCommands(t *testing.T) {
	testrig.RequireRoot(t)
	provider := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "provider says hi") }))
	t.Cleanup(provider.Close)
	_, port, _ := net.SplitHostPort(provider.Listener.Addr().String())
	down := freePort(t)
	r := testrig.New(t, testrig.Options{Extra: "\n[agent]\negress = [\"127.0.0.1:" + port + "\", \"127.0.0.1:" + down + "\"]\n"})
	info, a := startTrial(t, r, 1, makeProject(t, r))
	unlisted := "127.0.0.1:" + freePort(t)

	f := follow(t, r, info.ID)
	f.wait(t, "trial.start        lane 1: ")

	// Made after the follower started: each must show in it.
	if _, stderr, code := r.Thermite("trial", "exec", info.ID, "--", "sh", "-c", "exit 3"); code != 3 {
		t.Fatalf("trial exec: exit %d %s", code, stderr)
	}
	if _, stderr, code := r.Thermite(append([]string{"trial", "agent", info.ID, "--harness", "lane", "--"}, curlArgv(provider, "https://"+unlisted+"/")...)...); code == 0 || !strings.Contains(stderr, "403") {
		t.Fatalf("lane harness curl to an unlisted host: exit %d %s, want the proxy's 403", code, stderr)
	}
	if _, stderr, code := r.Thermite(append([]string{"trial", "agent", info.ID, "--"}, curlArgv(provider, "https://127.0.0.1:"+down+"/")...)...); code == 0 {
		t.Fatalf("curl to a listed provider that does not answer: exit 0 %s", stderr)
	}
	if out, stderr, code := r.Thermite(append([]string{"trial", "agent", info.ID, "--harness", "lane", "--"}, curlArgv(provider, "https://127.0.0.1:"+port+"/")...)...); code != 0 || out != "provider says hi" {
		t.Fatalf("lane harness curl to the provider: exit %d %q %s", code, out, stderr)
	}
	if code, _, raw := a.do("POST", "/v1/fs/read", map[string]any{"path": "README"}); code != 200 {
		t.Fatalf("fs/read: %d %s", code, raw)
	}
	// The trial client's MCP server, as an agent program starts it.
	s := mcpSession(t, r, "agent-1", "THERMITE_API_SOCKET="+info.APISocket, "THERMITE_TOKEN="+a.token)
	if text, isErr := callTool(t, s, "fs_list", map[string]any{"path": "."}); isErr {
		t.Fatalf("MCP fs_list: %s", text)
	}
	want := []string{
		"trial.exec         sh as lane-1: exit 3 after ",
		"trial.agent.start  sh as lane-1 (harness lane)",
		"egress.refused     tunnel to " + unlisted + " via lane-1 refused: not in agent.egress",
		"trial.agent        sh as lane-1 (harness lane) ended: exit ",
		"trial.agent.start  sh as agent-1 (harness pi)",
		"egress.refused     tunnel to 127.0.0.1:" + down + " via agent-1 refused: connection refused",
		"egress.open        tunnel to 127.0.0.1:" + port + " via lane-1 opened (127.0.0.1:" + port + ")",
		"egress             tunnel to 127.0.0.1:" + port + " via lane-1 closed: ",
		"api                POST /v1/fs/read (fs_read): 200 in ",
		"api                MCP tool fs_list: POST /v1/fs/list (fs_list): 200 in ",
	}
	for _, w := range want {
		f.wait(t, w)
	}
	if _, stderr, code := r.Thermite("trial", "end", info.ID); code != 0 {
		t.Fatalf("trial end: %s", stderr)
	}
	select {
	case err := <-f.done:
		if err != nil {
			t.Fatalf("trial events --follow at the trial's end: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("trial events --follow went on after the trial ended")
	}
	f.wait(t, "trial.end          ended; ")

	t.Run("an ended trial from the ledger", func(t *testing.T) {
		out, stderr, code := r.Thermite("trial", "events", info.ID)
		if code != 0 {
			t.Fatalf("trial events: exit %d %s", code, stderr)
		}
		for _, w := range append(want, "trial.start", "trial.end          ended; ") {
			if !strings.Contains(out, w) {
				t.Errorf("trial events of the ended trial lacks %q:\n%s", w, out)
			}
		}
		js, _, code := r.Thermite("trial", "events", info.ID, "--json")
		refused := 0
		for _, line := range strings.Split(strings.TrimSpace(js), "\n") {
			var e ledger.Event
			if err := json.Unmarshal([]byte(line), &e); err != nil || e.Trial != info.ID {
				t.Fatalf("--json line %q: %v", line, err)
			}
			var d struct{ Target, Why string }
			json.Unmarshal(e.Data, &d)
			if e.Kind == "egress.refused" && d.Target == unlisted && d.Why == "not in agent.egress" {
				refused++
			}
		}
		if code != 0 || refused != 1 {
			t.Errorf("--json: exit %d, %d egress.refused of %s with its reason, want 1:\n%s", code, refused, unlisted, js)
		}
	})

	t.Run("an unknown trial", func(t *testing.T) {
		out, stderr, code := r.Thermite("trial", "events", "tnosuchtrial")
		if code == 0 || out != "" || stderr != "thermite: trial events: trial: no trial tnosuchtrial\n" {
			t.Errorf("trial events of an unknown trial: exit %d %q %q", code, out, stderr)
		}
	})
}

// TestClaudeCodeSilentOnADownProviderShowsWhyInTrialEvents: the case
// that showed the need. Claude Code, given a provider that is listed but
// does not answer, prints nothing and retries for minutes; the operator
// following the trial's events sees each refused tunnel and its reason
// while it waits, and ending the trial ends both the agent's run and the
// follower.
func TestClaudeCodeSilentOnADownProviderShowsWhyInTrialEvents(t *testing.T) {
	claude := agentProgram(t, "claude")
	down := freePort(t)
	r := testrig.New(t, testrig.Options{Extra: "\n[agent]\negress = [\"127.0.0.1:" + down + "\"]\n"})
	info, _ := startTrial(t, r, 1, makeProject(t, r))
	f := follow(t, r, info.ID)
	ran := make(chan string, 1)
	go func() {
		out, stderr, code := r.Thermite("trial", "agent", info.ID, "--harness", "lane", "--timeout", "5m",
			"--env", "ANTHROPIC_BASE_URL=https://127.0.0.1:"+down, "--env", "ANTHROPIC_API_KEY=sk-standin", "--env", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
			"--", claude, "-p", "say hi")
		ran <- "exit " + itoa(code) + " " + out + stderr
	}()
	f.wait(t, "trial.agent.start  claude as lane-1 (harness lane)")
	f.wait(t, "egress.refused     tunnel to 127.0.0.1:"+down+" via lane-1 refused: connection refused")
	select {
	case res := <-ran:
		t.Fatalf("Claude Code ended before the trial did: %s", res)
	default:
	}
	if _, stderr, code := r.Thermite("trial", "end", info.ID); code != 0 {
		t.Fatalf("trial end: %s", stderr)
	}
	select {
	case res := <-ran:
		if strings.HasPrefix(res, "exit 0 ") {
			t.Errorf("Claude Code's run, its trial ended: %s", res)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Claude Code's run went on after its trial ended")
	}
	select {
	case err := <-f.done:
		if err != nil {
			t.Fatalf("trial events --follow: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("trial events --follow went on after the trial ended")
	}
	f.wait(t, "trial.agent        claude as lane-1 (harness lane) ended: ")
}
