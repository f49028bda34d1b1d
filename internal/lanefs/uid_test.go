package lanefs

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// testUID is a throwaway uid (and gid) that no user of the machine has.
const testUID = 45990

// helperBinary copies the test binary into dir, where any user can run
// it; TestMain makes it the helper when LANEFS_TEST_HELPER=1.
func helperBinary(t testing.TB, dir string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	bin := filepath.Join(dir, "lanefs-helper")
	out, err := os.OpenFile(bin, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return bin
}

// startHelper runs the helper binary on roots with cred (nil: as we
// are), its stdin and stdout one end of a socketpair, as the broker
// will. It returns our end and the command.
func startHelper(t testing.TB, bin string, cred *syscall.Credential, dir string, roots ...string) (net.Conn, *exec.Cmd, *bytes.Buffer) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	theirs := os.NewFile(uintptr(fds[1]), "helper end")
	ours := os.NewFile(uintptr(fds[0]), "controller end")
	conn, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bin, roots...)
	cmd.Dir = dir
	cmd.Env = []string{"LANEFS_TEST_HELPER=1", "PATH=/usr/bin:/bin"}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = theirs, theirs, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	theirs.Close()
	return conn, cmd, &stderr
}

// TestServeAsOtherUID runs the helper as it runs in the rig: its own
// process, as a user that is not root (a throwaway uid owning the
// workspace), with the socketpair as stdin and stdout. It works there,
// files it makes belong to that uid, the kernel's permissions apply to
// it (a root-only file inside the workspace is denied), and the escape
// refusals hold. As root, ServeMain refuses to start.
func TestServeAsOtherUID(t *testing.T) {
	if os.Geteuid() != 0 || testing.Short() {
		t.Skip("needs root (and no -short): it runs the helper as uid 45990 (CI runs tests as root)")
	}
	base, err := os.MkdirTemp("", "lanefs-uid-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	for d := filepath.Dir(base); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			t.Skipf("%s is closed to other users (mode %v), so uid %d cannot reach a workspace below it; set TMPDIR to an open folder", d, fi.Mode().Perm(), testUID)
		}
		if d == "/" {
			break
		}
	}
	bin := helperBinary(t, base)
	ws := filepath.Join(base, "ws")
	research := filepath.Join(base, "research")
	for _, step := range []error{
		os.Mkdir(ws, 0o700),
		os.Chown(ws, testUID, testUID),
		os.WriteFile(filepath.Join(ws, "rootonly"), []byte("root's"), 0o600),
		os.Mkdir(research, 0o755),
		os.WriteFile(filepath.Join(research, "notes.txt"), []byte("research notes\n"), 0o644),
		os.WriteFile(filepath.Join(research, "secret"), []byte("root only\n"), 0o600),
		os.WriteFile(filepath.Join(base, "canary"), []byte(canary), 0o644),
	} {
		if step != nil {
			t.Fatal(step)
		}
	}

	// As root, the helper refuses.
	conn, cmd, stderr := startHelper(t, bin, nil, ws, ws)
	conn.Close()
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), "refusing to serve as root") {
		t.Fatalf("the helper as root: %v, %q", err, stderr.String())
	}

	cred := &syscall.Credential{Uid: testUID, Gid: testUID, Groups: []uint32{}}
	conn, cmd, stderr = startHelper(t, bin, cred, ws, ws, research)
	c := NewClient(conn)
	owner := func(p string) (uint32, uint32) {
		t.Helper()
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		return st.Uid, st.Gid
	}
	if _, err := Write.Call(ctx, c, WriteRequest{Path: "made.txt", Data: []byte("made by the lane\n")}); err != nil {
		t.Fatal(err)
	}
	if _, err := Write.Call(ctx, c, WriteRequest{Path: "a/b/c.txt", Data: []byte("deep\n"), CreateParents: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := Mkdir.Call(ctx, c, MkdirRequest{Path: "dir"}); err != nil {
		t.Fatal(err)
	}
	if _, err := Edit.Call(ctx, c, EditRequest{Path: "made.txt", Old: "made", New: "edited"}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"made.txt", "a", "a/b", "a/b/c.txt", "dir"} {
		if uid, gid := owner(filepath.Join(ws, p)); uid != testUID || gid != testUID {
			t.Errorf("%s: owned by %d:%d, want %d:%d", p, uid, gid, testUID, testUID)
		}
	}
	assertFile(t, filepath.Join(ws, "made.txt"), "edited by the lane\n", 0o644)
	r, err := Read.Call(ctx, c, ReadRequest{Path: "made.txt"})
	if err != nil || string(r.Data) != "edited by the lane\n" {
		t.Fatalf("read: %v %v", r, err)
	}
	st, err := Stat.Call(ctx, c, StatRequest{Path: "a/b/c.txt"})
	if err != nil || st.Type != TypeFile || st.Size != 5 {
		t.Fatalf("stat: %v %v", st, err)
	}
	g, err := Grep.Call(ctx, c, GrepRequest{Pattern: "lane"})
	if err != nil || matches(g) != "made.txt:1:edited by the lane" {
		t.Fatalf("grep: %v %v", g, err)
	}
	fr, err := Find.Call(ctx, c, FindRequest{Glob: "*.txt"})
	if err != nil || strings.Join(fr.Paths, " ") != "a/b/c.txt made.txt" {
		t.Fatalf("find: %v %v", fr, err)
	}
	// The kernel sees the lane's uid, not root.
	_, err = Read.Call(ctx, c, ReadRequest{Path: "rootonly"})
	wantCode(t, err, CodeDenied, "rootonly: permission denied")
	r, err = Read.Call(ctx, c, ReadRequest{Root: 1, Path: "notes.txt"})
	if err != nil || string(r.Data) != "research notes\n" {
		t.Fatalf("read research: %v %v", r, err)
	}
	_, err = Read.Call(ctx, c, ReadRequest{Root: 1, Path: "secret"})
	wantCode(t, err, CodeDenied, "")
	_, err = Write.Call(ctx, c, WriteRequest{Root: 1, Path: "new", Data: []byte("x")})
	wantCode(t, err, CodeDenied, "")
	_, err = Delete.Call(ctx, c, DeleteRequest{Root: 1, Path: "notes.txt"})
	wantCode(t, err, CodeDenied, "")
	_, err = Read.Call(ctx, c, ReadRequest{Path: "../canary"})
	wantCode(t, err, CodeEscape, "lanefs: ../canary: leaves the workspace")
	_, err = Read.Call(ctx, c, ReadRequest{Path: filepath.Join(base, "canary")})
	wantCode(t, err, CodeEscape, "leaves the workspace")
	if d, err := Delete.Call(ctx, c, DeleteRequest{Path: "a", Recursive: true}); err != nil || d.Removed != 3 {
		t.Fatalf("delete -r: %v %v", d, err)
	}

	// EOF on its stdin ends the helper, with status 0.
	c.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil || stderr.Len() != 0 {
			t.Fatalf("the helper ended with %v, %q", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatal("the helper did not end at EOF")
	}
	if b, _ := os.ReadFile(filepath.Join(base, "canary")); string(b) != canary {
		t.Fatalf("the canary outside changed: %q", b)
	}
}
