package controller

import (
	"reflect"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

// Codex's config.toml in the lane's home: its own sandbox and approvals
// off (the rig is its sandbox), nothing sent home, thermite's MCP server.
func TestCodexConfigTurnsOffItsSandboxAndKeepsTheMCPServer(t *testing.T) {
	files := codexFiles(mcpServer{command: "/opt/thermite/bin/thermite", args: []string{"trial-client", "--socket", `/run/a "b".sock`, "mcp"}})
	if len(files) != 1 || files[0].path != ".codex/config.toml" {
		t.Fatalf("files %+v, want .codex/config.toml", files)
	}
	var cfg struct {
		SandboxMode    string `toml:"sandbox_mode"`
		ApprovalPolicy string `toml:"approval_policy"`
		UpdateCheck    *bool  `toml:"check_for_update_on_startup"`
		Analytics      struct{ Enabled *bool }
		Feedback       struct{ Enabled *bool }
		Features       struct {
			Plugins                    *bool
			UnboundedConnectionRetries *bool `toml:"unbounded_connection_retries"`
		}
		MCPServers map[string]struct {
			Command string
			Args    []string
		} `toml:"mcp_servers"`
	}
	md, err := toml.Decode(files[0].data, &cfg)
	if err != nil {
		t.Fatalf("config.toml: %v\n%s", err, files[0].data)
	}
	if u := md.Undecoded(); len(u) != 0 {
		t.Errorf("keys this test does not check: %v", u)
	}
	off := func(b *bool) bool { return b != nil && !*b }
	if cfg.SandboxMode != "danger-full-access" || cfg.ApprovalPolicy != "never" {
		t.Errorf("sandbox_mode %q approval_policy %q, want danger-full-access and never", cfg.SandboxMode, cfg.ApprovalPolicy)
	}
	if !off(cfg.UpdateCheck) || !off(cfg.Analytics.Enabled) || !off(cfg.Feedback.Enabled) || !off(cfg.Features.Plugins) {
		t.Errorf("the update check, analytics, feedback or plugins are not all off:\n%s", files[0].data)
	}
	if !off(cfg.Features.UnboundedConnectionRetries) {
		t.Errorf("unbounded_connection_retries is not off: a refused provider would keep Codex waiting for network until the agent's wall timeout:\n%s", files[0].data)
	}
	want := []string{"trial-client", "--socket", `/run/a "b".sock`, "mcp"}
	if s := cfg.MCPServers["thermite"]; len(cfg.MCPServers) != 1 || s.Command != "/opt/thermite/bin/thermite" || !reflect.DeepEqual(s.Args, want) {
		t.Errorf("mcp_servers %+v", cfg.MCPServers)
	}
}

// TestCodexAskedForItsOwnSandboxRefused: each way an operator's command
// line asks Codex for its own sandbox (bubblewrap, which cannot start in a
// lane) is refused with one line naming it, before Codex runs, rather
// than every command of the turn failing with bubblewrap's EACCES; the
// commands that leave the sandbox to the lane's config.toml run.
func TestCodexAskedForItsOwnSandboxRefused(t *testing.T) {
	const codex = "/opt/thermite/agents/node_modules/.bin/codex"
	for _, c := range []struct {
		attempt string
		argv    []string
		env     []string
		refused string // what the line names; "" runs
	}{
		{"-s workspace-write", []string{codex, "exec", "-s", "workspace-write", "task"}, nil, "codex -s workspace-write: Codex's own sandbox (bubblewrap) cannot start in a lane"},
		{"--sandbox read-only", []string{codex, "exec", "--sandbox", "read-only", "task"}, nil, "codex --sandbox read-only:"},
		{"--sandbox=workspace-write", []string{codex, "exec", "--sandbox=workspace-write", "task"}, nil, "codex --sandbox=workspace-write:"},
		{"-sread-only", []string{codex, "exec", "-sread-only", "task"}, nil, "codex -sread-only:"},
		{"--full-auto", []string{codex, "exec", "--full-auto", "task"}, nil, "codex --full-auto:"},
		{"-c sandbox_mode", []string{codex, "exec", "-c", `sandbox_mode="workspace-write"`, "task"}, nil, `codex -c sandbox_mode="workspace-write":`},
		{"--config=sandbox_mode, bare", []string{codex, "exec", "--config=sandbox_mode=read-only", "task"}, nil, "codex --config=sandbox_mode=read-only:"},
		{"a profile's sandbox_mode", []string{codex, "exec", "-c", `profiles.p.sandbox_mode="read-only"`, "-p", "p", "task"}, nil, `codex -c profiles.p.sandbox_mode="read-only":`},
		{"codex sandbox", []string{codex, "sandbox", "--", "true"}, nil, "codex sandbox:"},
		{"node running codex.js", []string{"/usr/bin/node", "/opt/thermite/agents/node_modules/@openai/codex/bin/codex.js", "exec", "-s", "read-only", "task"}, nil, "codex -s read-only:"},
		{"--env CODEX_HOME", []string{codex, "exec", "task"}, []string{"CODEX_HOME=/tmp/mine"}, "--env CODEX_HOME: Codex's configuration is the lane home's"},
		{"plain exec", []string{codex, "exec", "--skip-git-repo-check", "-c", `model="m"`, "task"}, []string{"KEY=v"}, ""},
		{"-s danger-full-access", []string{codex, "exec", "-s", "danger-full-access", "task"}, nil, ""},
		{"-c sandbox_mode danger-full-access", []string{codex, "exec", "-c", `sandbox_mode="danger-full-access"`, "task"}, nil, ""},
		{"--dangerously-bypass-approvals-and-sandbox", []string{codex, "exec", "--dangerously-bypass-approvals-and-sandbox", "task"}, nil, ""},
		{"a flag after --, the prompt's", []string{codex, "exec", "--", "--full-auto"}, nil, ""},
	} {
		if !runsCodex(c.argv) {
			t.Errorf("%s: %v is not taken for Codex", c.attempt, c.argv)
			continue
		}
		err := codexOwnSandbox(c.argv, c.env)
		switch {
		case c.refused == "" && err != nil:
			t.Errorf("%s: refused: %v", c.attempt, err)
		case c.refused != "" && (err == nil || !strings.HasPrefix(err.Error(), c.refused) || strings.Contains(err.Error(), "\n")):
			t.Errorf("%s: %v, want one line starting %q", c.attempt, err, c.refused)
		}
	}
	for _, argv := range [][]string{{"/usr/bin/claude", "-p", "x"}, {"node", "/opt/pi/cli.js", "-s", "read-only"}, {"opencode", "run"}} {
		if runsCodex(argv) {
			t.Errorf("%v taken for Codex", argv)
		}
	}
}
