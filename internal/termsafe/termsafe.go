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
		case r >= 0x80 && r < 0xa0:
			// C1 controls: CSI (U+009B) alone starts an escape sequence
			// on many terminals.
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
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
