package controller

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Pi as the trial's worker agent (the pi harness): agent-N runs it, and
// thermite's extension (agents/pi/thermite.ts, installed root-owned at
// agent.pi_extension) replaces its file and command tools with ones that
// act through the harness API as the lane (docs/agents-pi.md).

// runsPi reports whether an agent's argv starts Pi: a command named pi
// (node_modules/.bin/pi), or node running Pi's package.
func runsPi(argv []string) bool {
	if len(argv) == 0 {
		return false
	}
	if filepath.Base(argv[0]) == "pi" {
		return true
	}
	return len(argv) > 1 && strings.HasPrefix(filepath.Base(argv[0]), "node") && strings.Contains(argv[1], "pi-coding-agent")
}

// piArgv names the extension on Pi's command line too: Pi skips, without
// a word, an extension its settings name that is missing (a trial begun
// before its settings were written, a file gone since piReady), but
// refuses to start without one named by --extension. It loads a path
// named in both once.
func piArgv(argv []string, extension string) []string {
	at := 1
	if filepath.Base(argv[0]) != "pi" {
		at = 2 // node, then Pi's cli.js
	}
	out := append([]string{}, argv[:at]...)
	out = append(out, "--extension", extension)
	return append(out, argv[at:]...)
}

// piEnv is what Pi runs with: its folder the trial's (whose settings load
// thermite's extension), no start-up network traffic (version check,
// package and tool downloads) and no install telemetry. It goes before the
// operator's variables, so that these values are the ones kept.
func piEnv(agentDir string) []string {
	return []string{
		"PI_CODING_AGENT_DIR=" + filepath.Join(agentDir, ".pi", "agent"),
		"PI_OFFLINE=1",
		"PI_SKIP_VERSION_CHECK=1",
		"PI_TELEMETRY=0",
	}
}

// piReady decides whether Pi may run: thermite's extension in place, and
// neither an argument that would skip it nor a variable that would point
// Pi at another folder's settings.
func piReady(extension string, req AgentRequest) error {
	fi, err := os.Lstat(extension)
	fault := piExtensionFault(fi, err)
	if fault == "" && fi.IsDir() {
		fault = "a folder, not the file itself"
	}
	if fault == "" {
		// Whoever may write the folder may put another file in its place.
		fi, err = os.Stat(filepath.Dir(extension))
		if fault = piExtensionFault(fi, err); fault != "" {
			fault = "its folder is " + fault
		}
	}
	if fault != "" {
		return fmt.Errorf("thermite's Pi extension %s (agent.pi_extension): %s; `make agents` installs it root-owned 0644", extension, fault)
	}
	for _, a := range req.Argv[1:] {
		if a == "--no-extensions" || a == "-ne" {
			return fmt.Errorf("%s: Pi would skip thermite's extension, whose tools are its only way to the workspace; refused", a)
		}
	}
	for _, kv := range req.Env {
		if k, _, _ := strings.Cut(kv, "="); k == "PI_CODING_AGENT_DIR" {
			return errors.New("--env PI_CODING_AGENT_DIR: Pi's folder is the trial's (agent/.pi/agent), whose settings load thermite's extension; refused")
		}
	}
	return nil
}

// piExtensionFault says what keeps Pi from loading the extension, from
// the lstat of it or of its folder (fi, err): "" when nothing does. Each
// must be root's, a regular file or a folder, written by no one else
// (a sticky folder excepted, whose files only their owner may replace),
// since every tool of the agent acts through the file.
func piExtensionFault(fi fs.FileInfo, err error) string {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "missing"
	case err != nil:
		return err.Error()
	case fi.Mode()&fs.ModeSymlink != 0:
		return "a symlink, not the file itself"
	case fi.IsDir():
		if fi.Mode()&fs.ModeSticky != 0 {
			return rootsOwn(fi, 0)
		}
		return rootsOwn(fi, 0o022)
	case !fi.Mode().IsRegular():
		return fmt.Sprintf("not a regular file (%s)", fi.Mode().Type())
	}
	return rootsOwn(fi, 0o022)
}

// rootsOwn says why an entry is not root's with none of the write bits
// in writers, or "".
func rootsOwn(fi fs.FileInfo, writers fs.FileMode) string {
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !ok:
		return "its owner cannot be read"
	case st.Uid != 0:
		return fmt.Sprintf("owned by uid %d, not root", st.Uid)
	case fi.Mode().Perm()&writers != 0:
		return fmt.Sprintf("writable by others (mode %04o)", fi.Mode().Perm())
	}
	return ""
}
