package controller

import (
	"encoding/json"
	"fmt"
	"path/filepath"
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

// piFiles: Pi reads ~/.pi/agent/settings.json (agent-N's, its trial's
// folder being its HOME), which loads thermite's extension, whose tools
// act through the harness API as the lane. Pi's own local shell, which it
// still runs for RPC mode's "bash" command, is no-local-shell beside the
// extension, which runs nothing; install telemetry is off.
func piFiles(extension string) []homeFile {
	settings, _ := json.MarshalIndent(map[string]any{
		"extensions":             []string{extension},
		"shellPath":              filepath.Join(filepath.Dir(extension), "no-local-shell"),
		"enableInstallTelemetry": false,
	}, "", "  ")
	return []homeFile{{".pi/agent/settings.json", string(settings) + "\n"}}
}

// laneProgramFiles are the programs the lane harness configures.
var laneProgramFiles = []func(mcpServer) []homeFile{claudeCodeFiles, codexFiles, openCodeFiles}

// claudeCodeFiles: Claude Code reads its MCP servers from ~/.claude.json.
func claudeCodeFiles(m mcpServer) []homeFile {
	server := map[string]any{"command": m.command, "args": m.args}
	claude, _ := json.MarshalIndent(map[string]any{"mcpServers": map[string]any{"thermite": server}}, "", "  ")
	return []homeFile{{".claude.json", string(claude) + "\n"}}
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
