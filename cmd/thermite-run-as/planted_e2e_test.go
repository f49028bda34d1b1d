package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"thermite/internal/testrig"
)

// plantEnv names the socket a re-run of this test binary listens on, as
// the user it was started as.
const plantEnv = "THERMITE_TEST_PLANTED_SOCKET"

func TestMain(m *testing.M) {
	if p := os.Getenv(plantEnv); p != "" {
		os.Exit(plantedBroker(p))
	}
	os.Exit(m.Run())
}

// plantedBroker listens where the broker's socket belongs and says, for
// every connection, how many bytes and descriptors reached it.
func plantedBroker(path string) int {
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		fmt.Println("listen:", err)
		return 1
	}
	fmt.Println("ready")
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return 1
		}
		buf, oob := make([]byte, 1<<16), make([]byte, 256)
		n, oobn, _, _, _ := c.ReadMsgUnix(buf, oob)
		if n > 0 || oobn > 0 {
			fmt.Printf("got %d bytes and %d of descriptors\n", n, oobn)
		}
		c.Close()
	}
}

// TestRunAsLightRefusesABrokerSocketARolePlanted: a socket at the broker's
// path whose other end is not root (a role's process listening where the
// state folder lets it) gets a one-line refusal naming its uid, and never
// the operator's request or stdin, stdout and stderr; from both binaries.
func TestRunAsLightRefusesABrokerSocketARolePlanted(t *testing.T) {
	testrig.RequireRoot(t)
	uid := testrig.FreeUIDs(t) + 1
	// A folder the planted process can reach, holding a copy of this
	// test binary it may run (go test's own folder is root's 0700).
	dir, err := os.MkdirTemp("", "thermite-planted-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	helper := filepath.Join(dir, "planted")
	copyFile(t, self, helper)
	sockDir := filepath.Join(dir, "state", "broker")
	if err := os.MkdirAll(sockDir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chown(sockDir, uid, uid)
	cfg := filepath.Join(dir, "rig.toml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("state_dir = %q\n", filepath.Join(dir, "state"))), 0o644)

	sock := filepath.Join(sockDir, "broker.sock")
	cmd := exec.Command(helper)
	cmd.Env = []string{plantEnv + "=" + sock}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "ready" {
		t.Fatalf("the planted listener did not start: %q", lines.Text())
	}

	want := fmt.Sprintf("thermite: run-as: broker socket %s: held by uid %d, not root\n", sock, uid)
	for _, c := range []*exec.Cmd{
		exec.Command(testrig.RunAsBinary(t), "--config", cfg, "lane-1", "--", "true"),
		exec.Command(testrig.Binary(t, ""), "--config", cfg, "run-as", "lane-1", "--", "true"),
	} {
		got := runCmd(t, c, []byte("secret input\n"))
		if got.code != 1 || got.stdout != "" || got.stderr != want {
			t.Errorf("%s: %+v; want exit 1 and %q", c.Path, got, want)
		}
	}
	cmd.Process.Kill()
	rest, _ := io.ReadAll(out)
	if strings.TrimSpace(string(rest)) != "" {
		t.Errorf("the planted socket received: %s", rest)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}
