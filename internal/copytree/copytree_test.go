package copytree

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestCopy(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "a", "b"), 0o755)
	os.WriteFile(filepath.Join(src, "a", "b", "f"), []byte("hello"), 0o644)
	os.WriteFile(filepath.Join(src, "x.sh"), []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(src, "su"), []byte("x"), 0o755)
	unix.Chmod(filepath.Join(src, "su"), 0o4755)
	os.Symlink("/etc/passwd", filepath.Join(src, "link"))
	unix.Mkfifo(filepath.Join(src, "fifo"), 0o644)
	dst := filepath.Join(t.TempDir(), "copy")
	st, err := Copy(src, dst, Options{UID: -1, GID: -1})
	if err != nil {
		t.Fatal(err)
	}
	if st.Files != 3 || st.Symlinks != 1 || st.Skipped != 1 || st.Dirs != 3 {
		t.Fatalf("%+v", st)
	}
	b, _ := os.ReadFile(filepath.Join(dst, "a", "b", "f"))
	if string(b) != "hello" {
		t.Fatal("content")
	}
	if l, _ := os.Readlink(filepath.Join(dst, "link")); l != "/etc/passwd" {
		t.Fatal("symlink not copied as a symlink")
	}
	fi, _ := os.Stat(filepath.Join(dst, "su"))
	if fi.Mode()&os.ModeSetuid != 0 || fi.Mode().Perm() != 0o755 {
		t.Fatalf("su: %v", fi.Mode())
	}
	if _, err := Copy(src, dst, Options{UID: -1, GID: -1}); err == nil || !strings.Contains(err.Error(), dst) {
		t.Fatalf("copy onto an existing folder: %v", err)
	}
}

func TestCopyReadOnlyAndOwned(t *testing.T) {
	if os.Geteuid() != 0 || testing.Short() {
		t.Skip("needs root (and no -short) to chown")
	}
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "data"), []byte("d"), 0o664)
	os.WriteFile(filepath.Join(src, "run"), []byte("r"), 0o775)
	dst := filepath.Join(t.TempDir(), "ro")
	if _, err := Copy(src, dst, Options{UID: 45991, GID: 45991, ReadOnly: true}); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]uint32{dst: 0o555, filepath.Join(dst, "data"): 0o444, filepath.Join(dst, "run"): 0o555} {
		var st unix.Stat_t
		unix.Lstat(p, &st)
		if st.Mode&0o7777 != want || st.Uid != 45991 {
			t.Errorf("%s: %o uid %d, want %o uid 45991", p, st.Mode&0o7777, st.Uid, want)
		}
	}
}

func TestCopyLimit(t *testing.T) {
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "big"), make([]byte, 1000), 0o644)
	if _, err := Copy(src, filepath.Join(t.TempDir(), "c"), Options{UID: -1, GID: -1, MaxBytes: 10}); err == nil || !strings.Contains(err.Error(), "limit of 10 bytes") {
		t.Fatal(err)
	}
}

func TestCopyRefusesHardLinks(t *testing.T) {
	src := t.TempDir()
	outside := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(outside, []byte("root only"), 0o600)
	if err := os.Link(outside, filepath.Join(src, "linked")); err != nil {
		t.Skip("cannot hard-link here:", err)
	}
	_, err := Copy(src, filepath.Join(t.TempDir(), "c"), Options{UID: -1, GID: -1, RefuseLinks: true})
	if err == nil || !strings.Contains(err.Error(), "linked has 2 links") {
		t.Fatalf("a hard-linked file was copied: %v", err)
	}
}
