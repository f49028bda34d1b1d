package hashtree

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func sum(s string) string {
	b := sha256.Sum256([]byte(s))
	return hex.EncodeToString(b[:])
}

// build makes a small build: files at two depths, an empty folder.
func build(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for p, c := range map[string]string{
		"bin/prog":          "#!/bin/sh\necho hi\n",
		"lib/a/b/data.bin":  strings.Repeat("x", 300<<10), // more than one read
		"README":            "",
		"lib/a/notes.txt":   "notes",
		"lib/with space.md": "s",
	} {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(root, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

func TestHashRoundTrip(t *testing.T) {
	root := build(t)
	m, err := Hash(root)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"bin/prog":          sum("#!/bin/sh\necho hi\n"),
		"lib/a/b/data.bin":  sum(strings.Repeat("x", 300<<10)),
		"README":            sum(""),
		"lib/a/notes.txt":   sum("notes"),
		"lib/with space.md": sum("s"),
		"empty":             "dir",
	}
	if len(m) != len(want) {
		t.Fatalf("got %d entries, want %d: %v", len(m), len(want), m)
	}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s: %q, want %q", k, m[k], v)
		}
	}
	if err := Verify(root, m); err != nil {
		t.Fatalf("verify of an unchanged tree: %v", err)
	}
	// A second hash of the same tree is the same manifest.
	again, err := Hash(root)
	if err != nil || len(again) != len(m) {
		t.Fatal(err, again)
	}
	// An empty tree has an empty manifest that verifies.
	empty := t.TempDir()
	if m, err := Hash(empty); err != nil || len(m) != 0 {
		t.Fatalf("empty: %v %v", m, err)
	}
	if err := Verify(empty, map[string]string{}); err != nil {
		t.Fatal(err)
	}
}

func TestHashMatchesSha256sum(t *testing.T) {
	if _, err := exec.LookPath("sha256sum"); err != nil {
		t.Skip("no sha256sum")
	}
	root := build(t)
	m, err := Hash(root)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("sha256sum", filepath.Join(root, "lib/a/b/data.bin")).Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(string(out))[0]; got != m["lib/a/b/data.bin"] {
		t.Fatalf("sha256sum %s, Hash %s", got, m["lib/a/b/data.bin"])
	}
}

func verifyAfter(t *testing.T, change func(root string), want ...string) {
	t.Helper()
	root := build(t)
	m, err := Hash(root)
	if err != nil {
		t.Fatal(err)
	}
	change(root)
	err = Verify(root, m)
	if err == nil {
		t.Fatalf("Verify passed; want an error with %q", want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("Verify: %v\nwant it to contain %q", err, w)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Fatalf("more than one line: %q", err)
	}
}

func TestVerifyChangedFile(t *testing.T) {
	verifyAfter(t, func(root string) {
		os.WriteFile(filepath.Join(root, "bin/prog"), []byte("#!/bin/sh\necho HI\n"), 0o644)
	}, "hashtree: bin/prog: content changed (sha256 "+sum("#!/bin/sh\necho HI\n")[:12]+"… now, "+sum("#!/bin/sh\necho hi\n")[:12]+"… recorded)")
}

func TestVerifyNewFile(t *testing.T) {
	verifyAfter(t, func(root string) {
		os.WriteFile(filepath.Join(root, "lib/a/b/extra.so"), []byte("x"), 0o644)
	}, "hashtree: lib/a/b/extra.so appeared (a file)")
}

func TestVerifyNewFolder(t *testing.T) {
	verifyAfter(t, func(root string) {
		os.MkdirAll(filepath.Join(root, "lib/new/deeper"), 0o755)
	}, "hashtree: lib/new appeared (a folder)")
}

func TestVerifyFileInEmptyFolder(t *testing.T) {
	verifyAfter(t, func(root string) {
		os.WriteFile(filepath.Join(root, "empty/x"), nil, 0o644)
	}, "hashtree: empty/x appeared (a file)")
}

func TestVerifyRemovedFile(t *testing.T) {
	verifyAfter(t, func(root string) {
		os.Remove(filepath.Join(root, "lib/a/notes.txt"))
	}, "hashtree: lib/a/notes.txt is missing (a file was recorded)")
}

func TestVerifyRemovedEmptyFolder(t *testing.T) {
	verifyAfter(t, func(root string) {
		os.Remove(filepath.Join(root, "empty"))
	}, "hashtree: empty is missing (a folder was recorded)")
}

func TestVerifySymlinkSwappedIn(t *testing.T) {
	// The file is replaced by a symlink to a file with the same content:
	// still refused, and the symlink is never followed.
	verifyAfter(t, func(root string) {
		other := filepath.Join(t.TempDir(), "prog")
		os.WriteFile(other, []byte("#!/bin/sh\necho hi\n"), 0o644)
		os.Remove(filepath.Join(root, "bin/prog"))
		os.Symlink(other, filepath.Join(root, "bin/prog"))
	}, "hashtree: bin/prog: a symlink (to ", "a stored build holds files and folders only")
}

func TestVerifyFolderSwappedForSymlink(t *testing.T) {
	verifyAfter(t, func(root string) {
		elsewhere := t.TempDir()
		os.Rename(filepath.Join(root, "lib"), filepath.Join(elsewhere, "lib"))
		os.Symlink(filepath.Join(elsewhere, "lib"), filepath.Join(root, "lib"))
	}, "hashtree: lib: a symlink (to ", "a stored build holds files and folders only")
}

// A symlink is never stored, even one that stays inside the build: what
// runs must be content that was hashed.
func TestSymlinkRefused(t *testing.T) {
	root := build(t)
	os.Symlink("prog", filepath.Join(root, "bin", "alias"))
	_, err := Hash(root)
	if err == nil || err.Error() != `hashtree: bin/alias: a symlink (to "prog"): a stored build holds files and folders only` {
		t.Fatalf("Hash: %v", err)
	}
}

// A file with a second name could change through it: refused, in Hash and
// in Verify.
func TestHardLinkRefused(t *testing.T) {
	root := build(t)
	m, err := Hash(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(root, "lib/a/notes.txt"), filepath.Join(t.TempDir(), "other")); err != nil {
		t.Skip("no hard link across these folders:", err)
	}
	if err := Verify(root, m); err == nil || err.Error() != "hashtree: lib/a/notes.txt has 2 links: a stored build holds files with one link only" {
		t.Fatalf("Verify: %v", err)
	}
}

// A manifest that older versions wrote with a symlink in it is refused, so
// such a build is never timed again.
func TestSymlinkManifestRefused(t *testing.T) {
	root := build(t)
	m, err := Hash(root)
	if err != nil {
		t.Fatal(err)
	}
	m["bin/alias"] = SymlinkPrefix + "prog"
	if err := Verify(root, m); err == nil || !strings.Contains(err.Error(), "bin/alias records a symlink") {
		t.Fatalf("Verify: %v", err)
	}
}

func TestFIFORefused(t *testing.T) {
	root := build(t)
	if err := unix.Mkfifo(filepath.Join(root, "lib/a/pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Hash(root)
	if err == nil || err.Error() != "hashtree: lib/a/pipe: a FIFO, not a file or folder" {
		t.Fatalf("Hash: %v", err)
	}
	// Verify refuses it the same way (and never blocks opening it).
	if err := Verify(root, map[string]string{}); err == nil || !strings.Contains(err.Error(), "lib/a/pipe: a FIFO") {
		t.Fatalf("Verify: %v", err)
	}
}

func TestRootMustBeAFolder(t *testing.T) {
	root := build(t)
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(root, link)
	if _, err := Hash(link); err == nil || !strings.Contains(err.Error(), "not a folder") {
		t.Fatalf("symlinked root: %v", err)
	}
	if _, err := Hash(filepath.Join(root, "missing")); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("missing root: %v", err)
	}
}

func TestUnreadableFileNamed(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root reads every file")
	}
	root := build(t)
	os.Chmod(filepath.Join(root, "lib/a/notes.txt"), 0)
	if _, err := Hash(root); err == nil || !strings.Contains(err.Error(), "hashtree: lib/a/notes.txt: ") {
		t.Fatalf("Hash: %v", err)
	}
}

func TestBadManifestRefused(t *testing.T) {
	root := build(t)
	for _, m := range []map[string]string{
		{"../x": sum("")},
		{"/etc/passwd": sum("")},
		{"a//b": sum("")},
		{"bin/prog": "ABC"},
		{"bin/prog": strings.ToUpper(sum(""))},
	} {
		if err := Verify(root, m); err == nil || !strings.HasPrefix(err.Error(), "hashtree: manifest: ") {
			t.Errorf("%v: %v", m, err)
		}
	}
}

func TestManyFilesParallel(t *testing.T) {
	root := t.TempDir()
	want := map[string]string{}
	for i := range 500 {
		p := fmt.Sprintf("d%02d/f%03d", i%17, i)
		c := strings.Repeat(fmt.Sprint(i), i)
		os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(root, p), []byte(c), 0o644)
		want[p] = sum(c)
	}
	m, err := Hash(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := Diff(want, m); err != nil {
		t.Fatal(err)
	}
}

// benchTree writes about 1 GiB: 64 files of 16 MiB and 512 small ones in
// nested folders. It returns the folder and its size in bytes.
func benchTree(b *testing.B) (string, int64) {
	dir, err := os.MkdirTemp("", "hashtree-bench-")
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 16<<20)
	fill := func(p []byte) {
		for i := 0; i+8 <= len(p); i += 8 {
			v := rng.Uint64()
			p[i], p[i+1], p[i+2], p[i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
			p[i+4], p[i+5], p[i+6], p[i+7] = byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
		}
	}
	var total int64
	write := func(p string, data []byte) {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(full, data, 0o644); err != nil {
			os.RemoveAll(dir)
			b.Fatal(err)
		}
		total += int64(len(data))
	}
	for i := range 64 {
		fill(buf)
		write(fmt.Sprintf("big/%02d.bin", i), buf)
	}
	for i := range 512 {
		n := 1 + rng.IntN(16<<10)
		fill(buf[:n])
		write(fmt.Sprintf("small/%d/%d/f%03d.dat", i%8, i%5, i), buf[:n])
	}
	return dir, total
}

// BenchmarkHash1GiB hashes the same 1 GiB of files with Hash and with
// sha256sum (one process over every file, as find -exec … + runs it).
func BenchmarkHash1GiB(b *testing.B) {
	dir, total := benchTree(b)
	defer os.RemoveAll(dir)
	b.Run("hashtree", func(b *testing.B) {
		b.SetBytes(total)
		for b.Loop() {
			if _, err := Hash(dir); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sha256sum", func(b *testing.B) {
		if _, err := exec.LookPath("sha256sum"); err != nil {
			b.Skip("no sha256sum")
		}
		b.SetBytes(total)
		for b.Loop() {
			cmd := exec.Command("find", dir, "-type", "f", "-exec", "sha256sum", "{}", "+")
			if out, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("%v: %s", err, out)
			}
		}
	})
}
