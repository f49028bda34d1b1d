package rig

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"thermite/controller"
	"thermite/internal/testrig"
)

// agentClient calls the harness API on its unix socket with a token.
type agentClient struct {
	t      *testing.T
	socket string
	token  string
}

func (a *agentClient) do(method, path string, body any) (int, map[string]any, string) {
	a.t.Helper()
	var rd io.Reader
	if body != nil {
		switch b := body.(type) {
		case string:
			rd = strings.NewReader(b)
		default:
			j, _ := json.Marshal(b)
			rd = bytes.NewReader(j)
		}
	}
	req, _ := http.NewRequest(method, "http://api"+path, rd)
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	if rd != nil {
		// As a careful client does: the body goes only once the server
		// wants it, so a body refused by its length is answered 413, not
		// cut off mid-write.
		req.Header.Set("Expect", "100-continue")
	}
	c := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: 10 * time.Second, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", a.socket)
	}}}
	resp, err := c.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	json.Unmarshal(raw, &m)
	return resp.StatusCode, m, string(raw)
}

func startTrial(t *testing.T, r *testrig.Rig, lane int, project string, extra ...string) (controller.TrialInfo, *agentClient) {
	t.Helper()
	args := append([]string{"trial", "start", "--lane", itoa(lane), "--project", project, "--json"}, extra...)
	out, stderr, code := r.Thermite(args...)
	if code != 0 {
		t.Fatalf("trial start lane %d: exit %d %s", lane, code, stderr)
	}
	var info controller.TrialInfo
	testrig.JSON(t, out, &info)
	tok, err := os.ReadFile(info.TokenFile)
	if err != nil {
		t.Fatal(err)
	}
	// The test process is root: it calls the API on the operator's socket,
	// which takes any open trial's token (each role's takes only its own
	// uid, issue 27).
	return info, &agentClient{t: t, socket: r.Cfg.APISocket(), token: strings.TrimSpace(string(tok))}
}

func makeProject(t *testing.T, r *testrig.Rig) string {
	p := filepath.Join(r.Dir, "project")
	os.MkdirAll(filepath.Join(p, "src"), 0o755)
	os.WriteFile(filepath.Join(p, "README"), []byte("hello project\n"), 0o644)
	os.WriteFile(filepath.Join(p, "src", "main.txt"), []byte("alpha\nbeta needle\ngamma\n"), 0o644)
	return p
}

// frames reads an exec's NDJSON answer.
func frames(t *testing.T, raw string) (stdout string, final controller.ExecFrame) {
	t.Helper()
	for _, l := range strings.Split(strings.TrimSpace(raw), "\n") {
		var f controller.ExecFrame
		if err := json.Unmarshal([]byte(l), &f); err != nil {
			t.Fatalf("frame %q: %v", l, err)
		}
		if f.Stream == "stdout" {
			stdout += f.Data + string(f.DataB64)
		}
		if !f.Done && strings.Contains(l, "exit_code") {
			t.Fatalf("output frame %s carries an exit code", l)
		}
		if f.Done {
			final = f
		}
	}
	return stdout, final
}

func TestTrialsAndTheHarnessAPI(t *testing.T) {
	r := newRig(t)
	p := makeProject(t, r)
	t1, a1 := startTrial(t, r, 1, p, "--run", "r1")
	t2, a2 := startTrial(t, r, 2, p, "--run", "r1")
	lane1 := r.Role("lane-1")

	t.Run("one open trial per lane", func(t *testing.T) {
		_, stderr, code := r.Thermite("trial", "start", "--lane", "1", "--project", p)
		if code == 0 || !strings.Contains(stderr, "lane 1 already has an open trial, "+t1.ID) {
			t.Fatalf("exit %d %q", code, stderr)
		}
	})

	t.Run("the workspace is the lane's own copy", func(t *testing.T) {
		var st syscallStat
		statOf(t, t1.Workspace, &st)
		if int(st.Uid) != lane1.UID || st.Mode&0o777 != 0o700 {
			t.Fatalf("workspace %d %o, want lane-1's 0700", st.Uid, st.Mode&0o777)
		}
		statOf(t, filepath.Join(t1.Workspace, "src", "main.txt"), &st)
		if int(st.Uid) != lane1.UID {
			t.Fatalf("a copied file is uid %d, not lane-1's", st.Uid)
		}
		statOf(t, t1.AgentDir, &st)
		if int(st.Uid) != r.Role("agent-1").UID || st.Mode&0o777 != 0o700 {
			t.Fatalf("agent folder %d %o", st.Uid, st.Mode&0o777)
		}
	})

	t.Run("file tools work in its own workspace, as the lane", func(t *testing.T) {
		code, _, raw := a1.do("POST", "/v1/fs/write", map[string]any{"path": "notes/new.txt", "data": []byte("one two\n"), "create_parents": true})
		if code != 200 {
			t.Fatalf("write: %d %s", code, raw)
		}
		var st syscallStat
		statOf(t, filepath.Join(t1.Workspace, "notes", "new.txt"), &st)
		if int(st.Uid) != lane1.UID {
			t.Fatalf("a written file is uid %d, not lane-1's %d", st.Uid, lane1.UID)
		}
		if code, _, raw = a1.do("POST", "/v1/fs/edit", map[string]any{"path": "notes/new.txt", "old": "two", "new": "three"}); code != 200 {
			t.Fatalf("edit: %d %s", code, raw)
		}
		var m map[string]any
		code, m, _ = a1.do("POST", "/v1/fs/read", map[string]any{"path": "notes/new.txt"})
		if code != 200 || m["data"] != "b25lIHRocmVlCg==" {
			t.Fatalf("read after edit: %d %v", code, m)
		}
		if code, _, raw = a1.do("POST", "/v1/fs/edit", map[string]any{"path": "src/main.txt", "old": "a", "new": "b"}); code != 400 || !strings.Contains(raw, "occurs") {
			t.Errorf("an edit of a string that is not unique: %d %s", code, raw)
		}
		for _, c := range []struct {
			route string
			body  map[string]any
			want  string
		}{
			{"/v1/fs/list", map[string]any{"path": "src"}, "main.txt"},
			{"/v1/fs/stat", map[string]any{"path": "README"}, `"size":14`},
			{"/v1/fs/grep", map[string]any{"pattern": "needle"}, "beta needle"},
			{"/v1/fs/find", map[string]any{"glob": "*.txt"}, "src/main.txt"},
			{"/v1/fs/mkdir", map[string]any{"path": "d/e", "parents": true}, "created"},
			{"/v1/fs/delete", map[string]any{"path": "d", "recursive": true}, "removed"},
			{"/v1/trial", nil, t1.ID},
		} {
			method := "POST"
			if c.body == nil {
				method = "GET"
			}
			var body any
			if c.body != nil {
				body = c.body
			}
			code, _, raw := a1.do(method, c.route, body)
			if code != 200 || !strings.Contains(raw, c.want) {
				t.Errorf("%s: %d %s, want %q", c.route, code, raw, c.want)
			}
		}
	})

	t.Run("paths that leave the workspace are refused with 403 naming them", func(t *testing.T) {
		// A symlink planted by a lane command, pointing out.
		if _, stderr, code := r.Thermite("trial", "exec", t1.ID, "--", "ln", "-s", "/etc", "escape"); code != 0 {
			t.Fatalf("ln: %s", stderr)
		}
		if _, stderr, code := r.Thermite("trial", "exec", t1.ID, "--", "ln", "-s", t2.Workspace, "other"); code != 0 {
			t.Fatalf("ln: %s", stderr)
		}
		for _, path := range []string{"../../../etc/passwd", "/etc/passwd", filepath.Join(t2.Workspace, "README"), "escape/passwd", "other/README", "src/../../" + filepath.Base(t2.Workspace)} {
			for _, route := range []string{"/v1/fs/read", "/v1/fs/write", "/v1/fs/list", "/v1/fs/delete"} {
				body := map[string]any{"path": path}
				if route == "/v1/fs/write" {
					body["data"] = []byte("x")
				}
				code, _, raw := a1.do("POST", route, body)
				if code != 403 {
					t.Errorf("%s %s: %d %s, want 403", route, path, code, raw)
				} else if !strings.Contains(raw, path) {
					t.Errorf("%s %s: the refusal does not name the path: %s", route, path, raw)
				}
			}
		}
		// Nothing of lane 2's changed.
		if b, _ := os.ReadFile(filepath.Join(t2.Workspace, "README")); string(b) != "hello project\n" {
			t.Fatal("lane 2's README changed")
		}
	})

	t.Run("no token, a wrong one: the same 401", func(t *testing.T) {
		none := &agentClient{t: t, socket: a1.socket}
		wrong := &agentClient{t: t, socket: a1.socket, token: strings.Repeat("0", 64)}
		c1, _, b1 := none.do("GET", "/v1/trial", nil)
		c2, _, b2 := wrong.do("GET", "/v1/trial", nil)
		if c1 != 401 || c2 != 401 || b1 != b2 {
			t.Fatalf("no token %d %q, wrong token %d %q", c1, b1, c2, b2)
		}
	})

	t.Run("bad requests get one line", func(t *testing.T) {
		for _, c := range []struct {
			method, route string
			body          any
			code          int
		}{
			{"POST", "/v1/fs/read", "{not json", 400},
			{"POST", "/v1/fs/read", map[string]any{"path": "README", "sudo": true}, 400},
			{"GET", "/v1/nothing-here", nil, 404},
			{"POST", "/v1/fs/write", map[string]any{"path": "big", "data": make([]byte, 17<<20)}, 413},
		} {
			code, m, raw := a1.do(c.method, c.route, c.body)
			if code != c.code || m["code"] == nil || m["detail"] == nil || strings.Count(strings.TrimSpace(raw), "\n") != 0 {
				t.Errorf("%s %s: %d %.200s, want %d with one error line", c.method, c.route, code, raw, c.code)
			}
		}
	})

	t.Run("exec through the API, as the lane, capped", func(t *testing.T) {
		code, _, raw := a1.do("POST", "/v1/exec", map[string]any{"argv": []string{"id", "-u"}})
		out, final := frames(t, raw)
		if code != 200 || strings.TrimSpace(out) != itoa(lane1.UID) || final.ExitCode != 0 {
			t.Fatalf("id -u: %d %q %+v", code, out, final)
		}
		_, _, raw = a1.do("POST", "/v1/exec", map[string]any{"argv": []string{"head", "-c", "3000000", "/dev/zero"}})
		out, final = frames(t, raw)
		if !final.Truncated || int64(len(out)) != final.OutputCap || final.OutputBytes != 3000000 {
			t.Fatalf("cap: got %d bytes, final %+v", len(out), final)
		}
		_, _, raw = a1.do("POST", "/v1/exec", map[string]any{"argv": []string{"sleep", "10"}, "timeout_ms": 200})
		if _, final = frames(t, raw); final.Stopped != "timeout" {
			t.Fatalf("timeout: %+v", final)
		}
	})

	t.Run("across lanes through the file system", func(t *testing.T) {
		_, stderr, code := r.Thermite("trial", "exec", t1.ID, "--", "cat", filepath.Join(t2.Workspace, "README"))
		if code == 0 || !strings.Contains(stderr, "Permission denied") {
			t.Fatalf("lane 1 read lane 2's workspace: %d %s", code, stderr)
		}
		_, stderr, code = r.Thermite("trial", "exec", t1.ID, "--", "cat", t2.TokenFile)
		if code == 0 || !strings.Contains(stderr, "Permission denied") {
			t.Fatalf("lane 1 read agent 2's token: %d %s", code, stderr)
		}
	})

	t.Run("the agent cannot read its lane's files, only its own folder", func(t *testing.T) {
		_, stderr, code := r.Thermite("trial", "agent", t1.ID, "--", "cat", filepath.Join(t1.Workspace, "README"))
		if code == 0 || !strings.Contains(stderr, "Permission denied") {
			t.Fatalf("agent 1 read lane 1's workspace: %d %s", code, stderr)
		}
		out, stderr, code := r.Thermite("trial", "agent", t1.ID, "--", "sh", "-c", `cat "$THERMITE_TOKEN_FILE" >/dev/null && echo "$HOME $THERMITE_TRIAL"`)
		if code != 0 || strings.TrimSpace(out) != t1.AgentDir+" "+t1.ID {
			t.Fatalf("agent 1 in its folder: %d %q %s", code, out, stderr)
		}
		_, stderr, code = r.Thermite("trial", "agent", t1.ID, "--", "cat", t2.TokenFile)
		if code == 0 || !strings.Contains(stderr, "Permission denied") {
			t.Fatalf("agent 1 read agent 2's token: %d %s", code, stderr)
		}
	})

	t.Run("research: written by the controller, read by every lane", func(t *testing.T) {
		code, m, raw := a1.do("POST", "/v1/research/note", map[string]any{"title": "finding", "body": "the needle is in src"})
		if code != 200 {
			t.Fatalf("note: %d %s", code, raw)
		}
		// The path the note's answer gives is the one research/read takes;
		// the same file's absolute name is taken too.
		rel := m["path"].(string)
		code, _, raw = a2.do("POST", "/v1/research/read", map[string]any{"path": rel})
		if code != 200 || !strings.Contains(raw, "data") || filepath.IsAbs(rel) {
			t.Fatalf("lane 2 reads lane 1's note %q: %d %s", rel, code, raw)
		}
		if code, _, raw = a2.do("POST", "/v1/research/read", map[string]any{"path": filepath.Join(t1.ResearchDir, rel)}); code != 200 {
			t.Fatalf("the note's absolute name: %d %s", code, raw)
		}
		if code, _, raw = a2.do("POST", "/v1/research/search", map[string]any{"pattern": "needle"}); code != 200 || !strings.Contains(raw, rel) {
			t.Fatalf("search: %d %s", code, raw)
		}
		_, stderr, code := r.Thermite("trial", "exec", t2.ID, "--", "touch", filepath.Join(t1.ResearchDir, "notes", "forged.md"))
		if code == 0 || !strings.Contains(stderr, "Permission denied") {
			t.Fatalf("lane 2 wrote the research folder: %d %s", code, stderr)
		}
		// The lane's own area is its alone during its trial.
		if _, stderr, code := r.Thermite("trial", "exec", t1.ID, "--", "sh", "-c", "echo mine > "+t1.LaneArea+"/result.txt"); code != 0 {
			t.Fatalf("lane 1 writes its area: %s", stderr)
		}
		_, _, code = r.Thermite("trial", "exec", t2.ID, "--", "cat", t1.LaneArea+"/result.txt")
		if code == 0 {
			t.Fatalf("lane 2 read lane 1's area during its trial")
		}
		// Steps: capped per step.
		if code, _, raw := a1.do("POST", "/v1/steps", map[string]any{"kind": "thought", "text": strings.Repeat("x", 70<<10)}); code != 413 {
			t.Fatalf("a 70 KiB step: %d %s", code, raw)
		}
		if code, _, raw := a1.do("POST", "/v1/steps", map[string]any{"kind": "thought", "text": "small"}); code != 200 {
			t.Fatalf("a step: %d %s", code, raw)
		}
	})

	t.Run("fetch refuses loopback through the API", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "secret") }))
		code, _, raw := a1.do("POST", "/v1/fetch", map[string]any{"url": "http://" + l.Addr().String() + "/"})
		if code != 403 || !strings.Contains(raw, "loopback") {
			t.Fatalf("fetch of loopback: %d %s", code, raw)
		}
	})

	t.Run("ending a trial", func(t *testing.T) {
		if _, stderr, code := r.Thermite("trial", "exec", t1.ID, "--", "sh", "-c", "setsid -f sleep 600 </dev/null >/dev/null 2>&1"); code != 0 {
			t.Fatal(stderr)
		}
		if len(r.Procs("lane-1")) < 2 { // the leftover and the file helper
			t.Fatalf("lane-1 runs %v", r.Procs("lane-1"))
		}
		out, stderr, code := r.Thermite("trial", "end", t1.ID)
		if code != 0 {
			t.Fatalf("end: %s %s", out, stderr)
		}
		if p := r.Procs("lane-1"); len(p) != 0 {
			t.Fatalf("lane-1 still runs %v after its trial ended", p)
		}
		code, _, raw := a1.do("GET", "/v1/trial", nil)
		none := &agentClient{t: t, socket: a1.socket}
		_, _, rawNone := none.do("GET", "/v1/trial", nil)
		if code != 401 || raw != rawNone {
			t.Fatalf("an ended trial's token: %d %s (no token: %s)", code, raw, rawNone)
		}
		// The lane's research area is published read-only.
		var st syscallStat
		statOf(t, filepath.Join(t1.LaneArea, "result.txt"), &st)
		if int(st.Uid) != r.Role("thermite").UID || st.Mode&0o222 != 0 {
			t.Fatalf("published area file: uid %d mode %o", st.Uid, st.Mode&0o777)
		}
		out, _, code = r.Thermite("trial", "exec", t2.ID, "--", "cat", t1.LaneArea+"/result.txt")
		if code != 0 || strings.TrimSpace(out) != "mine" {
			t.Fatalf("lane 2 cannot read lane 1's published area: %d %q", code, out)
		}
		_, _, code = r.Thermite("trial", "exec", t2.ID, "--", "sh", "-c", "echo x > "+t1.LaneArea+"/result.txt")
		if code == 0 {
			t.Fatalf("lane 2 changed lane 1's published area")
		}
		// The self-test uses the ended trial's token, and finds it refused;
		// forced on a busy rig, the open trial's file helper comes back.
		res, code := selftestJSON(t, r, "--force")
		if code != 0 || !res.Holds {
			t.Fatalf("self-test: %s", res.Sentence)
		}
		seen := 0
		for _, p := range res.Probes {
			if strings.HasPrefix(p.Attempt, "use a token of an ended trial") && p.OK && p.Got == "401" {
				seen++
			}
		}
		if seen == 0 {
			t.Fatal("the self-test did not try an ended trial's token")
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			code, _, raw := a2.do("POST", "/v1/fs/read", map[string]any{"path": "README"})
			if code == 200 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("lane 2's file tools after a forced self-test: %d %s", code, raw)
			}
			time.Sleep(50 * time.Millisecond)
		}
		// A new trial on lane 1 can start now.
		startTrial(t, r, 1, p)
	})

	t.Run("the ledger export has no hidden table and no token", func(t *testing.T) {
		out, _, code := r.Thermite("ledger", "export", "--json")
		if code != 0 || !strings.Contains(out, t1.ID) || !strings.Contains(out, "trial.end") {
			t.Fatalf("export: %d %.300s", code, out)
		}
		if strings.Contains(out, a1.token) || strings.Contains(out, a2.token) {
			t.Fatal("a token in clear in the export")
		}
		if strings.Contains(out, `"hidden"`) {
			t.Fatal("the hidden table in the export")
		}
		// The start-up self-test's verdict is in the ledger too.
		if !strings.Contains(out, "isolation holds: every probe of") {
			t.Fatal("no self-test result in the ledger")
		}
	})

	t.Run("trial list", func(t *testing.T) {
		out, _, code := r.Thermite("trial", "list")
		if code != 0 || !strings.Contains(out, t1.ID) || !strings.Contains(out, "ended") || !strings.Contains(out, t2.ID) {
			t.Fatalf("list: %s", out)
		}
	})
}

func TestTrialSurvivesAControllerCrash(t *testing.T) {
	r := newRig(t)
	p := makeProject(t, r)
	info, a := startTrial(t, r, 1, p)
	before := r.Status()
	if err := syscallKill(before.ControllerPID); err != nil {
		t.Fatal(err)
	}
	waitNewController(t, r, before.ControllerPID)
	// The open trial is picked up again: its token and file tools work.
	code, _, raw := a.do("POST", "/v1/fs/read", map[string]any{"path": "README"})
	if code != 200 {
		t.Fatalf("after the controller restarted: %d %s", code, raw)
	}
	out, _, _ := r.Thermite("trial", "list", "--json")
	if !strings.Contains(out, info.ID) || !strings.Contains(out, `"open"`) {
		t.Fatalf("trial list after the crash: %s", out)
	}
}

type syscallStat = syscall.Stat_t

func statOf(t *testing.T, p string, st *syscall.Stat_t) {
	t.Helper()
	if err := syscall.Lstat(p, st); err != nil {
		t.Fatal(err)
	}
}

func syscallKill(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }

func waitNewController(t *testing.T, r *testrig.Rig, old int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		st := r.Status()
		if st.ControllerUp && st.ControllerPID != old {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("no new controller answers")
}
