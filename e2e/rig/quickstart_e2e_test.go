package rig

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"thermite/internal/testrig"
)

// quickstartBlocks are the shell blocks of README.md's Quickstart section.
func quickstartBlocks(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testrig.ModuleRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Quickstart\n")
	if !ok {
		t.Fatal("README.md has no ## Quickstart section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var blocks []string
	for {
		_, rest, ok := strings.Cut(section, "```sh\n")
		if !ok {
			break
		}
		block, after, ok := strings.Cut(rest, "```")
		if !ok {
			t.Fatal("README.md's Quickstart has an unclosed code block")
		}
		blocks = append(blocks, block)
		section = after
	}
	return blocks
}

// TestQuickstart runs README.md's Quickstart as it is written, on a
// throwaway rig (its own role prefix, state dir and stand-in closed
// places): `sudo make run` is the rig's start (roles ensure, then serve),
// and every line of the second block runs in order in one shell, with
// ./bin/thermite pointed at the rig's configuration and /var/lib/thermite at
// its state dir.
func TestQuickstart(t *testing.T) {
	testrig.RequireRoot(t)
	var missing []string
	for _, c := range []string{"gcc", "curl", "jq", "bash"} {
		if _, err := exec.LookPath(c); err != nil {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		t.Skipf("needs %s for the quickstart's steps: .ci/run installs them", strings.Join(missing, ", "))
	}
	blocks := quickstartBlocks(t)
	if len(blocks) != 2 || strings.TrimSpace(blocks[0]) != "sudo make run" {
		t.Fatalf("the Quickstart should be `sudo make run`, then one block of steps; it has %d blocks: %q", len(blocks), blocks)
	}
	mk, _ := os.ReadFile(filepath.Join(testrig.ModuleRoot(), "Makefile"))
	if !strings.Contains(string(mk), "\n\t./$(BIN) roles ensure\n\t./$(BIN) serve\n") {
		t.Fatal("`make run` no longer runs `roles ensure` then `serve`: this test's start of the rig is not what the Quickstart's first step does")
	}

	r := testrig.New(t, testrig.Options{NoSecretsDir: true})
	// A folder that looks like the repository to the steps: ./bin/thermite
	// is the rig's binary with its configuration, examples/ the real ones.
	work := t.TempDir()
	os.Mkdir(filepath.Join(work, "bin"), 0o755)
	wrapper := "#!/bin/sh\nexec " + r.Bin + " --config " + r.Config + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(work, "bin", "thermite"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(testrig.ModuleRoot(), "examples"), filepath.Join(work, "examples")); err != nil {
		t.Fatal(err)
	}
	script := strings.ReplaceAll(blocks[1], "/var/lib/thermite", r.Cfg.StateDir)
	script = strings.ReplaceAll(script, "sudo ", "")
	cmd := exec.Command("bash", "-euxo", "pipefail", "-c", script)
	cmd.Dir = work
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the Quickstart's steps failed: %v\n%s", err, out)
	}
	text := string(out)
	for _, want := range []string{"phase", "ready", `"lane": 1`, `"api_socket"`, "ended", "kit sum imported", "score   1"} {
		if !strings.Contains(text, want) {
			t.Errorf("the Quickstart's output lacks %q:\n%s", want, text)
		}
	}
	// Its last step: stop the rig; the closed places open again.
	r.StopBroker()
	wantPlaces(t, r, "after the Quickstart's stop", openModes)
}
