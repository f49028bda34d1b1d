package termsafe

import "testing"

func TestEscape(t *testing.T) {
	for in, want := range map[string]string{
		"plain text\n\twith tabs":  "plain text\n\twith tabs",
		"\x1b[2J\x1b[Hverdict: ok": `\x1b[2J\x1b[Hverdict: ok`,
		"bell\a del\x7f cr\r":      `bell\x07 del\x7f cr\x0d`,
		"\x1b]0;title\x07":         `\x1b]0;title\x07`,
		"csi \u009b31m":            `csi \u009b31m`,
		"bad utf-8 \xff\xfe":       `bad utf-8 \xff\xfe`,
		"unicode é ✓ 日本":           "unicode é ✓ 日本",
		"nul \x00":                 `nul \x00`,
	} {
		if got := Escape(in); got != want {
			t.Errorf("Escape(%q) = %q, want %q", in, got, want)
		}
	}
	if got := Line("a\nb\tc\x1b"); got != `a\nb\tc\x1b` {
		t.Errorf("Line: %q", got)
	}
}
