package main

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"thermite/controller"
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
