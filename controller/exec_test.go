package controller

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// joinFrames puts a stream's frames back together and checks each one:
// text frames hold only whole UTF-8, byte frames only what is not UTF-8.
func joinFrames(t *testing.T, fs []ExecFrame) []byte {
	t.Helper()
	var out []byte
	for _, f := range fs {
		if (f.Data == "") == (f.DataB64 == nil) {
			t.Fatalf("frame %+v: want exactly one of data and data_b64", f)
		}
		if f.Data != "" && !utf8.ValidString(f.Data) {
			t.Fatalf("frame data %q is not whole UTF-8", f.Data)
		}
		if f.DataB64 != nil && utf8.Valid(f.DataB64) {
			t.Fatalf("frame data_b64 %q is valid UTF-8: it belongs in data", f.DataB64)
		}
		out = append(out, f.Data...)
		out = append(out, f.DataB64...)
	}
	return out
}

// TestExecFramesNeverSplitUTF8 cuts text with two-, three- and four-byte
// characters at every byte: no frame ends inside a character, nothing
// goes as base64, and the bytes come back whole.
func TestExecFramesNeverSplitUTF8(t *testing.T) {
	text := []byte("aé€😀z")
	for cut := 0; cut <= len(text); cut++ {
		var u utf8Framer
		fs := u.frames("stdout", text[:cut], false)
		fs = append(fs, u.frames("stdout", text[cut:], false)...)
		fs = append(fs, u.frames("stdout", nil, true)...)
		for _, f := range fs {
			if f.DataB64 != nil || strings.ContainsRune(f.Data, utf8.RuneError) {
				t.Fatalf("cut at %d: frame %+v", cut, f)
			}
		}
		if got := joinFrames(t, fs); !bytes.Equal(got, text) {
			t.Fatalf("cut at %d: %q, want %q", cut, got, text)
		}
	}
}

// TestExecFramesCarryNonUTF8AsBase64: bytes that are not UTF-8 (a
// binary's output) travel as they are, in data_b64, between text frames,
// and a sequence the stream never finished goes as bytes at its end.
func TestExecFramesCarryNonUTF8AsBase64(t *testing.T) {
	var u utf8Framer
	in := []byte("ok\xff\xfe\x00rest\xe2\x82")
	fs := append(u.frames("stderr", in, false), u.frames("stderr", nil, true)...)
	if got := joinFrames(t, fs); !bytes.Equal(got, in) {
		t.Fatalf("%q, want %q", got, in)
	}
	if len(fs) != 4 || fs[0].Data != "ok" || string(fs[1].DataB64) != "\xff\xfe" || fs[2].Data != "\x00rest" || string(fs[3].DataB64) != "\xe2\x82" {
		t.Fatalf("frames %+v", fs)
	}
	j, _ := json.Marshal(fs[1])
	if string(j) != `{"stream":"stderr","data_b64":"//4="}` {
		t.Fatalf("byte frame encodes as %s", j)
	}
}

// TestOutputFrameHasNoExitCode: an output frame says nothing of how the
// command ended; the last frame says exit 0 when it was 0.
func TestOutputFrameHasNoExitCode(t *testing.T) {
	j, _ := json.Marshal(ExecFrame{Stream: "stdout", Data: "hi"})
	if string(j) != `{"stream":"stdout","data":"hi"}` {
		t.Fatalf("output frame %s", j)
	}
	j, _ = json.Marshal(ExecFrame{Done: true, WallMS: 3})
	if !strings.Contains(string(j), `"exit_code":0`) || !strings.Contains(string(j), `"done":true`) {
		t.Fatalf("last frame %s", j)
	}
}

// TestExecCwdOutsideWorkspaceRefused: a cwd that climbs out of the
// workspace, by ".." or by an absolute path elsewhere, is refused; one
// inside, relative or absolute, is the folder it names.
func TestExecCwdOutsideWorkspaceRefused(t *testing.T) {
	ws := "/scratch/trials/t1/workspace"
	for _, bad := range []string{"..", "../x", "a/../../b", "/etc", "/scratch/trials/t1/workspace/../agent"} {
		if p, err := insideRoot(ws, bad); err == nil {
			t.Errorf("cwd %q accepted as %s", bad, p)
		}
	}
	for in, want := range map[string]string{"": ws, ".": ws, "src": ws + "/src", "a/../src/": ws + "/src", ws + "/src": ws + "/src", ws: ws} {
		if p, err := insideRoot(ws, in); err != nil || p != want {
			t.Errorf("cwd %q: %q %v, want %q", in, p, err, want)
		}
	}
}
