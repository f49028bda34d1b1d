package confined

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRemoveTreeDeepAndHostile removes a tree deeper than any walk goes,
// with folders without permissions, symlinks out of it and a name that
// clashes with the remover's own: nothing outside is touched.
func TestRemoveTreeDeepAndHostile(t *testing.T) {
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	os.Mkdir(outside, 0o755)
	os.WriteFile(filepath.Join(outside, "keep"), []byte("x"), 0o644)
	root := filepath.Join(base, "tree")
	deep := filepath.Join(root, strings.Repeat("d/", 300))
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Skipf("cannot make a deep tree here: %v", err)
	}
	os.WriteFile(filepath.Join(deep, "f"), []byte("x"), 0o644)
	os.Symlink(outside, filepath.Join(root, "d", "out"))
	os.Mkdir(filepath.Join(root, ".thermite-deep-1"), 0o755)
	os.WriteFile(filepath.Join(root, ".thermite-deep-1", "f"), nil, 0o644)
	locked := filepath.Join(root, "locked")
	os.Mkdir(locked, 0o755)
	os.WriteFile(filepath.Join(locked, "f"), nil, 0o644)
	os.Chmod(locked, 0o500)
	defer os.Chmod(locked, 0o700)
	parent, err := os.Open(base)
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()
	n, err := RemoveTree(parent, "tree")
	if os.Geteuid() != 0 && err != nil {
		t.Skipf("needs root to remove a folder its owner locked: %v", err)
	}
	if err != nil {
		out, _ := exec.Command("find", root, "-maxdepth", "3").CombinedOutput()
		t.Fatalf("RemoveTree: %v\n%s", err, out)
	}
	if _, err := os.Lstat(root); !os.IsNotExist(err) {
		t.Fatalf("tree still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "keep")); err != nil {
		t.Fatalf("a file outside the tree was removed through a symlink: %v", err)
	}
	if n < 300 {
		t.Fatalf("removed %d entries, want more than 300", n)
	}
	// A name that is gone is no error.
	if n, err := RemoveTree(parent, "tree"); err != nil || n != 0 {
		t.Fatalf("second RemoveTree: %d, %v", n, err)
	}
}
