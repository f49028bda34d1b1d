package rpc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"thermite/internal/peercred"

	"golang.org/x/sys/unix"
)

// Conn is one end of a broker connection: whole frames, each with up to
// MaxFDs descriptors beside it.
type Conn struct {
	c *net.UnixConn
}

// NewConn wraps a connected unixpacket socket.
func NewConn(c *net.UnixConn) *Conn { return &Conn{c: c} }

// Dial connects to the broker's socket.
func Dial(path string) (*Conn, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("broker socket %s: %w", path, err)
	}
	return &Conn{c: c}, nil
}

// Close closes the connection.
func (c *Conn) Close() error { return c.c.Close() }

// Unix is the underlying socket.
func (c *Conn) Unix() *net.UnixConn { return c.c }

// ErrFrame marks a frame the protocol refuses.
var ErrFrame = errors.New("bad frame")

// Send writes one frame with the given descriptors beside it: a Run
// request in its binary layout (runframe.go), anything else as JSON.
func (c *Conn) Send(v any, fds ...int) error {
	if req, ok := v.(*Request); ok && runOnly(req) {
		return c.sendFrame(appendRunRequest(make([]byte, 0, 256), req), fds...)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return c.sendFrame(b, fds...)
}

// sendFrame writes one encoded frame with the descriptors beside it.
func (c *Conn) sendFrame(b []byte, fds ...int) error {
	if len(b) > MaxFrame {
		return fmt.Errorf("%w: %d bytes is over the %d-byte limit", ErrFrame, len(b), MaxFrame)
	}
	if len(fds) > MaxFDs {
		return fmt.Errorf("%w: %d descriptors is over the limit of %d", ErrFrame, len(fds), MaxFDs)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_, _, err := c.c.WriteMsgUnix(b, oob, nil)
	return err
}

// frames are the receive buffers, kept for the next frame: a frame's
// buffer is MaxFrame+1 bytes, and every call receives at least two.
var frames = sync.Pool{New: func() any { b := make([]byte, MaxFrame+1); return &b }}

// Recv reads one frame into v and returns the descriptors that came with
// it, close-on-exec. A frame over MaxFrame, with truncated descriptors, or
// with JSON that does not match v exactly is an ErrFrame, and so is a
// binary Run frame (runframe.go) that is not whole or is not what v
// holds; the descriptors of a refused frame are closed.
func (c *Conn) Recv(v any) ([]*os.File, error) {
	bp := frames.Get().(*[]byte)
	defer frames.Put(bp)
	buf := *bp
	var oobBuf [256]byte
	oob := oobBuf[:unix.CmsgSpace(MaxFDs*4)+64]
	n, oobn, flags, _, err := c.c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	files, ferr := parseFDs(oob[:oobn])
	fail := func(e error) ([]*os.File, error) {
		for _, f := range files {
			f.Close()
		}
		return nil, e
	}
	if ferr != nil {
		return fail(fmt.Errorf("%w: %v", ErrFrame, ferr))
	}
	if n == 0 && oobn == 0 {
		return nil, errEOF
	}
	if flags&unix.MSG_TRUNC != 0 || n > MaxFrame {
		return fail(fmt.Errorf("%w: over the %d-byte limit", ErrFrame, MaxFrame))
	}
	if flags&unix.MSG_CTRUNC != 0 {
		return fail(fmt.Errorf("%w: more than %d descriptors", ErrFrame, MaxFDs))
	}
	if n > 0 && (buf[0] == runRequestTag || buf[0] == runAnswerTag) {
		if err := decodeRunFrame(buf[:n], v); err != nil {
			return fail(err)
		}
		return files, nil
	}
	dec := json.NewDecoder(bytes.NewReader(buf[:n]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fail(fmt.Errorf("%w: %v", ErrFrame, err))
	}
	if dec.More() {
		return fail(fmt.Errorf("%w: trailing data after the JSON value", ErrFrame))
	}
	return files, nil
}

var errEOF = fmt.Errorf("connection closed: %w", os.ErrClosed)

// IsClosed reports whether err means the other end went away.
func IsClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, os.ErrClosed) || errors.Is(err, net.ErrClosed) || errors.Is(err, unix.ECONNRESET) || errors.Is(err, unix.EPIPE)
}

func parseFDs(oob []byte) ([]*os.File, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var files []*os.File
	var bad error
	for i := range msgs {
		fds, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			bad = err
			continue
		}
		for _, fd := range fds {
			unix.CloseOnExec(fd)
			files = append(files, os.NewFile(uintptr(fd), fmt.Sprintf("fd%d", fd)))
		}
	}
	if bad == nil && len(files) > MaxFDs {
		bad = fmt.Errorf("more than %d descriptors", MaxFDs)
	}
	if bad != nil {
		for _, f := range files {
			f.Close()
		}
		return nil, bad
	}
	return files, nil
}

// PeerCred is the uid, gid and pid of the process at the other end, as the
// kernel recorded them at connect time.
func (c *Conn) PeerCred() (*unix.Ucred, error) { return peercred.Of(c.c) }

// SendResponse sends an answer, in parts when it is larger than a frame.
// A Run's answer that fits in a frame goes in its binary layout.
func (c *Conn) SendResponse(resp *Response) error {
	resp.V = Version
	if runAnswerOnly(resp) {
		if b := appendRunAnswer(make([]byte, 0, 512), resp); len(b) <= MaxFrame {
			return c.sendFrame(b)
		}
	}
	b, err := json.Marshal(resp)
	if err != nil {
		return err
	}
	if len(b) <= MaxFrame {
		return c.sendFrame(b)
	}
	if len(b) > MaxAnswer {
		return c.Send(&Response{V: Version, Error: fmt.Sprintf("answer of %d bytes is over the %d-byte limit", len(b), MaxAnswer)})
	}
	const part = 40 << 10 // 40 KiB, 54 KiB once base64'd: within a frame
	for len(b) > 0 {
		n := min(part, len(b))
		if err := c.Send(&Response{V: Version, Part: b[:n], More: n < len(b)}); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// runResponse is a Response as the answer to a Run has it. encoding/json
// builds the coders of every type a value can hold the first time it meets
// the value's type: a Run's client decodes into this, and a short-lived
// client (thermite run-as) skips building them for the status and the
// self-test (about 0.2 ms).
type runResponse struct {
	V     int        `json:"v"`
	Error string     `json:"error,omitempty"`
	Part  []byte     `json:"part,omitempty"`
	More  bool       `json:"more,omitempty"`
	Run   *RunResult `json:"run,omitempty"`
}

// recvResponse reads one answer, putting parts back together; run says
// the answer is a Run's.
func (c *Conn) recvResponse(run bool) (*Response, error) {
	var resp Response
	var files []*os.File
	var err error
	if run {
		var r runResponse
		files, err = c.Recv(&r)
		resp = Response{V: r.V, Error: r.Error, Part: r.Part, More: r.More, Run: r.Run}
	} else {
		files, err = c.Recv(&resp)
	}
	for _, f := range files {
		f.Close()
	}
	if err != nil || resp.Part == nil {
		return &resp, err
	}
	whole := append([]byte(nil), resp.Part...)
	for resp.More {
		resp = Response{}
		files, err := c.Recv(&resp)
		for _, f := range files {
			f.Close()
		}
		if err != nil {
			return nil, err
		}
		whole = append(whole, resp.Part...)
		if len(whole) > MaxAnswer {
			return nil, fmt.Errorf("%w: answer over the %d-byte limit", ErrFrame, MaxAnswer)
		}
	}
	var out Response
	if err := json.Unmarshal(whole, &out); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFrame, err)
	}
	return &out, nil
}

// Answer reads the answer to a request already sent.
func (c *Conn) Answer() (*Response, error) { return c.answer(false) }

func (c *Conn) answer(run bool) (*Response, error) {
	resp, err := c.recvResponse(run)
	if err != nil {
		if IsClosed(err) {
			return nil, fmt.Errorf("broker closed the connection")
		}
		return nil, err
	}
	if resp.Error != "" {
		return resp, errors.New(resp.Error)
	}
	return resp, nil
}

// Call sends req with fds and waits for the answer. An answer with Error
// set comes back as an error carrying that line.
func (c *Conn) Call(req *Request, fds ...int) (*Response, error) {
	req.V = Version
	if err := c.Send(req, fds...); err != nil {
		return nil, err
	}
	return c.answer(req.Op == OpRun)
}

// SetDeadline bounds the next reads and writes.
func (c *Conn) SetDeadline(t time.Time) error { return c.c.SetDeadline(t) }

// Call dials path, makes one call, and closes the connection.
func Call(path string, req *Request, fds ...int) (*Response, error) {
	c, err := Dial(path)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.Call(req, fds...)
}

// PeerEvent is what Peek saw on a connection.
type PeerEvent int

const (
	// PeerQuiet: nothing waits to be read, and the other end is there.
	PeerQuiet PeerEvent = iota
	// PeerSent: a frame waits to be read.
	PeerSent
	// PeerGone: the other end closed the connection (or it failed).
	PeerGone
)

// Peek says, without waiting and without reading anything, whether a
// frame waits on the connection or the other end has gone. A frame stays
// queued for the next Recv.
func (c *Conn) Peek() PeerEvent {
	rc, err := c.c.SyscallConn()
	if err != nil {
		return PeerGone
	}
	ev := PeerGone
	rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch {
		case err == unix.EAGAIN:
			ev = PeerQuiet
		case err == nil && n > 0:
			ev = PeerSent
		}
		return true
	})
	return ev
}

// Idle says whether a kept connection can carry a request: nothing waits
// on it and the other end has not closed it.
func (c *Conn) Idle() bool { return c.Peek() == PeerQuiet }

// FD is the connection's descriptor, for a caller that polls it itself
// (and reads nothing from it); it stays valid while the connection is
// open.
func (c *Conn) FD() int {
	fd := -1
	if rc, err := c.c.SyscallConn(); err == nil {
		rc.Control(func(f uintptr) { fd = int(f) })
	}
	return fd
}
