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

// codexFiles: Codex reads ~/.codex/config.toml. The rig is Codex's
// sandbox (the lane's user, its Landlock, seccomp and network policy), so
// Codex runs commands itself, unsandboxed and unasked: its own sandbox
// (bubblewrap, its default workspace-write) cannot start inside a lane,
// and then every command fails ("error building bubblewrap command:
// Permission denied"). It sends nothing home:
// no update check, no analytics, no feedback uploads, no sync of the
// curated plugins (github.com, api.github.com, chatgpt.com). The model provider
// is the operator's to give (docs/agents-codex.md).
func codexFiles(m mcpServer) []homeFile {
	quoted := make([]string, len(m.args))
	for i, a := range m.args {
		quoted[i] = fmt.Sprintf("%q", a)
	}
	codex := fmt.Sprintf(`sandbox_mode = "danger-full-access"
approval_policy = "never"
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[features]
plugins = false

[mcp_servers.thermite]
command = %q
args = [%s]
`, m.command, strings.Join(quoted, ", "))
	return []homeFile{{".codex/config.toml", codex}}
}

// openCodeFiles: OpenCode reads ~/.config/opencode/opencode.json. Beside
// the MCP server it turns off what would reach past the rig's proxy at
// start or later (updates, sharing, language servers it would download)
// and lets every tool run without asking: `opencode run` has no one to
// ask and rejects what would need asking (a read outside the workspace
// among them), and the lane's own access is what bounds the program. The
// .npmrc beside it keeps npm offline there: at every start OpenCode
// installs its plugin SDK into each config folder from the registry,
// which the proxy does not list. The provider is the operator's (docs/
// agents-opencode.md): OPENCODE_CONFIG_CONTENT or OPENCODE_CONFIG.
func openCodeFiles(m mcpServer) []homeFile {
	opencode, _ := json.MarshalIndent(map[string]any{"$schema": "https://opencode.ai/config.json",
		"mcp":        map[string]any{"thermite": map[string]any{"type": "local", "command": append([]string{m.command}, m.args...), "enabled": true}},
		"autoupdate": false, "share": "disabled", "lsp": false, "formatter": false,
		"permission": map[string]any{"*": "allow"}}, "", "  ")
	return []homeFile{{".config/opencode/opencode.json", string(opencode) + "\n"},
		{".config/opencode/.npmrc", "offline=true\n"}}
}

// laneProgramEnv is what the lane harness adds to a program's environment
// after the operator's --env (which wins, being first): what only an
// environment variable turns off. OpenCode fetches models.opencode.ai's
// catalogue at start and every hour unless OPENCODE_DISABLE_MODELS_FETCH
// is set; no configuration key does it.
var laneProgramEnv = []string{"OPENCODE_DISABLE_MODELS_FETCH=1", "OPENCODE_DISABLE_AUTOUPDATE=1", "OPENCODE_DISABLE_LSP_DOWNLOAD=1"}
