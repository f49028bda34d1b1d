package lanefs

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Server answers requests on the folders it was given.
type Server struct {
	roots []*root
}

// NewServer opens each root (absolute, a folder, not a symlink) once, as
// an O_PATH descriptor that every request's path is resolved beneath.
func NewServer(paths []string) (*Server, error) {
	if len(paths) == 0 {
		return nil, fmt.Errorf("lanefs: no root folder given (the workspace comes first)")
	}
	s := &Server{}
	for i, p := range paths {
		if !filepath.IsAbs(p) {
			s.Close()
			return nil, fmt.Errorf("lanefs: root %d: %s: not an absolute path", i, show(p))
		}
		fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("lanefs: root %d: %s: %w", i, show(p), err)
		}
		name := "the workspace"
		if i > 0 {
			name = fmt.Sprintf("root %d", i)
		}
		s.roots = append(s.roots, &root{fd: fd, name: name})
	}
	return s, nil
}

// Close closes the roots' descriptors.
func (s *Server) Close() error {
	for _, r := range s.roots {
		unix.Close(r.fd)
	}
	s.roots = nil
	return nil
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// encodeFrame encodes v as one frame: four header bytes, then JSON.
func encodeFrame(v any) (*bytes.Buffer, []byte, error) {
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	buf.Write([]byte{0, 0, 0, 0})
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		bufPool.Put(buf)
		return nil, nil, err
	}
	b, err := frame(buf.Bytes())
	if err != nil {
		bufPool.Put(buf)
		return nil, nil, err
	}
	return buf, b, nil
}

func putBuf(buf *bytes.Buffer) {
	if buf.Cap() <= 1<<20 {
		bufPool.Put(buf)
	}
}

// Serve reads requests from r and answers on w until r ends (nil) or a
// frame cannot be accepted (answered with id 0, then the error). Up to
// MaxInFlight requests run at once; their answers are written whole, one
// at a time, as each finishes.
func (s *Server) Serve(r io.Reader, w io.Writer) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var (
		wmu  sync.Mutex
		werr error
		wg   sync.WaitGroup
	)
	send := func(resp outResponse) {
		buf, b, err := encodeFrame(resp)
		if err != nil {
			var fe errFrameSize
			if !errors.As(err, &fe) {
				resp = outResponse{ID: resp.ID, Error: errorf(CodeIO, "encoding the answer: %v", err)}
			} else {
				resp = outResponse{ID: resp.ID, Error: errorf(CodeTooLarge, "the answer of %d bytes is over the %d-byte frame limit", fe.n, MaxFrame)}
			}
			if buf, b, err = encodeFrame(resp); err != nil {
				return
			}
		}
		defer putBuf(buf)
		wmu.Lock()
		defer wmu.Unlock()
		if werr == nil {
			_, werr = w.Write(b)
		}
	}
	slots := make(chan struct{}, MaxInFlight)
	defer wg.Wait()
	for {
		body, err := readFrame(br)
		if err != nil {
			if err == io.EOF {
				return nil
			}
			var fe errFrameSize
			if errors.As(err, &fe) {
				wg.Wait()
				send(outResponse{Error: &Error{Code: CodeTooLarge, Msg: fe.Error()}})
				return fe
			}
			return fmt.Errorf("lanefs: reading a request: %w", err)
		}
		id, op, ok := peekOp(body)
		if !ok || id == 0 {
			// Not the shape our client writes (which never uses id 0):
			// decode it whole.
			var req wireRequest
			err := json.Unmarshal(body, &req)
			id, op = req.ID, req.Op
			if err != nil || id == 0 {
				msg := "a request frame without an id"
				if err != nil {
					msg = "a request frame that is not JSON: " + err.Error()
				}
				wg.Wait()
				send(outResponse{Error: errorf(CodeBadRequest, "%s", msg)})
				return errors.New("lanefs: " + msg)
			}
		}
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			// One strict pass decodes the whole frame, args included.
			result, e := s.dispatch(op, func(args any) error {
				env := struct {
					ID   uint64 `json:"id"`
					Op   string `json:"op"`
					Args any    `json:"args"`
				}{Args: args}
				return strictDecode(body, &env)
			})
			if e != nil {
				send(outResponse{ID: id, Error: e})
				return
			}
			send(outResponse{ID: id, Result: result})
		}()
	}
}

func strictDecode(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("data after the request")
	}
	return nil
}

// Handle runs one operation on its JSON arguments.
func (s *Server) Handle(op string, args json.RawMessage) (any, *Error) {
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	return s.dispatch(op, func(v any) error { return strictDecode(args, v) })
}

// dispatch runs the operation named op from Ops; decode fills its typed
// arguments, strictly (an unknown field is refused).
func (s *Server) dispatch(op string, decode func(any) error) (any, *Error) {
	o := opsByName()[op]
	if o == nil {
		return nil, errorf(CodeBadRequest, "unknown operation %q", op)
	}
	req := o.newRequest()
	if err := decode(req); err != nil {
		return nil, errorf(CodeBadRequest, "bad arguments: %v", err)
	}
	return o.serve(s, req)
}

// root returns the root a request names.
func (s *Server) root(i int) (*root, *Error) {
	if i < 0 || i >= len(s.roots) {
		return nil, errorf(CodeBadRequest, "root %d: there are %d roots", i, len(s.roots))
	}
	return s.roots[i], nil
}

// Arg is the hidden subcommand that runs the helper. The broker keeps
// openat2 in the filter of exactly this command (see its fileHelper).
const Arg = "__lanefs"

// ServeMain is the helper's body, `thermite __lanefs ROOT...`: args are
// the roots (a leading "__lanefs" is skipped), the workspace first. It
// serves on fd 0 and answers on fd 1 until fd 0 ends, and returns the
// exit status. It refuses to run as root: the helper's whole point is
// that the kernel sees the lane's user.
func ServeMain(args []string) int {
	if len(args) > 0 && args[0] == Arg {
		args = args[1:]
	}
	if os.Geteuid() == 0 || os.Getuid() == 0 {
		fmt.Fprintln(os.Stderr, "lanefs: refusing to serve as root: the helper must run as the lane's user")
		return 2
	}
	// A write to a closed socket fails with EPIPE instead of killing us.
	signal.Ignore(syscall.SIGPIPE)
	s, err := NewServer(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer s.Close()
	if err := s.Serve(stdio(os.Stdin), stdio(os.Stdout)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// stdio is f, or where f is a socket (the socketpair the broker passes),
// a connection on a duplicate of it that the runtime's poller waits on,
// which answers sooner than a thread blocked in read(2).
func stdio(f *os.File) io.ReadWriter {
	if c, err := net.FileConn(f); err == nil {
		return c
	}
	return f
}
