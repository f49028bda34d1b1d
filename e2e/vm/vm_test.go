// Package vm runs e2e/vm/run.sh, which boots Debian's 6.12 kernel under
// qemu with the seccomp tests in an initramfs, once with ia32_emulation=false
// and once with true, and checks that TestI386ABIKilled skips with its
// reason where int 0x80 faults and passes where it works.
package vm

import (
	"bytes"
	"context"
	"errors"
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

// It boots two machines under software emulation (about a minute on two
// cores, more on a first run that downloads the kernel), so it runs only
// when asked.
const envRun = "THERMITE_VM"

func TestI386BothWays(t *testing.T) {
	if os.Getenv(envRun) != "1" {
		t.Skipf("boots Debian's 6.12 kernel under qemu twice (about a minute): set %s=1 or run make vm-i386", envRun)
	}
	testrig.RequireRoot(t)
	out := runScript(t, "run.sh", 20*time.Minute)
	for line := range strings.Lines(out) {
		if strings.HasPrefix(line, "vm: ok: ") || strings.HasPrefix(line, "vm: whole run") {
			t.Log(strings.TrimSpace(line))
		}
	}
}

// runScript runs a script of this folder as root under a deadline and
// returns its output; exit 77 skips the test with its last line.
func runScript(t *testing.T, name string, limit time.Duration) string {
	t.Helper()
	if d, ok := t.Deadline(); ok && time.Until(d)-30*time.Second < limit {
		limit = time.Until(d) - 30*time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	root := testrig.ModuleRoot()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "e2e", "vm", name))
	cmd.Dir = root
	// SIGTERM first, so that the script's trap removes its work folder.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	var out bytes.Buffer
	w := io.Writer(&out)
	if testing.Verbose() {
		w = io.MultiWriter(&out, os.Stdout)
	}
	cmd.Stdout, cmd.Stderr = w, w
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit) && exit.ExitCode() == 77:
		t.Skip(lastLine(out.String()))
	case ctx.Err() != nil:
		t.Fatalf("e2e/vm/%s: no verdict in %s\n%s", name, limit.Round(time.Second), out.String())
	default:
		t.Fatalf("e2e/vm/%s: %v\n%s", name, err, out.String())
	}
	return out.String()
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	return s[strings.LastIndex(s, "\n")+1:]
}
