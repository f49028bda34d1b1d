package lanefs

import (
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestConfinementRace: while a goroutine swaps folders for symlinks that
// lead out of the workspace (atomically, with RENAME_EXCHANGE) as fast as
// it can, clients read, write, edit, delete, list, grep and find in and
// below them for a second. Nothing outside may be read, changed, made or
// deleted; the canaries outside say so.
func TestConfinementRace(t *testing.T) {
	f := newFixture(t)
	ws := f.ws
	// Pairs of names, one a real folder, one a symlink leading out; each
	// swap exchanges what the two names hold. The third pair lives inside
	// a folder of the second, so walks meet swaps two levels deep. The
	// swapper itself goes by descriptors that never follow a symlink, so
	// that it cannot write outside either.
	type pair struct{ dir, a, b, target string }
	pairs := []pair{
		{"", "d", "dlink", f.outside},
		{"p", "d", "dlink", filepath.Join(f.outside, "sub")},
		{"p/d", "e", "elink", f.outside},
	}
	wsfd, err := unix.Open(ws, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(wsfd)
	strict := unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS
	openDir := func(dir string) (int, error) {
		if dir == "" {
			dir = "."
		}
		return unix.Openat2(wsfd, dir, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: uint64(strict)})
	}
	makeReal := func(dfd int, name string) {
		if unix.Mkdirat(dfd, name, 0o755) != nil {
			return
		}
		fd, err := unix.Openat2(dfd, name+"/f", &unix.OpenHow{Flags: unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL | unix.O_CLOEXEC, Mode: 0o644, Resolve: uint64(strict)})
		if err == nil {
			unix.Write(fd, []byte("inside\n"))
			unix.Close(fd)
		}
	}
	restore := func(dfd int, p pair) {
		var sa, sb unix.Stat_t
		ea := unix.Fstatat(dfd, p.a, &sa, unix.AT_SYMLINK_NOFOLLOW)
		eb := unix.Fstatat(dfd, p.b, &sb, unix.AT_SYMLINK_NOFOLLOW)
		isLink := func(st *unix.Stat_t) bool { return st.Mode&unix.S_IFMT == unix.S_IFLNK }
		switch {
		case ea != nil && eb != nil:
			makeReal(dfd, p.a)
			unix.Symlinkat(p.target, dfd, p.b)
		case ea != nil && isLink(&sb):
			makeReal(dfd, p.a)
		case eb != nil && isLink(&sa):
			makeReal(dfd, p.b)
		case ea != nil:
			unix.Symlinkat(p.target, dfd, p.a)
		case eb != nil:
			unix.Symlinkat(p.target, dfd, p.b)
		}
	}
	round := func(swap bool) int {
		n := 0
		for _, p := range pairs {
			dfd, err := openDir(p.dir)
			if err != nil {
				if p.dir == "p" {
					unix.Mkdirat(wsfd, "p", 0o755)
				}
				continue
			}
			if !swap || unix.Renameat2(dfd, p.a, dfd, p.b, unix.RENAME_EXCHANGE) != nil {
				restore(dfd, p)
			} else {
				n++
			}
			unix.Close(dfd)
		}
		return n
	}
	for range 3 {
		round(false)
	}
	var stop atomic.Bool
	var swaps atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			swaps.Add(int64(round(true)))
		}
	}()

	var escapes, oks atomic.Int64
	leaked := func(s string) bool { return strings.Contains(s, "CANARY") || strings.Contains(s, outsideMarker) }
	check := func(what string, err error, out string) {
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Errorf("%s: %v is not *Error", what, err)
				return
			}
			if e.Code == CodeEscape {
				escapes.Add(1)
			}
			return
		}
		oks.Add(1)
		if leaked(out) {
			t.Errorf("%s: got %q from outside the workspace", what, out)
		}
	}
	deadline := time.Now().Add(time.Second)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := f.c
			for i := 0; time.Now().Before(deadline); i++ {
				for _, dir := range []string{"d", "dlink", "p/d", "p/dlink", "p/d/e", "p/d/elink"} {
					switch (i + w) % 12 {
					case 0:
						r, err := Read.Call(ctx, c, ReadRequest{Path: dir + "/canary"})
						out := ""
						if r != nil {
							out = string(r.Data)
						}
						check("read", err, out)
						r, err = Read.Call(ctx, c, ReadRequest{Path: dir + "/f"})
						if r != nil {
							out = string(r.Data)
						}
						check("read", err, out)
					case 1:
						_, err := Write.Call(ctx, c, WriteRequest{Path: dir + "/canary", Data: []byte("overwritten")})
						check("write", err, "")
						_, err = Write.Call(ctx, c, WriteRequest{Path: dir + "/f", Data: []byte("inside\n")})
						check("write", err, "")
					case 2:
						_, err := Write.Call(ctx, c, WriteRequest{Path: dir + "/new/deep/x", Data: []byte("x"), CreateParents: true})
						check("write -p", err, "")
					case 3:
						_, err := Edit.Call(ctx, c, EditRequest{Path: dir + "/canary", Old: "CANARY", New: "edited"})
						check("edit", err, "")
						_, err = Edit.Call(ctx, c, EditRequest{Path: dir + "/f", Old: "inside", New: "inside"})
						check("edit", err, "")
					case 4:
						_, err := Delete.Call(ctx, c, DeleteRequest{Path: dir + "/canary"})
						check("delete", err, "")
						_, err = Delete.Call(ctx, c, DeleteRequest{Path: dir + "/sub", Recursive: true})
						check("delete -r", err, "")
					case 5:
						_, err := Delete.Call(ctx, c, DeleteRequest{Path: dir + "/new", Recursive: true})
						check("delete -r", err, "")
					case 6:
						r, err := List.Call(ctx, c, ListRequest{Path: dir})
						out := ""
						if r != nil {
							for _, e := range r.Entries {
								out += e.Name + " "
							}
						}
						check("list", err, out)
					case 7:
						st, err := Stat.Call(ctx, c, StatRequest{Path: dir + "/canary"})
						if err == nil && st.Type == TypeFile && st.Size == int64(len(canary)) {
							t.Errorf("stat saw the canary through %s", dir)
						}
						check("stat", err, "")
					case 8:
						_, err := Mkdir.Call(ctx, c, MkdirRequest{Path: dir + "/m/n", Parents: true})
						check("mkdir -p", err, "")
						_, err = Mkdir.Call(ctx, c, MkdirRequest{Path: dir + "/m2"})
						check("mkdir", err, "")
					case 9:
						r, err := Grep.Call(ctx, c, GrepRequest{Path: ".", Pattern: "CANARY"})
						out := ""
						if r != nil {
							out = matches(r)
						}
						check("grep", err, out)
						r, err = Grep.Call(ctx, c, GrepRequest{Path: dir, Pattern: "CANARY"})
						if r != nil {
							out = matches(r)
						}
						check("grep", err, out)
					case 10:
						r, err := Find.Call(ctx, c, FindRequest{Path: ".", Max: MaxFind})
						out := ""
						if r != nil {
							out = strings.Join(r.Paths, " ")
						}
						check("find", err, out)
					case 11:
						if w == 0 && dir == "p/d" {
							_, err := Delete.Call(ctx, c, DeleteRequest{Path: "p", Recursive: true})
							check("delete -r p", err, "")
						}
						_, err := Delete.Call(ctx, c, DeleteRequest{Path: dir, Recursive: true})
						check("delete -r", err, "")
					}
				}
			}
		}()
	}
	time.Sleep(time.Until(deadline))
	stop.Store(true)
	wg.Wait()
	t.Logf("%d swaps; %d calls done, %d refused as escapes", swaps.Load(), oks.Load(), escapes.Load())
	if swaps.Load() == 0 || escapes.Load() == 0 || oks.Load() == 0 {
		t.Errorf("the race did not happen: %d swaps, %d done, %d escapes", swaps.Load(), oks.Load(), escapes.Load())
	}
	f.checkOutside(t)
}
