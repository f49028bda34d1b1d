// Package container runs the real container test: scripts/container-test.sh
// builds thermite's images with podman and checks, inside a container run
// the way compose.yaml runs it, that the rig holds.
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

const baseImage = "localhost/debian-base:bookworm"

func TestContainer(t *testing.T) {
	testrig.RequireRoot(t)
	var missing []string
	for _, tool := range []string{"podman", "runc"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) > 0 {
		t.Skipf("needs podman and runc (missing: %s): .ci/run installs them", strings.Join(missing, ", "))
	}
	if _, err := exec.LookPath("debootstrap"); err != nil && exec.Command("podman", "image", "exists", baseImage).Run() != nil {
		t.Skipf("needs debootstrap to make the base image %s: .ci/run installs it", baseImage)
	}

	root := testrig.ModuleRoot()
	// The binary the image gets, built the way `make` builds it, into a
	// folder of this test's own rather than bin/, which other tests may run.
	bin := filepath.Join(t.TempDir(), "thermite")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/thermite")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
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
