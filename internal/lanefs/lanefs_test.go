package lanefs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMain lets the test binary be the helper itself (see uid_test.go).
func TestMain(m *testing.M) {
	if os.Getenv("LANEFS_TEST_HELPER") == "1" {
		os.Exit(ServeMain(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// socketPair is a connected pair of stream sockets, as the broker gives
// the helper.
func socketPair(t testing.TB) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	return conn(fds[0]), conn(fds[1])
}

// start runs a server on roots in this process and returns a client.
func start(t testing.TB, roots ...string) *Client {
	t.Helper()
	s, err := NewServer(roots)
	if err != nil {
		t.Fatal(err)
	}
	sc, cc := socketPair(t)
	done := make(chan error, 1)
	go func() { done <- s.Serve(sc, sc); sc.Close() }()
	c := NewClient(cc)
	t.Cleanup(func() {
		c.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		s.Close()
	})
	return c
}

// fixture is a workspace beside a folder outside it, with canaries.
type fixture struct {
	base, ws, outside string
	c                 *Client
	snap              map[string]string
}

const canary = "CANARY-do-not-touch"

// outsideMarker is a name only outside the workspace has.
const outsideMarker = "marker-outside-only"

func newFixture(t *testing.T) *fixture {
	t.Helper()
	base := t.TempDir()
	f := &fixture{base: base, ws: filepath.Join(base, "ws"), outside: filepath.Join(base, "outside")}
	mk := func(p, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ln := func(target, p string) {
		t.Helper()
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	mk(filepath.Join(f.outside, "canary"), canary)
	mk(filepath.Join(f.outside, "sub", "canary"), canary)
	mk(filepath.Join(f.outside, outsideMarker), canary)
	mk(filepath.Join(f.outside, "sub", outsideMarker), canary)
	mk(filepath.Join(f.ws, "file"), "hello\n")
	mk(filepath.Join(f.ws, "sub", "inner"), "inner\n")
	ln("sub/inner", filepath.Join(f.ws, "in"))                  // a file inside
	ln("sub", filepath.Join(f.ws, "indir"))                     // a folder inside
	ln("/etc", filepath.Join(f.ws, "out"))                      // a folder outside
	ln("/etc/passwd", filepath.Join(f.ws, "outpw"))             // a file outside
	ln("../outside", filepath.Join(f.ws, "outrel"))             // relative, leading out
	ln(f.outside, filepath.Join(f.ws, "outdir"))                // absolute, leading out
	ln(filepath.Join(f.ws, "file"), filepath.Join(f.ws, "abs")) // absolute, pointing inside
	f.snap = snapshot(t, f.outside)
	f.c = start(t, f.ws, f.outside)
	return f
}

// snapshot records every entry below dir: type, mode, content, mtime.
func snapshot(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		v := fmt.Sprintf("%v %d", fi.Mode(), fi.ModTime().UnixNano())
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += " " + string(b)
		}
		out[p] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// checkOutside fails if anything outside the workspace changed.
func (f *fixture) checkOutside(t testing.TB) {
	t.Helper()
	now := snapshot(t, f.outside)
	for p, v := range f.snap {
		if now[p] != v {
			t.Errorf("outside the workspace, %s changed: %q, was %q", p, now[p], v)
		}
	}
	for p := range now {
		if _, ok := f.snap[p]; !ok {
			t.Errorf("outside the workspace, %s appeared", p)
		}
	}
	if b, err := os.ReadFile("/etc/passwd"); err != nil || !bytes.Contains(b, []byte("root:")) {
		t.Errorf("/etc/passwd: %v", err)
	}
}

var ctx = context.Background()

// code is err's code, or "" when it is nil; it fails on an error that
// is not *Error.
func code(t testing.TB, err error) string {
	t.Helper()
	if err == nil {
		return ""
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not *Error", err, err)
	}
	return e.Code
}

func wantCode(t testing.TB, err error, want, msgPart string) {
	t.Helper()
	if got := code(t, err); got != want {
		t.Fatalf("got code %q (%v), want %q", got, err, want)
	}
	if msgPart != "" && !strings.Contains(err.Error(), msgPart) {
		t.Fatalf("message %q does not say %q", err.Error(), msgPart)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Fatalf("message %q is not one line", err.Error())
	}
}

func TestReadAndStatAndList(t *testing.T) {
	f := newFixture(t)
	c := f.c
	r, err := Read.Call(ctx, c, ReadRequest{Path: "file"})
	if err != nil || string(r.Data) != "hello\n" || r.Size != 6 || r.Truncated {
		t.Fatalf("read: %+v %v", r, err)
	}
	r, err = Read.Call(ctx, c, ReadRequest{Path: "file", Offset: 1, Limit: 3})
	if err != nil || string(r.Data) != "ell" || r.Size != 6 || !r.Truncated {
		t.Fatalf("read part: %+v %v", r, err)
	}
	r, err = Read.Call(ctx, c, ReadRequest{Path: "file", Offset: 100})
	if err != nil || len(r.Data) != 0 || r.Truncated {
		t.Fatalf("read past the end: %+v %v", r, err)
	}
	_, err = Read.Call(ctx, c, ReadRequest{Path: "file", Offset: -1})
	wantCode(t, err, CodeBadRequest, "negative")
	_, err = Read.Call(ctx, c, ReadRequest{Path: "nope"})
	wantCode(t, err, CodeNotFound, "lanefs: nope: no such file or folder")
	_, err = Read.Call(ctx, c, ReadRequest{Path: "sub"})
	wantCode(t, err, CodeBadRequest, "is a folder")
	_, err = Read.Call(ctx, c, ReadRequest{Path: "file/x"})
	wantCode(t, err, CodeBadRequest, "not a folder")
	_, err = Read.Call(ctx, c, ReadRequest{Path: ""})
	wantCode(t, err, CodeBadRequest, "empty path")
	if err := unix.Mkfifo(filepath.Join(f.ws, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Read.Call(ctx, c, ReadRequest{Path: "fifo"})
	wantCode(t, err, CodeBadRequest, "not a regular file")

	// Symlinks that stay inside are followed.
	for _, p := range []string{"in", "indir/inner", "sub/../in", "./sub//inner"} {
		r, err := Read.Call(ctx, c, ReadRequest{Path: p})
		if err != nil || string(r.Data) != "inner\n" {
			t.Fatalf("read %s: %+v %v", p, r, err)
		}
	}
	// The second root.
	r, err = Read.Call(ctx, c, ReadRequest{Root: 1, Path: "canary"})
	if err != nil || string(r.Data) != canary {
		t.Fatalf("read root 1: %+v %v", r, err)
	}
	_, err = Read.Call(ctx, c, ReadRequest{Root: 2, Path: "canary"})
	wantCode(t, err, CodeBadRequest, "root 2")
	_, err = Read.Call(ctx, c, ReadRequest{Root: 1, Path: "../ws/file"})
	wantCode(t, err, CodeEscape, "lanefs: ../ws/file: leaves root 1")

	st, err := Stat.Call(ctx, c, StatRequest{Path: "file"})
	if err != nil || st.Name != "file" || st.Type != TypeFile || st.Size != 6 || st.Mode != 0o644 || time.Since(st.MTime) > time.Hour {
		t.Fatalf("stat: %+v %v", st, err)
	}
	st, err = Stat.Call(ctx, c, StatRequest{Path: "outpw"})
	if err != nil || st.Type != TypeSymlink || st.Target != "/etc/passwd" {
		t.Fatalf("stat of a symlink (lstat): %+v %v", st, err)
	}
	st, err = Stat.Call(ctx, c, StatRequest{Path: "indir/inner"})
	if err != nil || st.Type != TypeFile || st.Name != "inner" {
		t.Fatalf("stat through a symlink inside: %+v %v", st, err)
	}
	for _, p := range []string{"", ".", "sub/.."} {
		st, err = Stat.Call(ctx, c, StatRequest{Path: p})
		if err != nil || st.Type != TypeDir {
			t.Fatalf("stat %q: %+v %v", p, st, err)
		}
	}
	_, err = Stat.Call(ctx, c, StatRequest{Path: "sub/nope"})
	wantCode(t, err, CodeNotFound, "sub/nope")

	l, err := List.Call(ctx, c, ListRequest{Path: ""})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	types := map[string]string{}
	for _, e := range l.Entries {
		names = append(names, e.Name)
		types[e.Name] = e.Type
	}
	if got := strings.Join(names, " "); got != "abs fifo file in indir out outdir outpw outrel sub" || l.Truncated {
		t.Fatalf("list: %s", got)
	}
	if types["file"] != TypeFile || types["sub"] != TypeDir || types["out"] != TypeSymlink || types["fifo"] != TypeOther {
		t.Fatalf("list types: %v", types)
	}
	l, err = List.Call(ctx, c, ListRequest{Path: "indir"})
	if err != nil || len(l.Entries) != 1 || l.Entries[0].Name != "inner" {
		t.Fatalf("list through a symlink inside: %+v %v", l, err)
	}
	_, err = List.Call(ctx, c, ListRequest{Path: "file"})
	wantCode(t, err, CodeBadRequest, "not a folder")
	f.checkOutside(t)
}

func TestReadLimit(t *testing.T) {
	ws := t.TempDir()
	big := bytes.Repeat([]byte("0123456789abcdef"), (MaxRead+1<<20)/16)
	if err := os.WriteFile(filepath.Join(ws, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	c := start(t, ws)
	for _, limit := range []int64{0, MaxRead + 5} {
		r, err := Read.Call(ctx, c, ReadRequest{Path: "big", Limit: limit})
		if err != nil || len(r.Data) != MaxRead || r.Size != int64(len(big)) || !r.Truncated || !bytes.Equal(r.Data, big[:MaxRead]) {
			t.Fatalf("limit %d: %d bytes, size %d, truncated %v, %v", limit, len(r.Data), r.Size, r.Truncated, err)
		}
	}
	r, err := Read.Call(ctx, c, ReadRequest{Path: "big", Offset: MaxRead})
	if err != nil || !bytes.Equal(r.Data, big[MaxRead:]) || r.Truncated {
		t.Fatalf("the rest: %d bytes, %v", len(r.Data), err)
	}
}

func TestWriteMkdirDelete(t *testing.T) {
	f := newFixture(t)
	c := f.c
	w, err := Write.Call(ctx, c, WriteRequest{Path: "new.txt", Data: []byte("abc")})
	if err != nil || w.Size != 3 {
		t.Fatalf("write: %+v %v", w, err)
	}
	assertFile(t, filepath.Join(f.ws, "new.txt"), "abc", 0o644)
	// Mode: given, then kept when a write does not give one.
	if _, err := Write.Call(ctx, c, WriteRequest{Path: "run.sh", Data: []byte("#!/bin/sh\n"), Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	if _, err := Write.Call(ctx, c, WriteRequest{Path: "run.sh", Data: []byte("#!/bin/sh\ntrue\n")}); err != nil {
		t.Fatal(err)
	}
	assertFile(t, filepath.Join(f.ws, "run.sh"), "#!/bin/sh\ntrue\n", 0o755)
	_, err = Write.Call(ctx, c, WriteRequest{Path: "x", Mode: 0o4755})
	wantCode(t, err, CodeBadRequest, "only permission bits")
	_, err = Write.Call(ctx, c, WriteRequest{Path: "a/b/c.txt", Data: []byte("deep")})
	wantCode(t, err, CodeNotFound, "a/b/c.txt")
	if _, err := Write.Call(ctx, c, WriteRequest{Path: "a/b/c.txt", Data: []byte("deep"), CreateParents: true}); err != nil {
		t.Fatal(err)
	}
	assertFile(t, filepath.Join(f.ws, "a/b/c.txt"), "deep", 0o644)
	// Through a symlink inside, to a folder: allowed.
	if _, err := Write.Call(ctx, c, WriteRequest{Path: "indir/via", Data: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	assertFile(t, filepath.Join(f.ws, "sub/via"), "v", 0o644)
	_, err = Write.Call(ctx, c, WriteRequest{Path: "sub", Data: []byte("v")})
	wantCode(t, err, CodeBadRequest, "is a folder")
	_, err = Write.Call(ctx, c, WriteRequest{Path: ".", Data: []byte("v")})
	wantCode(t, err, CodeBadRequest, "names a folder")
	_, err = Write.Call(ctx, c, WriteRequest{Path: "sub/.", Data: []byte("v")})
	wantCode(t, err, CodeBadRequest, "names a folder")
	noTemps(t, f.ws)

	// mkdir
	m, err := Mkdir.Call(ctx, c, MkdirRequest{Path: "d1"})
	if err != nil || !m.Created {
		t.Fatalf("mkdir: %+v %v", m, err)
	}
	assertDir(t, filepath.Join(f.ws, "d1"), 0o755)
	_, err = Mkdir.Call(ctx, c, MkdirRequest{Path: "d1"})
	wantCode(t, err, CodeExists, "d1: already exists")
	_, err = Mkdir.Call(ctx, c, MkdirRequest{Path: "p/q/r"})
	wantCode(t, err, CodeNotFound, "p/q/r")
	m, err = Mkdir.Call(ctx, c, MkdirRequest{Path: "p/q/r", Parents: true, Mode: 0o750})
	if err != nil || !m.Created {
		t.Fatalf("mkdir -p: %+v %v", m, err)
	}
	assertDir(t, filepath.Join(f.ws, "p/q/r"), 0o750)
	m, err = Mkdir.Call(ctx, c, MkdirRequest{Path: "p/q/r/", Parents: true})
	if err != nil || m.Created {
		t.Fatalf("mkdir -p again: %+v %v", m, err)
	}
	if _, err := Mkdir.Call(ctx, c, MkdirRequest{Path: "p/../indir/made", Parents: true}); err != nil {
		t.Fatal(err)
	}
	assertDir(t, filepath.Join(f.ws, "sub/made"), 0o755)
	_, err = Mkdir.Call(ctx, c, MkdirRequest{Path: "new1/new2/../../../x", Parents: true})
	wantCode(t, err, CodeEscape, "leaves the workspace")
	gone(t, filepath.Join(f.ws, "new1")) // nothing made on the way out
	_, err = Mkdir.Call(ctx, c, MkdirRequest{Path: "file/x", Parents: true})
	wantCode(t, err, CodeBadRequest, "not a folder")

	// delete
	d, err := Delete.Call(ctx, c, DeleteRequest{Path: "new.txt"})
	if err != nil || d.Removed != 1 {
		t.Fatalf("delete: %+v %v", d, err)
	}
	gone(t, filepath.Join(f.ws, "new.txt"))
	if _, err := Delete.Call(ctx, c, DeleteRequest{Path: "d1"}); err != nil {
		t.Fatal(err)
	}
	gone(t, filepath.Join(f.ws, "d1"))
	_, err = Delete.Call(ctx, c, DeleteRequest{Path: "p"})
	wantCode(t, err, CodeBadRequest, "not empty")
	d, err = Delete.Call(ctx, c, DeleteRequest{Path: "p", Recursive: true})
	if err != nil || d.Removed != 3 {
		t.Fatalf("delete -r: %+v %v", d, err)
	}
	gone(t, filepath.Join(f.ws, "p"))
	_, err = Delete.Call(ctx, c, DeleteRequest{Path: "p"})
	wantCode(t, err, CodeNotFound, "p: no such")
	for _, p := range []string{".", "", "sub/.."} {
		_, err = Delete.Call(ctx, c, DeleteRequest{Path: p, Recursive: true})
		wantCode(t, err, CodeBadRequest, "")
	}
	// A symlink is removed itself, never what it points to, even
	// recursively.
	for _, p := range []string{"outdir", "out", "outpw", "indir/"} {
		d, err = Delete.Call(ctx, c, DeleteRequest{Path: p, Recursive: true})
		if err != nil || d.Removed != 1 {
			t.Fatalf("delete %s: %+v %v", p, d, err)
		}
		gone(t, filepath.Join(f.ws, strings.TrimSuffix(p, "/")))
	}
	assertFile(t, filepath.Join(f.ws, "sub/inner"), "inner\n", 0o644)
	// A tree with a symlink out inside it.
	if err := os.MkdirAll(filepath.Join(f.ws, "t/u"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(f.outside, filepath.Join(f.ws, "t/u/evil")); err != nil {
		t.Fatal(err)
	}
	d, err = Delete.Call(ctx, c, DeleteRequest{Path: "t", Recursive: true})
	if err != nil || d.Removed != 3 {
		t.Fatalf("delete -r a tree with a symlink out: %+v %v", d, err)
	}
	f.checkOutside(t)
}

func assertFile(t testing.TB, p, content string, mode os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != mode {
		t.Fatalf("%s: %v, want a file %v", p, fi.Mode(), mode)
	}
	b, err := os.ReadFile(p)
	if err != nil || string(b) != content {
		t.Fatalf("%s: %q %v, want %q", p, b, err, content)
	}
}

func assertDir(t testing.TB, p string, mode os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.IsDir() || fi.Mode().Perm() != mode {
		t.Fatalf("%s: %v, want a folder %v", p, fi.Mode(), mode)
	}
}

func gone(t testing.TB, p string) {
	t.Helper()
	if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s: still there (%v)", p, err)
	}
}

// noTemps fails if a write left a temporary file behind.
func noTemps(t testing.TB, dir string) {
	t.Helper()
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && strings.HasPrefix(fi.Name(), ".lanefs-") {
			t.Errorf("temporary file left: %s", p)
		}
		return nil
	})
}

// TestWriteOverSymlink: a symlink planted at a write's target name is
// replaced by the new file (rename replaces the name); what it pointed to,
// inside or out, is untouched.
func TestWriteOverSymlink(t *testing.T) {
	f := newFixture(t)
	if err := os.Symlink(filepath.Join(f.outside, "canary"), filepath.Join(f.ws, "target")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../outside/canary", filepath.Join(f.ws, "target2")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"target", "target2", "in", "outpw", "outdir"} {
		if _, err := Write.Call(ctx, f.c, WriteRequest{Path: p, Data: []byte("new " + p)}); err != nil {
			t.Fatalf("write %s: %v", p, err)
		}
		assertFile(t, filepath.Join(f.ws, p), "new "+p, 0o644)
	}
	assertFile(t, filepath.Join(f.ws, "sub/inner"), "inner\n", 0o644)
	// edit refuses a symlink rather than replace it.
	if err := os.Symlink(filepath.Join(f.outside, "canary"), filepath.Join(f.ws, "target3")); err != nil {
		t.Fatal(err)
	}
	_, err := Edit.Call(ctx, f.c, EditRequest{Path: "target3", Old: "CANARY", New: "x"})
	wantCode(t, err, CodeBadRequest, "is a symlink")
	noTemps(t, f.ws)
	f.checkOutside(t)
}

func TestEdit(t *testing.T) {
	ws := t.TempDir()
	p := filepath.Join(ws, "e.txt")
	if err := os.WriteFile(p, []byte("one two two three\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := start(t, ws)
	_, err := Edit.Call(ctx, c, EditRequest{Path: "e.txt", Old: "two", New: "2"})
	wantCode(t, err, CodeBadRequest, "lanefs: e.txt: old string occurs 2 times")
	_, err = Edit.Call(ctx, c, EditRequest{Path: "e.txt", Old: "four", New: "4"})
	wantCode(t, err, CodeBadRequest, "lanefs: e.txt: old string not found")
	_, err = Edit.Call(ctx, c, EditRequest{Path: "e.txt", Old: "", New: "4"})
	wantCode(t, err, CodeBadRequest, "old string is empty")
	_, err = Edit.Call(ctx, c, EditRequest{Path: "nope", Old: "a", New: "b"})
	wantCode(t, err, CodeNotFound, "nope")
	assertFile(t, p, "one two two three\n", 0o600)
	e, err := Edit.Call(ctx, c, EditRequest{Path: "e.txt", Old: "two three", New: "3"})
	if err != nil || e.Size != int64(len("one two 3\n")) {
		t.Fatalf("edit: %+v %v", e, err)
	}
	assertFile(t, p, "one two 3\n", 0o600)
	if _, err := Edit.Call(ctx, c, EditRequest{Path: "e.txt", Old: "one ", New: ""}); err != nil {
		t.Fatal(err)
	}
	assertFile(t, p, "two 3\n", 0o600)
	noTemps(t, ws)
}

func TestGrep(t *testing.T) {
	ws := t.TempDir()
	files := map[string]string{
		"a.go":      "package a\nfoo bar\r\nnothing\nfoo baz",
		"b.txt":     "foo\n",
		"bin.dat":   "foo\x00foo\n",
		"sub/c.go":  "x\nfoo\n",
		"many.txt":  strings.Repeat("foo\n", 50),
		"long.txt":  "foo" + strings.Repeat("é", MaxLine) + "\n",
		"sub/d/e.c": "nothing",
	}
	for p, s := range files {
		os.MkdirAll(filepath.Join(ws, filepath.Dir(p)), 0o755)
		if err := os.WriteFile(filepath.Join(ws, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.Symlink("a.go", filepath.Join(ws, "link.go"))
	os.Symlink("sub", filepath.Join(ws, "linkdir"))
	c := start(t, ws)

	g, err := Grep.Call(ctx, c, GrepRequest{Pattern: "foo", Glob: "*.go"})
	if err != nil {
		t.Fatal(err)
	}
	if got := matches(g); got != "a.go:2:foo bar a.go:4:foo baz sub/c.go:2:foo" || g.Truncated {
		t.Fatalf("grep *.go: %s", got)
	}
	g, err = Grep.Call(ctx, c, GrepRequest{Pattern: "^foo", MaxMatches: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if g.BinarySkipped != 1 || g.FilesScanned != 6 || len(g.Matches) != 2+1+50+1+1 || g.Truncated {
		t.Fatalf("grep all: skipped %d, scanned %d, %d matches, truncated %v", g.BinarySkipped, g.FilesScanned, len(g.Matches), g.Truncated)
	}
	for _, m := range g.Matches {
		if m.Path == "bin.dat" || strings.HasPrefix(m.Path, "link") {
			t.Fatalf("grep reported %s: binary files and symlinks are skipped", m.Path)
		}
		if m.Path == "long.txt" && (len(m.Line) > MaxLine || !strings.HasPrefix(m.Line, "foo") || !utf8Valid(m.Line)) {
			t.Fatalf("a long line came back as %d bytes", len(m.Line))
		}
	}
	g, err = Grep.Call(ctx, c, GrepRequest{Pattern: "foo", MaxMatches: 10})
	if err != nil || len(g.Matches) != 10 || !g.Truncated {
		t.Fatalf("grep with a cap: %d matches, truncated %v, %v", len(g.Matches), g.Truncated, err)
	}
	g, err = Grep.Call(ctx, c, GrepRequest{Pattern: "foo", MaxMatches: MaxMatches + 1})
	if err != nil || g.Truncated {
		t.Fatalf("grep with a cap over the most: %v %v", g.Truncated, err)
	}
	g, err = Grep.Call(ctx, c, GrepRequest{Path: "linkdir", Pattern: "foo"})
	if err != nil || matches(g) != "linkdir/c.go:2:foo" {
		t.Fatalf("grep below a symlink inside: %s %v", matches(g), err)
	}
	g, err = Grep.Call(ctx, c, GrepRequest{Path: "sub/c.go", Pattern: "fo+"})
	if err != nil || matches(g) != "sub/c.go:2:foo" {
		t.Fatalf("grep one file: %s %v", matches(g), err)
	}
	g, err = Grep.Call(ctx, c, GrepRequest{Pattern: "foo", Glob: "sub/*.go"})
	if err != nil || matches(g) != "sub/c.go:2:foo" {
		t.Fatalf("grep with a path glob: %s %v", matches(g), err)
	}
	_, err = Grep.Call(ctx, c, GrepRequest{Pattern: "foo("})
	wantCode(t, err, CodeBadRequest, "pattern")
	_, err = Grep.Call(ctx, c, GrepRequest{Pattern: "foo", Glob: "["})
	wantCode(t, err, CodeBadRequest, "glob")
	_, err = Grep.Call(ctx, c, GrepRequest{Path: "../", Pattern: "foo"})
	wantCode(t, err, CodeEscape, "leaves the workspace")
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }

func matches(g *GrepResponse) string {
	var s []string
	for _, m := range g.Matches {
		s = append(s, fmt.Sprintf("%s:%d:%s", m.Path, m.LineNo, m.Line))
	}
	return strings.Join(s, " ")
}

func TestFind(t *testing.T) {
	f := newFixture(t)
	os.WriteFile(filepath.Join(f.ws, "sub", "x.go"), nil, 0o644)
	os.WriteFile(filepath.Join(f.ws, "y.go"), nil, 0o644)
	r, err := Find.Call(ctx, f.c, FindRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(r.Paths, " "); got != "abs file in indir out outdir outpw outrel sub sub/inner sub/x.go y.go" || r.Truncated {
		t.Fatalf("find: %s", got)
	}
	r, err = Find.Call(ctx, f.c, FindRequest{Glob: "*.go"})
	if got := strings.Join(r.Paths, " "); err != nil || got != "sub/x.go y.go" {
		t.Fatalf("find *.go: %s %v", got, err)
	}
	r, err = Find.Call(ctx, f.c, FindRequest{Path: "indir/", Glob: "*.go"})
	if got := strings.Join(r.Paths, " "); err != nil || got != "indir/x.go" {
		t.Fatalf("find below a symlink inside: %s %v", got, err)
	}
	r, err = Find.Call(ctx, f.c, FindRequest{Glob: "sub/*"})
	if got := strings.Join(r.Paths, " "); err != nil || got != "sub/inner sub/x.go" {
		t.Fatalf("find with a path glob: %s %v", got, err)
	}
	r, err = Find.Call(ctx, f.c, FindRequest{Max: 3})
	if err != nil || len(r.Paths) != 3 || !r.Truncated {
		t.Fatalf("find with a cap: %v %v", r, err)
	}
	_, err = Find.Call(ctx, f.c, FindRequest{Path: "file"})
	wantCode(t, err, CodeBadRequest, "not a folder")
	f.checkOutside(t)
}

// TestEscapes: every operation refuses every path that leaves the
// workspace, with code escape and the path named.
func TestEscapes(t *testing.T) {
	f := newFixture(t)
	c := f.c
	// Paths whose folder part leaves: refused by every operation.
	leave := []string{
		"..", "../", "../outside/canary", "../outside/new", "/etc/passwd", "/", "/tmp/new",
		"out/passwd", "out/new", "outrel/canary", "outrel/new", "outdir/canary", "outdir/new",
		"outdir/sub/canary", "sub/../../outside/canary", "indir/../../outside/canary",
		"abs", // an absolute symlink is refused even when it points inside
	}
	ops := map[string]func(p string) error{
		"read": func(p string) error { _, err := Read.Call(ctx, c, ReadRequest{Path: p}); return err },
		"write": func(p string) error {
			_, err := Write.Call(ctx, c, WriteRequest{Path: p + "/w", Data: []byte("x")})
			return err
		},
		"write-parents": func(p string) error {
			_, err := Write.Call(ctx, c, WriteRequest{Path: p + "/w/x", Data: []byte("x"), CreateParents: true})
			return err
		},
		"edit": func(p string) error {
			_, err := Edit.Call(ctx, c, EditRequest{Path: p + "/canary", Old: "CANARY", New: "x"})
			return err
		},
		"list": func(p string) error { _, err := List.Call(ctx, c, ListRequest{Path: p}); return err },
		"stat": func(p string) error { _, err := Stat.Call(ctx, c, StatRequest{Path: p + "/canary"}); return err },
		"delete": func(p string) error {
			_, err := Delete.Call(ctx, c, DeleteRequest{Path: p + "/canary", Recursive: true})
			return err
		},
		"mkdir": func(p string) error { _, err := Mkdir.Call(ctx, c, MkdirRequest{Path: p + "/m"}); return err },
		"mkdir-p": func(p string) error {
			_, err := Mkdir.Call(ctx, c, MkdirRequest{Path: p + "/m/n", Parents: true})
			return err
		},
		"grep": func(p string) error { _, err := Grep.Call(ctx, c, GrepRequest{Path: p, Pattern: "."}); return err },
		"find": func(p string) error { _, err := Find.Call(ctx, c, FindRequest{Path: p}); return err },
	}
	for name, op := range ops {
		for _, p := range leave {
			err := op(p)
			if got := code(t, err); got != CodeEscape {
				t.Errorf("%s %q: got %q (%v), want escape", name, p, got, err)
				continue
			}
			if !strings.HasSuffix(err.Error(), ": leaves the workspace") || !strings.HasPrefix(err.Error(), "lanefs: ") {
				t.Errorf("%s %q: message %q", name, p, err)
			}
		}
	}
	// The exact form, for the API.
	_, err := Read.Call(ctx, c, ReadRequest{Path: "../etc/passwd"})
	if err == nil || err.Error() != "lanefs: ../etc/passwd: leaves the workspace" {
		t.Errorf("message: %v", err)
	}
	var e *Error
	if !errors.As(err, &e) || e.HTTPStatus() != 403 {
		t.Errorf("status: %v", err)
	}
	// Final symlinks that lead out are refused by what follows them.
	for _, p := range []string{"outpw", "out", "outdir", "outrel"} {
		_, err := Read.Call(ctx, c, ReadRequest{Path: p})
		wantCode(t, err, CodeEscape, p+": leaves the workspace")
		if p != "outpw" {
			_, err = List.Call(ctx, c, ListRequest{Path: p})
			wantCode(t, err, CodeEscape, "leaves the workspace")
			_, err = Find.Call(ctx, c, FindRequest{Path: p})
			wantCode(t, err, CodeEscape, "leaves the workspace")
		}
		_, err = Grep.Call(ctx, c, GrepRequest{Path: p, Pattern: "."})
		wantCode(t, err, CodeEscape, "leaves the workspace")
	}
	// A symlink loop is refused too.
	os.Symlink("loop2", filepath.Join(f.ws, "loop1"))
	os.Symlink("loop1", filepath.Join(f.ws, "loop2"))
	_, err = Read.Call(ctx, c, ReadRequest{Path: "loop1"})
	wantCode(t, err, CodeEscape, "symlink loop")
	// A magic link: /proc is outside anyway, but say so.
	os.Symlink("/proc/self/root/etc/passwd", filepath.Join(f.ws, "magic"))
	_, err = Read.Call(ctx, c, ReadRequest{Path: "magic"})
	wantCode(t, err, CodeEscape, "")
	f.checkOutside(t)
	noTemps(t, f.base)
}

func TestProtocolErrors(t *testing.T) {
	ws := t.TempDir()
	s, err := NewServer([]string{ws})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, e := s.Handle("chmod", nil); e == nil || e.Code != CodeBadRequest || !strings.Contains(e.Msg, `unknown operation "chmod"`) {
		t.Fatalf("unknown op: %v", e)
	}
	if _, e := s.Handle(Read.Name, json.RawMessage(`{"path":"x","recurse":true}`)); e == nil || e.Code != CodeBadRequest || !strings.Contains(e.Msg, "recurse") {
		t.Fatalf("unknown field: %v", e)
	}
	if _, e := s.Handle(Read.Name, json.RawMessage(`{"path":7}`)); e == nil || e.Code != CodeBadRequest {
		t.Fatalf("bad field type: %v", e)
	}
	for _, roots := range [][]string{nil, {"rel"}, {ws, filepath.Join(ws, "missing")}} {
		if _, err := NewServer(roots); err == nil {
			t.Fatalf("NewServer(%q) accepted", roots)
		}
	}
	l := filepath.Join(t.TempDir(), "l")
	os.Symlink(ws, l)
	if _, err := NewServer([]string{l}); err == nil {
		t.Fatal("NewServer accepted a root that is a symlink")
	}
}

// rawServer runs a server on one end of a socketpair and gives the test
// the other end to speak raw frames on.
func rawServer(t *testing.T) (net.Conn, chan error) {
	ws := t.TempDir()
	s, err := NewServer([]string{ws})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	sc, cc := socketPair(t)
	done := make(chan error, 1)
	go func() { done <- s.Serve(sc, sc); sc.Close() }()
	t.Cleanup(func() { cc.Close() })
	return cc, done
}

func rawAnswer(t *testing.T, c net.Conn) wireResponse {
	t.Helper()
	body, err := readFrame(bufio.NewReader(c))
	if err != nil {
		t.Fatal(err)
	}
	var r wireResponse
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestFrameLimit(t *testing.T) {
	// The client refuses to send a frame over the limit, and the
	// connection stays good.
	ws := t.TempDir()
	c := start(t, ws)
	_, err := Write.Call(ctx, c, WriteRequest{Path: "huge", Data: make([]byte, 13<<20)})
	wantCode(t, err, CodeTooLarge, "over the 16777216-byte frame limit")
	if _, err := Write.Call(ctx, c, WriteRequest{Path: "ok", Data: make([]byte, 11<<20)}); err != nil {
		t.Fatalf("a write just under the limit: %v", err)
	}
	gone(t, filepath.Join(ws, "huge"))

	// The server answers a header over the limit with id 0 and closes.
	conn, done := rawServer(t)
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], MaxFrame+1)
	conn.Write(hdr[:])
	r := rawAnswer(t, conn)
	if r.ID != 0 || r.Error == nil || r.Error.Code != CodeTooLarge || r.Error.Msg != "lanefs: a frame of 16777217 bytes is over the 16777216-byte limit" {
		t.Fatalf("answer to a frame over the limit: %+v %+v", r, r.Error)
	}
	if err := <-done; err == nil {
		t.Fatal("Serve went on after a frame over the limit")
	}

	// A frame that is not JSON: the same.
	conn, done = rawServer(t)
	binary.BigEndian.PutUint32(hdr[:], 3)
	conn.Write(append(hdr[:], "{x}"...))
	if r := rawAnswer(t, conn); r.ID != 0 || r.Error == nil || r.Error.Code != CodeBadRequest {
		t.Fatalf("answer to a bad frame: %+v", r)
	}
	if err := <-done; err == nil {
		t.Fatal("Serve went on after a bad frame")
	}

	// The client, answered with a frame over the limit, fails every call
	// with ErrConnection.
	sc, cc := socketPair(t)
	go func() {
		readFrame(bufio.NewReader(sc))
		binary.BigEndian.PutUint32(hdr[:], 1<<31)
		sc.Write(hdr[:])
	}()
	defer sc.Close()
	cl := NewClient(cc)
	defer cl.Close()
	_, err = Stat.Call(ctx, cl, StatRequest{Path: "x"})
	if !errors.Is(err, ErrConnection) || !strings.Contains(err.Error(), "over the 16777216-byte limit") {
		t.Fatalf("client answered over the limit: %v", err)
	}
	if _, err = Stat.Call(ctx, cl, StatRequest{Path: "x"}); !errors.Is(err, ErrConnection) {
		t.Fatalf("client after a broken connection: %v", err)
	}
}

// TestOutOfOrder: answers are matched by id, whatever their order.
func TestOutOfOrder(t *testing.T) {
	sc, cc := socketPair(t)
	defer sc.Close()
	go func() {
		br := bufio.NewReader(sc)
		var reqs []wireRequest
		for range 2 {
			body, err := readFrame(br)
			if err != nil {
				return
			}
			var r wireRequest
			json.Unmarshal(body, &r)
			reqs = append(reqs, r)
		}
		for i := len(reqs) - 1; i >= 0; i-- {
			var p ReadRequest
			json.Unmarshal(reqs[i].Args, &p)
			buf, b, _ := encodeFrame(outResponse{ID: reqs[i].ID, Result: ReadResponse{Data: []byte(p.Path)}})
			sc.Write(b)
			putBuf(buf)
		}
	}()
	c := NewClient(cc)
	defer c.Close()
	var wg sync.WaitGroup
	for _, p := range []string{"first", "second"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := Read.Call(ctx, c, ReadRequest{Path: p})
			if err != nil || string(r.Data) != p {
				t.Errorf("read %s: %v %v", p, r, err)
			}
		}()
	}
	wg.Wait()
}

func TestContextAndClose(t *testing.T) {
	// A server that never answers.
	sc, cc := socketPair(t)
	defer sc.Close()
	go io.Copy(io.Discard, sc)
	c := NewClient(cc)
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := Read.Call(cctx, c, ReadRequest{Path: "x"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read with a deadline: %v", err)
	}
	errc := make(chan error)
	go func() { _, err := Read.Call(ctx, c, ReadRequest{Path: "x"}); errc <- err }()
	time.Sleep(20 * time.Millisecond)
	c.Close()
	if err := <-errc; !errors.Is(err, ErrConnection) {
		t.Fatalf("read on a closed client: %v", err)
	}
}

// TestConcurrent: many calls at once on one client, each getting its own
// answer.
func TestConcurrent(t *testing.T) {
	ws := t.TempDir()
	c := start(t, ws)
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				p := fmt.Sprintf("g%d/f%d", g, i%7)
				want := fmt.Sprintf("goroutine %d round %d", g, i)
				if _, err := Write.Call(ctx, c, WriteRequest{Path: p, Data: []byte(want), CreateParents: true}); err != nil {
					t.Error(err)
					return
				}
				r, err := Read.Call(ctx, c, ReadRequest{Path: p})
				if err != nil || string(r.Data) != want {
					t.Errorf("read %s: %v %v", p, r, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	noTemps(t, ws)
}

// TestGrepPassesOverASparseFile: a lane publishes a file that takes a
// few blocks and reads as far more (its start text, the rest a hole: 16
// TiB of it would hold a searching lane's file helper for an hour).
// Another lane's grep of the research folder takes it as binary, as GNU
// grep does, and reads none of its hole, while a plain file beside it is
// searched. A file that grows after grep looked at it is read only up to
// the size it had then.
func TestGrepPassesOverASparseFile(t *testing.T) {
	ws := t.TempDir()
	f, err := os.Create(filepath.Join(ws, "sparse.txt"))
	if err != nil {
		t.Fatal(err)
	}
	// More text than the binary sniff reads, so that only the hole can
	// make it binary.
	f.WriteString("needle in a sparse file\n" + strings.Repeat("filler\n", binarySniff))
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	os.WriteFile(filepath.Join(ws, "plain.txt"), []byte("a needle\n"), 0o644)
	c := start(t, ws)
	g, err := Grep.Call(ctx, c, GrepRequest{Pattern: "needle"})
	if err != nil {
		t.Fatal(err)
	}
	if matches(g) != "plain.txt:1:a needle" || g.BinarySkipped != 1 || g.FilesScanned != 1 {
		t.Fatalf("grep beside a sparse file: %d matches, %d skipped, %d scanned; want plain.txt's match alone, the sparse file skipped", len(g.Matches), g.BinarySkipped, g.FilesScanned)
	}
	g, err = Grep.Call(ctx, c, GrepRequest{Path: "sparse.txt", Pattern: "needle"})
	if err != nil || len(g.Matches) != 0 || g.BinarySkipped != 1 {
		t.Fatalf("grep of the sparse file itself: %d matches, %d skipped, %v; want it skipped", len(g.Matches), g.BinarySkipped, err)
	}

	grow := filepath.Join(ws, "grows.txt")
	os.WriteFile(grow, []byte("0123456789"), 0o644)
	fd, err := unix.Open(grow, unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	r := &sizeReader{fd: fd, left: 10}
	if err := os.WriteFile(grow, []byte("0123456789more and more"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(r); err != nil || string(got) != "0123456789" {
		t.Fatalf("a file grown after the check: read %q %v, want its first 10 bytes", got, err)
	}
}
