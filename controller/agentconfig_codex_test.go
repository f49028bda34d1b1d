package controller

import (
	"reflect"
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
		Features       struct{ Plugins *bool }
		MCPServers     map[string]struct {
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
	want := []string{"trial-client", "--socket", `/run/a "b".sock`, "mcp"}
	if s := cfg.MCPServers["thermite"]; len(cfg.MCPServers) != 1 || s.Command != "/opt/thermite/bin/thermite" || !reflect.DeepEqual(s.Args, want) {
		t.Errorf("mcp_servers %+v", cfg.MCPServers)
	}
}
