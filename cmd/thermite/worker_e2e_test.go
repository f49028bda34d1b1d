package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"thermite/controller"
	"thermite/internal/testrig"
)

// TestExecStreamKeepsBytesWhole runs commands through the harness API as
// the lane: text whose characters straddle the controller's 32 KiB reads
// comes back as the same text with no U+FFFD, bytes that are not UTF-8
// come back as themselves in data_b64, stdin reaches the command, cwd
// inside the workspace is where it runs, and a cwd outside is refused.
func TestExecStreamKeepsBytesWhole(t *testing.T) {
	r := newRig(t)
	p := makeProject(t, r)
	info, a := startTrial(t, r, 1, p)

	t.Run("a character at a read boundary is not split", func(t *testing.T) {
		// 32767 bytes then é: its two bytes lie across the first read.
		script := `head -c 32767 /dev/zero | tr '\0' a; printf '\303\251'; printf '\342\202\254%.0s' $(seq 1 20000)`
		code, _, raw := a.do("POST", "/v1/exec", map[string]any{"argv": []string{"sh", "-c", script}})
		out, final := frames(t, raw)
		want := strings.Repeat("a", 32767) + "é" + strings.Repeat("€", 20000)
		if code != 200 || final.ExitCode != 0 || out != want {
			t.Fatalf("exit %+v, %d bytes back, want %d", final, len(out), len(want))
		}
		for _, l := range strings.Split(strings.TrimSpace(raw), "\n") {
			var f controller.ExecFrame
			json.Unmarshal([]byte(l), &f)
			if f.DataB64 != nil || strings.ContainsRune(f.Data, utf8.RuneError) {
				t.Fatalf("a text frame went as bytes or with U+FFFD: %.120s", l)
			}
		}
	})

	t.Run("binary output travels as base64 bytes", func(t *testing.T) {
		code, _, raw := a.do("POST", "/v1/exec", map[string]any{"argv": []string{"printf", `ok\377\376\000end`}})
		out, _ := frames(t, raw)
		if code != 200 || out != "ok\xff\xfe\x00end" || !strings.Contains(raw, `"data_b64":"//4="`) {
			t.Fatalf("%d %q %s", code, out, raw)
		}
	})

	t.Run("stdin and cwd", func(t *testing.T) {
		code, _, raw := a.do("POST", "/v1/exec", map[string]any{"argv": []string{"sh", "-c", "pwd; cat"}, "cwd": "src", "stdin": "from stdin\n"})
		out, final := frames(t, raw)
		if code != 200 || final.ExitCode != 0 || out != info.Workspace+"/src\nfrom stdin\n" {
			t.Fatalf("%d %q %+v", code, out, final)
		}
		code, _, raw = a.do("POST", "/v1/exec", map[string]any{"argv": []string{"wc", "-c"}, "stdin_b64": []byte{0xff, 0, 1}})
		if out, _ = frames(t, raw); code != 200 || strings.TrimSpace(out) != "3" {
			t.Fatalf("stdin_b64: %d %q", code, out)
		}
	})

	t.Run("a cwd outside the workspace is refused", func(t *testing.T) {
		for _, cwd := range []string{"../agent", "/etc", info.AgentDir} {
			code, _, raw := a.do("POST", "/v1/exec", map[string]any{"argv": []string{"pwd"}, "cwd": cwd})
			if code != 400 || !strings.Contains(raw, "cwd") {
				t.Errorf("cwd %q: %d %s", cwd, code, raw)
			}
		}
	})
}

// TestHarnessAPIKeepsItsDocument drives a real controller: the scheme
// "bearer" in lower case is taken, a known path with a wrong method is
// 405 with Allow, the file helper's root is refused as an unknown field,
// refusals are RFC 9457 problems naming no type of the server's, the
// served document is docs/openapi.json, and no answer of the whole run
// had a status the document does not declare (the controller logs any).
func TestHarnessAPIKeepsItsDocument(t *testing.T) {
	r := newRig(t)
	p := makeProject(t, r)
	_, a := startTrial(t, r, 1, p)

	lower := &agentClient{t: t, socket: a.socket}
	req := func(method, path, auth, body string) (int, http.Header, string) {
		hr, _ := http.NewRequest(method, "http://api"+path, strings.NewReader(body))
		if auth != "" {
			hr.Header.Set("Authorization", auth)
		}
		resp, err := unixClient(lower.socket).Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(raw)
	}
	if code, _, raw := req("GET", "/v1/trial", "bearer "+a.token, ""); code != 200 {
		t.Errorf("scheme bearer in lower case: %d %s", code, raw)
	}
	if code, h, raw := req("GET", "/v1/fs/read", "Bearer "+a.token, ""); code != 405 || h.Get("Allow") != "POST" || !strings.Contains(raw, `"code":"method_not_allowed"`) {
		t.Errorf("GET /v1/fs/read: %d Allow %q %s", code, h.Get("Allow"), raw)
	}
	for body, code := range map[string]string{
		`{"path":"README","root":1}`:  "unknown_field",
		`{"path":"README","Root":1}`:  "unknown_field",
		`[]`:                          "bad_json",
		`{"path":["README"]}`:         "bad_field",
		`{"path":"../../etc/passwd"}`: "escape",
	} {
		status, h, raw := req("POST", "/v1/fs/read", "Bearer "+a.token, body)
		var prob controller.Problem
		json.Unmarshal([]byte(raw), &prob)
		if status/100 != 4 || prob.Code != code || prob.Status != status || h.Get("Content-Type") != "application/problem+json" ||
			strings.Contains(raw, "lanefs") || strings.Contains(raw, "Go value") || strings.Contains(raw, "controller.") {
			t.Errorf("fs/read %s: %d %s, want code %s", body, status, raw, code)
		}
	}
	code, _, raw := req("GET", "/v1/openapi.json", "", "")
	file, _ := os.ReadFile(filepath.Join(testrig.ModuleRoot(), "docs", "openapi.json"))
	if code != 200 || raw != string(file) {
		t.Errorf("GET /v1/openapi.json: %d, not docs/openapi.json", code)
	}
	// Every route once, well and badly, then the log.
	for _, path := range []string{"/v1/fs/list", "/v1/fs/stat", "/v1/fs/find", "/v1/fs/grep", "/v1/research/list", "/v1/research/search", "/v1/steps", "/v1/research/note", "/v1/fetch", "/v1/exec"} {
		req("POST", path, "Bearer "+a.token, `{}`)
		req("POST", path, "Bearer "+a.token, `{"nope":1}`)
		req("POST", path, "", `{}`)
	}
	if !strings.Contains(r.LogText(), "controller serving") {
		t.Fatal("the rig's log holds none of the controller's lines: the check below would see nothing")
	}
	if strings.Contains(r.LogText(), "not in the API document") {
		t.Errorf("an answer's status is not in the document:\n%s", grepLines(r.LogText(), "not in the API document"))
	}
}

func unixClient(socket string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}}
}

func grepLines(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
