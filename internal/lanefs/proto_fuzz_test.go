package lanefs

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fuzzSecret is the content of every file outside the served folders: an
// answer that holds it read past its root. Files inside hold lower-case
// text only, so even a short read of it is told apart.
const fuzzSecret = "FUZZSECRET0123456789QXJWV"

// leaks says whether an encoded answer holds a piece of fuzzSecret: as
// text (grep's lines), or base64 (read's data) from any offset.
func leaks(answer []byte) bool {
	if bytes.Contains(answer, []byte(fuzzSecret[:8])) {
		return true
	}
	for k := range 3 {
		enc := base64.StdEncoding.EncodeToString([]byte(fuzzSecret[k:]))
		enc = enc[:len(enc)-4] // the last group depends on where a read stops
		for i := 0; i+8 <= len(enc); i += 4 {
			if bytes.Contains(answer, []byte(enc[i:i+8])) {
				return true
			}
		}
	}
	return false
}

// fuzzTree is a workspace (root 0) and a research folder (root 1) beside
// a folder neither may reach, with symlinks inside, out by a relative
// path, and out by an absolute one. No link leads to the host's own
// files: the fuzzer runs as whoever runs the tests, root included.
type fuzzTree struct {
	base, ws, research, outside string
	snap                        map[string]string
}

func newFuzzTree(t *testing.T) *fuzzTree {
	t.Helper()
	base := t.TempDir()
	ft := &fuzzTree{base: base, ws: filepath.Join(base, "ws"), research: filepath.Join(base, "research"), outside: filepath.Join(base, "outside")}
	for _, d := range []string{ft.ws + "/sub/deeper", ft.research + "/notes", ft.outside + "/sub"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		ft.ws + "/file":              "hello\nworld\n",
		ft.ws + "/sub/inner":         "inner line\n",
		ft.research + "/notes/n1.md": "# note\n",
		ft.outside + "/secret":       fuzzSecret,
		ft.outside + "/sub/secret":   fuzzSecret,
	}
	for p, c := range files {
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{
		ft.ws + "/in":           "sub/inner",
		ft.ws + "/indir":        "sub",
		ft.ws + "/outrel":       "../outside",
		ft.ws + "/outsecret":    "../outside/secret",
		ft.ws + "/outabs":       ft.outside,
		ft.ws + "/sub/up":       "../../outside/sub",
		ft.research + "/toWS":   "../ws",
		ft.research + "/outabs": ft.outside + "/secret",
	}
	for p, target := range links {
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	ft.snap = snapshot(t, ft.outside)
	return ft
}

// check fails if anything outside the roots changed, or if the base
// folder gained an entry (a write that landed beside the roots).
func (ft *fuzzTree) check(t *testing.T, answer []byte) {
	t.Helper()
	now := snapshot(t, ft.outside)
	for p, v := range ft.snap {
		if now[p] != v {
			t.Fatalf("outside the roots, %s changed: %q, was %q", p, now[p], v)
		}
	}
	for p := range now {
		if _, ok := ft.snap[p]; !ok {
			t.Fatalf("outside the roots, %s appeared", p)
		}
	}
	ents, err := os.ReadDir(ft.base)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 3 {
		t.Fatalf("the folder above the roots holds %d entries, not 3", len(ents))
	}
	if leaks(answer) {
		t.Fatalf("an answer holds a file from outside the roots: %.300q", answer)
	}
}

var fuzzOps = []string{Read.Name, Write.Name, Edit.Name, List.Name, Stat.Name, Delete.Name, Mkdir.Name, Grep.Name, Find.Name}

// FuzzHandle runs one request, any operation, path and arguments, on a
// fresh tree. Whatever it does, nothing outside its roots changes or is
// read; a request that succeeds named a path that stays inside (not
// absolute, no ".." above the root), and every path an answer gives back
// is relative to the root and stays inside it.
func FuzzHandle(f *testing.F) {
	f.Add(uint8(0), uint8(0), "file", `{}`)
	f.Add(uint8(1), uint8(0), "new/dir/f", `{"data":"aGk=","create_parents":true}`)
	f.Add(uint8(7), uint8(0), "", `{"pattern":"line","glob":"*"}`)
	f.Add(uint8(0), uint8(0), "outrel/secret", `{}`)
	f.Fuzz(func(t *testing.T, op, root uint8, path, args string) {
		ft := newFuzzTree(t)
		s, err := NewServer([]string{ft.ws, ft.research})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		// The path and root go in as fields, so that most inputs reach
		// the operation; args that are not an object go in as they are.
		var m map[string]any
		raw := []byte(args)
		if json.Unmarshal(raw, &m) == nil && m != nil {
			m["path"] = path
			m["root"] = int(root%3) - (int(root) / 128) // -1 to 2: one out of range each way
			raw, _ = json.Marshal(m)
		}
		name := fuzzOps[int(op)%len(fuzzOps)]
		res, e := s.Handle(name, raw)
		answer, _ := json.Marshal(res)
		if e != nil {
			answer, _ = json.Marshal(e)
		}
		ft.check(t, answer)
		if rr, ok := res.(*ReadResponse); ok && len(rr.Data) > 0 && strings.Contains(fuzzSecret, string(rr.Data)) {
			t.Fatalf("read %q: a file from outside the roots", rr.Data)
		}
		if e != nil {
			if e.Code == "" || (e.HTTPStatus() == 500 && e.Code != CodeIO) {
				t.Fatalf("an error without a known code: %+v", e)
			}
			return
		}
		var req struct {
			Path string `json:"path"`
		}
		json.Unmarshal(raw, &req)
		if !stays(req.Path) {
			t.Fatalf("%s of %q succeeded: the path leaves its root", name, req.Path)
		}
		var back []string
		switch r := res.(type) {
		case *FindResponse:
			back = r.Paths
		case *GrepResponse:
			for _, m := range r.Matches {
				back = append(back, m.Path)
			}
		}
		for _, p := range back {
			if p == "" || !stays(p) {
				t.Fatalf("%s answered with the path %q, which leaves its root", name, p)
			}
		}
	})
}

// stays says whether a request's path, read lexically, stays beneath its
// root: "" is the root itself; nothing absolute, nothing through "..".
func stays(p string) bool {
	if p == "" {
		return true
	}
	p = strings.TrimRight(p, "/")
	if p == "" || filepath.IsAbs(p) {
		return false
	}
	return filepath.IsLocal(p) || filepath.Clean(p) == "."
}

// FuzzServe feeds the server any byte stream as its requests. Every
// answer is a whole frame that decodes as an answer, at most one (the
// last) has id 0 and then Serve has stopped with an error, and nothing
// outside the roots changes or is read.
func FuzzServe(f *testing.F) {
	f.Add(frameOf(`{"id":1,"op":"read","args":{"root":0,"path":"file"}}`))
	f.Add(append(frameOf(`{"id":1,"op":"list","args":{"root":0,"path":""}}`), frameOf(`{"id":2,"op":"stat","args":{"root":1,"path":"notes"}}`)...))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, stream []byte) {
		ft := newFuzzTree(t)
		s, err := NewServer([]string{ft.ws, ft.research})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		var out bytes.Buffer
		serr := s.Serve(bytes.NewReader(stream), &out)
		ft.check(t, out.Bytes())
		br := bufio.NewReader(bytes.NewReader(out.Bytes()))
		zero := false
		for {
			body, err := readFrame(br)
			if err != nil {
				if br.Buffered() > 0 {
					t.Fatalf("the answers end in a broken frame: %v", err)
				}
				break
			}
			if zero {
				t.Fatal("an answer follows the id-0 answer that closes the connection")
			}
			var resp struct {
				ID     uint64          `json:"id"`
				Error  *Error          `json:"error"`
				Result json.RawMessage `json:"result"`
			}
			if err := strictDecode(body, &resp); err != nil {
				t.Fatalf("an answer that does not decode: %v: %.200q", err, body)
			}
			if (resp.Error == nil) == (resp.Result == nil) {
				t.Fatalf("an answer with neither or both of error and result: %.200q", body)
			}
			zero = resp.ID == 0
			if zero && serr == nil {
				t.Fatalf("an id-0 answer, which closes the connection, and Serve went on: %.200q", body)
			}
		}
	})
}

// frameOf is body as one frame.
func frameOf(body string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	return append(b, body...)
}

// FuzzClientAnswers plays the helper, which runs as the lane's user, and
// answers three calls in flight with any byte stream before it goes
// away. The controller's client never hangs or panics on it: each call
// returns, with a result, a request's *Error, or ErrConnection.
func FuzzClientAnswers(f *testing.F) {
	f.Add(frameOf(`{"id":1,"result":{"data":"aGk=","size":2,"truncated":false}}`))
	f.Add(append(frameOf(`{"id":2,"error":{"code":"not_found","msg":"x"}}`), frameOf(`{"id":0,"error":{"code":"too_large","msg":"y"}}`)...))
	f.Add(frameOf(`{"id":3,"result":{"paths":["a"],"truncated":true}}`))
	f.Fuzz(func(t *testing.T, stream []byte) {
		helper, conn := socketPair(t)
		defer helper.Close()
		c := NewClient(conn)
		defer c.Close()
		errs := make(chan error, 3)
		// One call at a time gets under way, so that ids 1, 2, 3 are
		// read, stat and find in every run and a failure reproduces.
		calls := []func() error{
			func() error { _, err := Read.Call(ctx, c, ReadRequest{Path: "file"}); return err },
			func() error { _, err := Stat.Call(ctx, c, StatRequest{Path: "file"}); return err },
			func() error { _, err := Find.Call(ctx, c, FindRequest{Path: ""}); return err },
		}
		for i, call := range calls {
			go func() { errs <- call() }()
			for deadline := time.Now().Add(5 * time.Second); ; {
				c.mu.Lock()
				n := len(c.pending)
				c.mu.Unlock()
				if n == i+1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("call %d never got under way", i+1)
				}
				time.Sleep(20 * time.Microsecond)
			}
		}
		helper.Write(stream)
		helper.Close()
		timeout := time.After(10 * time.Second)
		for range 3 {
			select {
			case err := <-errs:
				var le *Error
				if err != nil && !errors.As(err, &le) && !errors.Is(err, ErrConnection) {
					t.Fatalf("a call failed with %T %v, neither *Error nor ErrConnection", err, err)
				}
			case <-timeout:
				t.Fatal("a call still waits after the helper went away")
			}
		}
	})
}
