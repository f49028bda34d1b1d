// Package lanefs is the harness API's file tools for one trial: a small
// server that runs inside a long-lived helper process as the lane's user
// (`thermite __lanefs ROOT...`), and the client the controller talks to it
// with over a socketpair given to the helper as its stdin and stdout.
//
// The wire is length-prefixed JSON: every frame is a 4-byte big-endian
// length and then that many bytes of JSON, at most MaxFrame. A request is
// {"id":N,"op":"read","args":{...}}; its answer is {"id":N,"result":{...}}
// or {"id":N,"error":{"code":"...","msg":"..."}}. Ids let one connection
// carry many calls at once: the client writes requests as they come and
// matches answers by id; the server works on up to MaxInFlight requests at
// a time and answers each as it finishes, in any order. A frame the
// protocol cannot accept (over MaxFrame, not JSON) is answered with id 0
// and the connection is closed: the other side is broken, not a caller.
// The operations are one table, Ops (optable.go): a row names an
// operation, its request and answer types and its handler, and the
// server, the client and the controller's API routes all come from it.
//
// Confinement lives in one function, openBeneath: every path a request
// names is resolved by openat2 with RESOLVE_BENEATH|RESOLVE_NO_MAGICLINKS
// relative to a descriptor of its root folder, opened once at start. The
// kernel refuses "..", absolute paths and symlinks that lead out; symlinks
// that stay inside are followed. Changes are made with the *at calls
// relative to a descriptor of the parent folder, opened the same way, on
// a final name that is never "." or ".." and has no slash, and recursive
// walks go from descriptor to descriptor with O_NOFOLLOW, so no name is
// ever resolved again from a joined string. The helper runs as the lane's
// user: the kernel's permissions stay the last word on what it may touch.
package lanefs

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// MaxFrame is the largest frame, request or answer, either side accepts.
const MaxFrame = 16 << 20

// MaxInFlight is how many requests the server works on at once. A
// request past that waits for a slot (its frame is not read until then).
const MaxInFlight = 16

// Limits on what one answer may carry, so that it fits in a frame.
const (
	// MaxRead is the most bytes one read returns (base64 in the answer
	// makes it 4/3 of that). A larger or zero limit reads up to MaxRead.
	MaxRead = 8 << 20
	// MaxEdit is the largest file edit rewrites.
	MaxEdit = 64 << 20
	// DefaultMatches and MaxMatches bound grep's matches.
	DefaultMatches = 1000
	MaxMatches     = 10000
	// MaxLine is how much of a matching line grep returns.
	MaxLine = 1024
	// DefaultFind and MaxFind bound find's paths.
	DefaultFind = 1000
	MaxFind     = 100000
	// MaxList is the most entries one list returns.
	MaxList = 100000
	// answerBudget bounds the bytes of names and lines one answer carries.
	answerBudget = 8 << 20
	// maxDepth bounds how deep a walk goes (each level holds a descriptor).
	maxDepth = 256
)

// The error codes. The API answers escape and denied with 403, not_found
// with 404, exists with 409, too_large with 413, bad_request with 400 and
// io with 500 (see HTTPStatus).
const (
	CodeEscape     = "escape"      // the path leaves its root folder
	CodeDenied     = "denied"      // the kernel refused the lane (EACCES, EPERM, EROFS)
	CodeNotFound   = "not_found"   // no such file or folder
	CodeExists     = "exists"      // mkdir of a name that is taken
	CodeTooLarge   = "too_large"   // a frame or a file over a limit
	CodeBadRequest = "bad_request" // the request cannot be done as asked
	CodeIO         = "io"          // anything else
)

// Error is what a request fails with: a code the API maps to a status and
// a one-line message that names the path as the caller gave it.
type Error struct {
	Code string `json:"code"`
	Msg  string `json:"msg"`
}

func (e *Error) Error() string { return e.Msg }

// HTTPStatus is the status the harness API answers the error with.
func (e *Error) HTTPStatus() int {
	switch e.Code {
	case CodeEscape, CodeDenied:
		return 403
	case CodeNotFound:
		return 404
	case CodeExists:
		return 409
	case CodeTooLarge:
		return 413
	case CodeBadRequest:
		return 400
	}
	return 500
}

func errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Msg: "lanefs: " + fmt.Sprintf(format, args...)}
}

// show is a path as a message names it: as given, quoted only when it
// would not stay on one line.
func show(p string) string {
	for _, c := range p {
		if c < 0x20 || c == 0x7f {
			return strconv.Quote(p)
		}
	}
	return p
}

// errFrameSize is a frame whose header names more than MaxFrame bytes.
type errFrameSize struct{ n uint64 }

func (e errFrameSize) Error() string {
	return fmt.Sprintf("lanefs: a frame of %d bytes is over the %d-byte limit", e.n, MaxFrame)
}

// readFrame reads one frame's body. A clean end between frames is io.EOF.
func readFrame(r *bufio.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > MaxFrame {
		return nil, errFrameSize{uint64(n)}
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return body, nil
}

// frame puts the 4-byte header in front of body, which was encoded after
// four reserved bytes, and checks the limit.
func frame(buf []byte) ([]byte, error) {
	n := len(buf) - 4
	if n > MaxFrame {
		return nil, errFrameSize{uint64(n)}
	}
	binary.BigEndian.PutUint32(buf[:4], uint32(n))
	return buf, nil
}

// peekID reads the id at the start of a frame as this package encodes
// it ({"id":N,...}), so that a frame can be routed without decoding it
// all; ok is false for any other shape, and the caller decodes it whole.
func peekID(body []byte) (id uint64, rest []byte, ok bool) {
	const pre = `{"id":`
	if len(body) < len(pre) || string(body[:len(pre)]) != pre {
		return 0, nil, false
	}
	i := len(pre)
	for ; i < len(body) && i < len(pre)+20 && body[i] >= '0' && body[i] <= '9'; i++ {
		d := uint64(body[i] - '0')
		if id > (1<<64-1-d)/10 {
			return 0, nil, false
		}
		id = id*10 + d
	}
	if i == len(pre) || i >= len(body) || (body[i] != ',' && body[i] != '}') {
		return 0, nil, false
	}
	return id, body[i:], true
}

// peekOp reads the op after the id ({"id":N,"op":"name",...}).
func peekOp(body []byte) (id uint64, op string, ok bool) {
	id, rest, ok := peekID(body)
	const pre = `,"op":"`
	if !ok || len(rest) < len(pre) || string(rest[:len(pre)]) != pre {
		return 0, "", false
	}
	rest = rest[len(pre):]
	for i, c := range rest {
		switch {
		case c == '"' && i > 0:
			return id, string(rest[:i]), true
		case c >= 'a' && c <= 'z', c == '_':
		default:
			return 0, "", false
		}
	}
	return 0, "", false
}
