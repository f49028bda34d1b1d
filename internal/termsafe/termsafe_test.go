package termsafe

import (
	"encoding/json"
	"testing"
)

func TestEscape(t *testing.T) {
	for in, want := range map[string]string{
		"plain text\n\twith tabs":                    "plain text\n\twith tabs",
		"\x1b[2J\x1b[Hverdict: ok":                   `\x1b[2J\x1b[Hverdict: ok`,
		"bell\a del\x7f cr\r":                        `bell\x07 del\x7f cr\x0d`,
		"\x1b]0;title\x07":                           `\x1b]0;title\x07`,
		"csi \u009b31m":                              `csi \u009b31m`,
		"bad utf-8 \xff\xfe":                         `bad utf-8 \xff\xfe`,
		"unicode é ✓ 日本":                             "unicode é ✓ 日本",
		"nul \x00":                                   `nul \x00`,
		"rlo \u202eevil.com\u202c":                   `rlo \u202eevil.com\u202c`,
		"isolate \u2066x\u2069 lrm \u200e ls \u2028": `isolate \u2066x\u2069 lrm \u200e ls \u2028`,
	} {
		if got := Escape(in); got != want {
			t.Errorf("Escape(%q) = %q, want %q", in, got, want)
		}
	}
	if got := Line("a\nb\tc\x1b"); got != `a\nb\tc\x1b` {
		t.Errorf("Line: %q", got)
	}
}

// JSON keeps the JSON valid and the same value, with no C1 or bidi
// control raw.
func TestJSON(t *testing.T) {
	in := []byte("{\"text\":\"csi \u009b2J rlo \u202eevil\u202c \u00e9 \\u001b\"}")
	got := JSON(in)
	if want := `{"text":"csi \u009b2J rlo \u202eevil\u202c é \u001b"}`; string(got) != want {
		t.Errorf("JSON(%q) = %q, want %q", in, got, want)
	}
	var a, b map[string]string
	if err := json.Unmarshal(in, &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(got, &b); err != nil || a["text"] != b["text"] {
		t.Errorf("JSON changed the value: %q, %v; was %q", b["text"], err, a["text"])
	}
}
