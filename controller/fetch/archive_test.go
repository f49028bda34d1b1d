package fetch

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func testPage() *Page {
	return &Page{
		URL:         "https://example.org/final",
		Requested:   "http://example.org/asked",
		Status:      200,
		ContentType: "text/html; charset=utf-8",
		FetchedAt:   time.Date(2025, 3, 4, 5, 6, 7, 8, time.UTC),
		Body:        []byte("<p>a page</p>"),
	}
}

func readMeta(t *testing.T, path string) Metadata {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read metadata: %v", err)
	}
	var m Metadata
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("metadata %s: %v", b, err)
	}
	return m
}

func TestArchive(t *testing.T) {
	// A restrictive umask must not narrow what lanes can read.
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)

	dir := filepath.Join(t.TempDir(), "research", "run-1")
	p := testPage()
	path, err := Archive(dir, p)
	if err != nil {
		t.Fatalf("Archive: %v", err)
	}
	sum := sha256.Sum256([]byte("http://example.org/asked"))
	name := hex.EncodeToString(sum[:])
	if want := filepath.Join(dir, name+".body"); path != want {
		t.Errorf("path %s; want %s (named by the requested URL's SHA-256)", path, want)
	}
	if body, err := os.ReadFile(path); err != nil || !bytes.Equal(body, p.Body) {
		t.Errorf("body %q, %v; want %q", body, err, p.Body)
	}
	bodySum := sha256.Sum256(p.Body)
	want := Metadata{
		URL: p.URL, Requested: p.Requested, FetchedAt: p.FetchedAt, Status: 200,
		ContentType: p.ContentType, Size: len(p.Body), SHA256: hex.EncodeToString(bodySum[:]),
		Body: name + ".body",
	}
	if m := readMeta(t, filepath.Join(dir, name+".json")); m != want {
		t.Errorf("metadata %+v; want %+v", m, want)
	}
	for _, c := range []struct {
		path string
		mode os.FileMode
	}{{dir, os.ModeDir | 0o755}, {path, 0o644}, {filepath.Join(dir, name+".json"), 0o644}} {
		if fi, err := os.Lstat(c.path); err != nil || fi.Mode() != c.mode {
			t.Errorf("%s: %v, %v; want mode %v", c.path, fi.Mode(), err, c.mode)
		}
	}

	// Stable: the same URL again lands on the same name, replacing it.
	p.Body = []byte("changed")
	again, err := Archive(dir, p)
	if err != nil || again != path {
		t.Fatalf("Archive again: %s, %v; want %s", again, err, path)
	}
	if body, _ := os.ReadFile(path); string(body) != "changed" {
		t.Errorf("body after the second archive: %q", body)
	}
	if m := readMeta(t, filepath.Join(dir, name+".json")); m.Size != 7 {
		t.Errorf("metadata size after the second archive: %d", m.Size)
	}
	// Nothing else left behind: no temporary files.
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("folder holds %v; want the body and its metadata", names)
	}
}

func TestArchiveDoesNotFollowSymlinks(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "research")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := testPage()
	name := ArchiveName(p)
	victim := filepath.Join(base, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Someone planted links where the files will go.
	for _, ext := range []string{".body", ".json"} {
		if err := os.Symlink(victim, filepath.Join(dir, name+ext)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Archive(dir, p); err != nil {
		t.Fatalf("Archive: %v", err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Errorf("the link's target was written: %q", b)
	}
	for _, ext := range []string{".body", ".json"} {
		if fi, err := os.Lstat(filepath.Join(dir, name+ext)); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s: %v, %v; want a regular file in the link's place", name+ext, fi.Mode(), err)
		}
	}

	// The folder itself a symlink: refused, nothing written through it.
	elsewhere := filepath.Join(base, "elsewhere")
	if err := os.Mkdir(elsewhere, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(elsewhere, link); err != nil {
		t.Fatal(err)
	}
	if path, err := Archive(link, p); err == nil {
		t.Errorf("Archive into a symlinked folder: %s; want an error", path)
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Errorf("%d files written through the symlinked folder", len(entries))
	}
}

func TestArchiveNameFallsBackToURL(t *testing.T) {
	p := testPage()
	p.Requested = ""
	sum := sha256.Sum256([]byte(p.URL))
	if got := ArchiveName(p); got != hex.EncodeToString(sum[:]) {
		t.Errorf("ArchiveName without Requested = %s; want the final URL's hash", got)
	}
}
