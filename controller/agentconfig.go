package controller

import (
	"encoding/json"
	"fmt"
	"strings"
)

// The agent programs' own configuration in the lane harness's home: one
// function a program, each writing the files that program reads there
// (docs/agents.md says what each gets and why).

// mcpServer is the command that serves thermite's MCP tools to a program.
type mcpServer struct {
	command string
	args    []string
}

// homeFile is one file of the lane harness's home, by its path there.
type homeFile struct {
	path, data string
}

// laneProgramFiles are the programs the lane harness configures.
var laneProgramFiles = []func(mcpServer) []homeFile{claudeCodeFiles, codexFiles, openCodeFiles}

// claudeCodeFiles: Claude Code reads its MCP servers and its state from
// ~/.claude.json (onboarding done, so it asks nothing on its first start;
// no auto-update, which would write under the agents' install) and its
// settings from ~/.claude/settings.json: the environment that stops its
// traffic to anyone but the provider (update checks, telemetry, error
// reports, feature flags), which only the rig's egress proxy could refuse
// otherwise, and thermite's MCP tools allowed without a prompt.
func claudeCodeFiles(m mcpServer) []homeFile {
	server := map[string]any{"type": "stdio", "command": m.command, "args": m.args}
	claude, _ := json.MarshalIndent(map[string]any{
		"hasCompletedOnboarding": true,
		"autoUpdates":            false,
		"mcpServers":             map[string]any{"thermite": server},
	}, "", "  ")
	settings, _ := json.MarshalIndent(map[string]any{
		"env": map[string]string{
			"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
			"DISABLE_AUTOUPDATER":                      "1",
			"DISABLE_TELEMETRY":                        "1",
			"DISABLE_ERROR_REPORTING":                  "1",
		},
		"permissions": map[string]any{"allow": []string{"mcp__thermite"}},
	}, "", "  ")
	return []homeFile{{".claude.json", string(claude) + "\n"}, {".claude/settings.json", string(settings) + "\n"}}
}

// codexFiles: Codex reads ~/.codex/config.toml.
func codexFiles(m mcpServer) []homeFile {
	quoted := make([]string, len(m.args))
	for i, a := range m.args {
		quoted[i] = fmt.Sprintf("%q", a)
	}
	codex := fmt.Sprintf("[mcp_servers.thermite]\ncommand = %q\nargs = [%s]\n", m.command, strings.Join(quoted, ", "))
	return []homeFile{{".codex/config.toml", codex}}
}

// openCodeFiles: OpenCode reads ~/.config/opencode/opencode.json.
func openCodeFiles(m mcpServer) []homeFile {
	opencode, _ := json.MarshalIndent(map[string]any{"$schema": "https://opencode.ai/config.json",
		"mcp": map[string]any{"thermite": map[string]any{"type": "local", "command": append([]string{m.command}, m.args...), "enabled": true}}}, "", "  ")
	return []homeFile{{".config/opencode/opencode.json", string(opencode) + "\n"}}
}
