// Package container runs the real container test: scripts/container-test.sh
// builds thermite's images with podman and checks, inside containers run
// with exactly compose.yaml's capabilities and no-new-privileges, that the
// rig holds: the start, the self-test with its GPU rows over stand-in cards,
// a trial with a lane command, a timed run of the example kit, and the
// one-container image with a RunPod variable and control's key.
package container

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"thermite/internal/testrig"
)

// The base images the script makes with debootstrap when they are missing
// and keeps: plain (the one-container image) and with gcc (the harness,
// whose judge builds the example kit with cc).
var baseImages = []string{"localhost/debian-base:bookworm", "localhost/debian-base:bookworm-gcc"}

func TestContainer(t *testing.T) {
	testrig.RequireRoot(t)
	var missing []string
	for _, tool := range []string{"podman", "runc", "jq"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) > 0 {
		t.Skipf("needs podman, runc and jq (missing: %s): .ci/run installs them", strings.Join(missing, ", "))
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		for _, image := range baseImages {
			if exec.Command("podman", "image", "exists", image).Run() != nil {
				t.Skipf("needs debootstrap to make the base image %s: .ci/run installs it", image)
			}
		}
	}

	root := testrig.ModuleRoot()
	// The binary the image gets, built the way `make` builds it, into a
	// folder of this test's own rather than bin/, which other tests may run.
	// thermite-run-as goes beside it, where the script looks for it.
	dir := t.TempDir()
	bin := filepath.Join(dir, "thermite")
	for _, name := range []string{"thermite", "thermite-run-as"} {
		build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, name), "./cmd/"+name)
		build.Dir = root
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", name, err, out)
		}
	}

	timeout := 10 * time.Minute
	if d, ok := t.Deadline(); ok && time.Until(d)-30*time.Second < timeout {
		timeout = time.Until(d) - 30*time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "container-test.sh"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "THERMITE_BIN="+bin)
	// SIGTERM first, so that the script's trap removes what it made
	// (SIGINT may be ignored: a background job inherits it so).
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	var out bytes.Buffer
	w := io.Writer(&out)
	if testing.Verbose() {
		w = io.MultiWriter(&out, os.Stdout)
	}
	cmd.Stdout, cmd.Stderr = w, w
	err := cmd.Run()
	if err != nil {
		why := err.Error()
		if ctx.Err() != nil {
			why = fmt.Sprintf("no verdict in %s", timeout.Round(time.Second))
		}
		t.Fatalf("scripts/container-test.sh: %s\n%s", why, out.String())
	}
	t.Logf("%s", lastLine(out.String()))
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	return s[strings.LastIndex(s, "\n")+1:]
}
