// Package termsafe makes text that roles wrote safe to print on the
// operator's terminal: a build's log, an error, a status line.
package termsafe

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Escape is the one place that decides which bytes of role output reach
// the operator's terminal as they are. It keeps printable text, \n and \t,
// and writes every other control character (C0, DEL, C1) and every byte
// that is not UTF-8 as \xNN, so that no escape sequence a role prints can
// move the cursor, rewrite a line or set the window's title.
func Escape(s string) string {
	if clean(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n' || r == '\t':
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case reordering(r):
			// C1 controls: CSI (U+009B) alone starts an escape sequence
			// on many terminals. Bidi controls and line separators: a
			// role's text must not show the operator its line reversed
			// or broken ("moc.live" read as "evil.com").
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// reordering reports whether r is a C1 control, a bidi control or a line
// or paragraph separator: runes that change how the terminal shows the
// text around them rather than showing themselves.
func reordering(r rune) bool {
	switch {
	case r >= 0x80 && r < 0xa0:
		return true
	case r == 0x061c, r == 0x200e, r == 0x200f, r == 0x2028, r == 0x2029:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// JSON is one line of JSON as encoding/json writes it (control characters
// below U+0020 already escaped) with the runes Escape writes as \uXXXX
// written so too: still the same JSON, and safe on a terminal. Outside
// its strings encoding/json writes only ASCII, so every such rune is in a
// string, where \uXXXX is its escape.
func JSON(b []byte) []byte {
	if clean(string(b)) {
		return b
	}
	var out []byte
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if reordering(r) {
			out = fmt.Appendf(out, `\u%04x`, r)
		} else {
			out = append(out, b[i:i+n]...)
		}
		i += n
	}
	return out
}

// clean reports whether s needs no escaping: the common case, checked
// without allocating.
func clean(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x80 {
			return false
		}
		if (c < 0x20 && c != '\n' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// Line is Escape for a value printed on one line (a table's cell, an end
// reason): \n and \t are escaped too.
func Line(s string) string {
	s = Escape(s)
	if !strings.ContainsAny(s, "\n\t") {
		return s
	}
	return strings.NewReplacer("\n", `\n`, "\t", `\t`).Replace(s)
}
