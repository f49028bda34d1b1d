// Package statedir finds the rig's state folder, and the broker's socket in
// it, from the rig's configuration without the TOML decoder: an operator's
// short-lived command (thermite-run-as) needs that one key, and decoding
// the whole file through reflection and validating every key cost it about
// 0.4 ms of its start. internal/config decodes and checks the rest; it
// takes its defaults and the socket's place from here, so the two agree.
package statedir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode/utf8"
)

// DefaultConfig is read when no --config is given and the file exists.
const DefaultConfig = "/etc/thermite/rig.toml"

// Default is state_dir when the configuration does not set it.
const Default = "/var/lib/thermite"

// BrokerSocket is the broker's socket under stateDir.
func BrokerSocket(stateDir string) string {
	return filepath.Join(stateDir, "broker", "broker.sock")
}

// Lookup is config.Load's lookup reduced to state_dir: the file at path,
// or DefaultConfig when path is "" and that file exists, else the default.
// Only state_dir is read and checked; the broker, which loaded the whole
// file, answers for the rest.
func Lookup(path string) (string, error) {
	explicit := path != ""
	if !explicit {
		path = DefaultConfig
	}
	data, err := os.ReadFile(path)
	if err != nil {
		if !explicit && errors.Is(err, os.ErrNotExist) {
			return Default, nil
		}
		return "", fmt.Errorf("config: %w", err)
	}
	dir, found, err := Find(data)
	if err != nil {
		return "", fmt.Errorf("config %s: %w", path, err)
	}
	if !found {
		dir = Default
	}
	if err := Check(dir); err != nil {
		return "", fmt.Errorf("config %s: %w", path, err)
	}
	return dir, nil
}

// Check is the rule config.Validate applies to state_dir alone: an
// absolute, clean path without a NUL byte, and not /.
func Check(dir string) error {
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir || strings.ContainsRune(dir, 0) {
		return fmt.Errorf("state_dir: %q must be an absolute, clean path", dir)
	}
	if dir == "/" {
		return fmt.Errorf("state_dir: must not be /")
	}
	return nil
}

// Find reads the top-level key state_dir from a TOML document: the keys
// before the first table header, each value skipped by its syntax (strings
// of the four kinds, arrays and inline tables over lines, comments) so that
// text inside a value is never taken for a key. state_dir must be a
// string; anything this reader cannot follow is an error naming
// where, never a silent default.
func Find(data []byte) (dir string, found bool, err error) {
	// A byte-order mark is read over, as the decoder does (the UTF-16
	// ones too, which some tools write).
	b := string(data)
	for _, bom := range []string{"\xff\xfe", "\xfe\xff", "\xef\xbb\xbf"} {
		if strings.HasPrefix(b, bom) {
			b = b[len(bom):]
			break
		}
	}
	s := &scanner{b: b}
	for {
		s.skipBlank(true)
		if s.eof() || s.peek() == '[' {
			return dir, found, nil
		}
		key, err := s.key()
		if err != nil {
			return "", false, err
		}
		s.skipBlank(false)
		if s.eof() || s.peek() != '=' {
			return "", false, s.errorf("a key without = and a value")
		}
		s.i++
		s.skipBlank(false)
		// The decoder matches a key to a field ignoring case, as here;
		// two spellings of it would leave which one wins to a map's order,
		// so a second is refused.
		switch isKey := strings.EqualFold(key[0], "state_dir"); {
		case isKey && len(key) == 1:
			if found {
				return "", false, s.errorf("state_dir: given twice")
			}
			if dir, err = s.str(); err != nil {
				return "", false, fmt.Errorf("state_dir: %w", err)
			}
			found = true
		case isKey:
			return "", false, s.errorf("state_dir: must be a string")
		default:
			if err := s.skipValue(); err != nil {
				return "", false, err
			}
		}
		s.skipBlank(false)
		if !s.eof() && s.peek() != '\n' {
			return "", false, s.errorf("more after a value")
		}
	}
}

// scanner walks a TOML document.
type scanner struct {
	b string
	i int
}

func (s *scanner) eof() bool  { return s.i >= len(s.b) }
func (s *scanner) peek() byte { return s.b[s.i] }

func (s *scanner) errorf(format string, a ...any) error {
	line := 1 + strings.Count(s.b[:min(s.i, len(s.b))], "\n")
	return fmt.Errorf("line %d: "+format, append([]any{line}, a...)...)
}

// skipBlank skips spaces, tabs, carriage returns and comments, and
// newlines when lines is set.
func (s *scanner) skipBlank(lines bool) {
	for !s.eof() {
		switch c := s.peek(); {
		case c == ' ' || c == '\t' || c == '\r' || (lines && c == '\n'):
			s.i++
		case c == '#':
			for !s.eof() && s.peek() != '\n' {
				s.i++
			}
		default:
			return
		}
	}
}

// key reads a dotted key: bare or quoted parts joined by dots.
func (s *scanner) key() ([]string, error) {
	var parts []string
	for {
		s.skipBlank(false)
		if s.eof() {
			return nil, s.errorf("a key without a value")
		}
		var part string
		switch c := s.peek(); {
		case c == '"' || c == '\'':
			p, err := s.str()
			if err != nil {
				return nil, err
			}
			part = p
		default:
			j := s.i
			for !s.eof() && bareKeyByte(s.peek()) {
				s.i++
			}
			if j == s.i {
				return nil, s.errorf("%q cannot start a key", c)
			}
			part = s.b[j:s.i]
		}
		parts = append(parts, part)
		s.skipBlank(false)
		if s.eof() || s.peek() != '.' {
			return parts, nil
		}
		s.i++
	}
}

func bareKeyByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// str reads a string of any of the four kinds: basic ("..."), literal
// ('...'), and their multi-line forms, whose first newline is dropped and
// in whose basic form a backslash at a line's end drops the line break
// and the blanks after it.
func (s *scanner) str() (string, error) {
	if s.eof() || (s.peek() != '"' && s.peek() != '\'') {
		return "", s.errorf("must be a quoted string")
	}
	q := s.peek()
	end := strings.Repeat(string(q), 3)
	multi := strings.HasPrefix(s.b[s.i:], end)
	if multi {
		s.i += 3
		if strings.HasPrefix(s.b[s.i:], "\n") {
			s.i++
		} else if strings.HasPrefix(s.b[s.i:], "\r\n") {
			s.i += 2
		}
	} else {
		s.i++
	}
	var out strings.Builder
	for {
		if s.eof() || (!multi && s.peek() == '\n') {
			return "", s.errorf("a string without its closing quote")
		}
		c := s.peek()
		switch {
		case multi && strings.HasPrefix(s.b[s.i:], end):
			s.i += 3
			// Up to two more quotes belong to the string.
			for k := 0; k < 2 && !s.eof() && s.peek() == q; k++ {
				out.WriteByte(q)
				s.i++
			}
			return out.String(), nil
		case !multi && c == q:
			s.i++
			return out.String(), nil
		case c == '\\' && q == '"':
			s.i++
			if multi && s.lineEndingBackslash() {
				continue
			}
			r, err := s.escape()
			if err != nil {
				return "", err
			}
			out.WriteRune(r)
		default:
			out.WriteByte(c)
			s.i++
		}
	}
}

// lineEndingBackslash skips, after a backslash in a multi-line basic
// string, the blanks to the line's end and every blank and line break
// after it; it reports false, skipping nothing, when the line goes on.
func (s *scanner) lineEndingBackslash() bool {
	j := s.i
	for j < len(s.b) && (s.b[j] == ' ' || s.b[j] == '\t' || s.b[j] == '\r') {
		j++
	}
	if j >= len(s.b) || s.b[j] != '\n' {
		return false
	}
	for j < len(s.b) && (s.b[j] == ' ' || s.b[j] == '\t' || s.b[j] == '\r' || s.b[j] == '\n') {
		j++
	}
	s.i = j
	return true
}

// escape reads what follows a backslash in a basic string.
func (s *scanner) escape() (rune, error) {
	if s.eof() {
		return 0, s.errorf("a string without its closing quote")
	}
	c := s.peek()
	s.i++
	n := 0
	switch c {
	case 'b':
		return '\b', nil
	case 't':
		return '\t', nil
	case 'n':
		return '\n', nil
	case 'f':
		return '\f', nil
	case 'r':
		return '\r', nil
	case 'e':
		return 0x1b, nil
	case '"', '\\':
		return rune(c), nil
	case 'x':
		n = 2
	case 'u':
		n = 4
	case 'U':
		n = 8
	default:
		return 0, s.errorf("unknown escape \\%c", c)
	}
	if s.i+n > len(s.b) {
		return 0, s.errorf("a string without its closing quote")
	}
	v, err := strconv.ParseUint(s.b[s.i:s.i+n], 16, 32)
	if err != nil || !utf8.ValidRune(rune(v)) {
		return 0, s.errorf("bad escape \\%c%s", c, s.b[s.i:s.i+n])
	}
	s.i += n
	return rune(v), nil
}

// skipValue skips one value of any kind.
func (s *scanner) skipValue() error {
	if s.eof() {
		return s.errorf("a key without a value")
	}
	switch c := s.peek(); c {
	case '"', '\'':
		_, err := s.str()
		return err
	case '[', '{':
		return s.skipNested()
	}
	// A number, a boolean or a date: up to the comment or the line's end
	// (a date may hold a space).
	for !s.eof() && s.peek() != '\n' && s.peek() != '#' {
		s.i++
	}
	return nil
}

// skipNested skips an array or an inline table, over lines, with the
// strings and comments inside it.
func (s *scanner) skipNested() error {
	var open []byte
	for {
		if s.eof() {
			return s.errorf("an array or inline table without its end")
		}
		switch c := s.peek(); c {
		case '"', '\'':
			if _, err := s.str(); err != nil {
				return err
			}
			continue
		case '#':
			s.skipBlank(false)
			continue
		case '[', '{':
			open = append(open, c)
		case ']', '}':
			if len(open) == 0 || (c == ']') != (open[len(open)-1] == '[') {
				return s.errorf("%q without its opening", c)
			}
			open = open[:len(open)-1]
			if len(open) == 0 {
				s.i++
				return nil
			}
		}
		s.i++
	}
}
