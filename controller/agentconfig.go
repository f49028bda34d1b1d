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
// curated plugins (github.com, api.github.com, chatgpt.com). A connection
// to its provider that fails (the proxy's refusal of a host the rig does
// not list) fails the turn: Codex 0.171's unbounded_connection_retries
// would print "Reconnecting... waiting for network" until agent.wall_timeout
// (hours). The model provider is the operator's to give
// (docs/agents-codex.md).
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
unbounded_connection_retries = false

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

// runsCodex reports whether an agent's argv starts Codex: its launcher
// (node_modules/.bin/codex, codex.js), node running it, or its native
// binary (named codex too).
func runsCodex(argv []string) bool {
	if len(argv) == 0 {
		return false
	}
	if b := filepath.Base(argv[0]); b == "codex" || b == "codex.js" {
		return true
	}
	return len(argv) > 1 && strings.HasPrefix(filepath.Base(argv[0]), "node") && strings.Contains(argv[1], "@openai/codex")
}

// codexOwnSandbox refuses, in one line, a Codex run that asks for Codex's
// own sandbox: `-s`/`--sandbox` workspace-write or read-only,
// `--full-auto`, a `-c` setting of a sandbox_mode, the `codex sandbox`
// command, or --env CODEX_HOME (another config.toml, whose default sandbox
// is read-only). That sandbox is bubblewrap, which needs a user namespace,
// and no role may make one (the seccomp filter's denyNamespaces); Codex
// 0.171's legacy Landlock mode refuses every filesystem-restricted policy
// itself. Run anyway, each of its commands would fail with "error building
// bubblewrap command: Permission denied" as a tool error the model sees;
// the rig is Codex's sandbox, and the lane's config.toml chooses
// danger-full-access.
func codexOwnSandbox(argv, env []string) error {
	refuse := func(what string) error {
		return fmt.Errorf("codex %s: Codex's own sandbox (bubblewrap) cannot start in a lane, which may make no user namespace; the rig is its sandbox (the lane's ~/.codex/config.toml sets sandbox_mode = \"danger-full-access\"): leave it out", what)
	}
	args := argv[1:]
	if len(args) > 0 && filepath.Base(argv[0]) != "codex" && filepath.Base(argv[0]) != "codex.js" {
		args = args[1:] // node, then Codex's launcher
	}
	for i, a := range args {
		if a == "--" {
			break
		}
		next := ""
		if i+1 < len(args) {
			next = args[i+1]
		}
		switch {
		case i == 0 && a == "sandbox":
			return refuse("sandbox")
		case a == "--full-auto":
			return refuse(a)
		case a == "-s" || a == "--sandbox":
			if next != "danger-full-access" {
				return refuse(a + " " + next)
			}
		case strings.HasPrefix(a, "--sandbox=") || (strings.HasPrefix(a, "-s") && !strings.HasPrefix(a, "--")):
			if v := strings.TrimPrefix(strings.TrimPrefix(strings.TrimPrefix(a, "--sandbox"), "-s"), "="); v != "danger-full-access" {
				return refuse(a)
			}
		case a == "-c" || a == "--config":
			if codexSetsSandbox(next) {
				return refuse(a + " " + next)
			}
		case strings.HasPrefix(a, "--config=") || (strings.HasPrefix(a, "-c") && !strings.HasPrefix(a, "--")):
			if codexSetsSandbox(strings.TrimPrefix(strings.TrimPrefix(strings.TrimPrefix(a, "--config"), "-c"), "=")) {
				return refuse(a)
			}
		}
	}
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == "CODEX_HOME" {
			return fmt.Errorf("--env CODEX_HOME: Codex's configuration is the lane home's ~/.codex, whose sandbox_mode is the rig's; another (its default sandbox, read-only, is bubblewrap, which cannot start in a lane) is refused")
		}
	}
	return nil
}

// codexSetsSandbox says whether a -c override (KEY=VALUE, the value TOML
// or a bare string) sets a sandbox_mode, at the top or in a profile, to
// anything but danger-full-access.
func codexSetsSandbox(kv string) bool {
	k, v, ok := strings.Cut(kv, "=")
	if !ok {
		return false
	}
	k = strings.TrimSpace(k)
	if k != "sandbox_mode" && !strings.HasSuffix(k, ".sandbox_mode") {
		return false
	}
	return strings.Trim(strings.TrimSpace(v), `"'`) != "danger-full-access"
}
