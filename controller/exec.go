package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"thermite/internal/rpc"
)

// utf8Framer cuts each stream's output into frames at UTF-8 boundaries:
// an incomplete sequence at the end of a read waits for the next read,
// and bytes that are not UTF-8 go in frames of their own, as base64.
type utf8Framer struct {
	pending map[string][]byte
}

// frames turns the next bytes of a stream into frames; with last set
// nothing is kept back (the stream ended or was cut).
func (u *utf8Framer) frames(stream string, data []byte, last bool) []ExecFrame {
	if u.pending == nil {
		u.pending = map[string][]byte{}
	}
	buf := append(u.pending[stream], data...)
	u.pending[stream] = nil
	if !last {
		// A sequence is at most 4 bytes: look at the last 3 for a start
		// byte whose sequence has not all arrived.
		for i := len(buf) - 1; i >= 0 && i >= len(buf)-3; i-- {
			if utf8.RuneStart(buf[i]) {
				if !utf8.FullRune(buf[i:]) {
					u.pending[stream] = append([]byte(nil), buf[i:]...)
					buf = buf[:i]
				}
				break
			}
		}
	}
	var out []ExecFrame
	start, bad := 0, false
	emit := func(end int) {
		if end == start {
			return
		}
		if bad {
			out = append(out, ExecFrame{Stream: stream, DataB64: append([]byte(nil), buf[start:end]...)})
		} else {
			out = append(out, ExecFrame{Stream: stream, Data: string(buf[start:end])})
		}
		start = end
	}
	for i := 0; i < len(buf); {
		r, n := utf8.DecodeRune(buf[i:])
		isBad := r == utf8.RuneError && n == 1
		if isBad != bad {
			emit(i)
			bad = isBad
		}
		i += n
	}
	emit(len(buf))
	return out
}

type chunk struct {
	from *pipeReader // nil for the reader's end of stream
	data []byte
}

// pipeReader is one of a command's output pipes, read in chunks: read
// counts the chunks its reader took from the pipe, written those the
// stream has written out (the stream's goroutine alone touches it).
type pipeReader struct {
	stream  string
	f       *os.File
	read    atomic.Int64
	written int64
}

// drained says whether everything that is in the pipe now has been
// written out: the pipe holds no byte (FIONREAD, which x/sys names
// TIOCINQ) and each chunk read from it has reached the stream. Where the
// kernel cannot say, it is not.
func (p *pipeReader) drained() bool {
	if p.read.Load() != p.written {
		return false
	}
	sc, err := p.f.SyscallConn()
	if err != nil {
		return false
	}
	pending := -1
	if sc.Control(func(fd uintptr) { pending, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) }) != nil {
		return false
	}
	return pending == 0 && p.read.Load() == p.written
}

// streamCommand runs a command through the broker and streams its output
// to w as NDJSON frames as it comes, up to limit bytes; past the limit the
// output is read and dropped, and the last frame says so. The caller
// going away cancels the command. With stdin nil the command reads
// /dev/null.
func (c *Controller) streamCommand(ctx context.Context, w http.ResponseWriter, req *rpc.RunRequest, limit int64, stdin []byte) ExecFrame {
	return c.streamCommandThen(ctx, w, req, limit, stdin, nil)
}

// streamCommandThen is streamCommand with a last word: then may amend the
// last frame before it is written.
func (c *Controller) streamCommandThen(ctx context.Context, w http.ResponseWriter, req *rpc.RunRequest, limit int64, stdin []byte, then func(*ExecFrame)) ExecFrame {
	in, closeIn, err := c.commandStdin(stdin)
	if err != nil {
		return ExecFrame{Done: true, ExitCode: -1, Error: err.Error()}
	}
	defer closeIn()
	outR, outW, err := os.Pipe()
	if err != nil {
		return ExecFrame{Done: true, ExitCode: -1, Error: err.Error()}
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return ExecFrame{Done: true, ExitCode: -1, Error: err.Error()}
	}
	chunks := make(chan chunk, 16)
	quit := make(chan struct{})
	defer close(quit)
	pipes := []*pipeReader{{stream: "stdout", f: outR}, {stream: "stderr", f: errR}}
	for _, p := range pipes {
		go readChunks(p, chunks, quit)
	}
	resc := make(chan runResult, 1)
	go func() {
		res, err := c.broker.run(ctx, req, []*os.File{in, outW, errW})
		outW.Close()
		errW.Close()
		resc <- runResult{res, err}
	}()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	s := frameStream{enc: json.NewEncoder(w), final: ExecFrame{Done: true, OutputCap: limit}, limit: limit}
	s.flusher, _ = w.(http.Flusher)
	res := s.copy(chunks, resc, pipes)
	// A leftover may still hold the pipes: closing our ends ends the reads.
	outR.Close()
	errR.Close()
	// What a stream held back (a sequence it never finished) goes as it is.
	for _, stream := range []string{"stdout", "stderr"} {
		for _, f := range s.framer.frames(stream, nil, true) {
			s.enc.Encode(f)
		}
	}
	final := s.final
	if res.res != nil {
		final.ExitCode, final.Signal, final.Stopped = res.res.ExitCode, res.res.Signal, res.res.Stopped
		final.WallMS = res.res.WallNS / 1e6
	} else {
		final.ExitCode = -1
	}
	if res.err != nil {
		final.Error = res.err.Error()
	}
	if then != nil {
		then(&final)
	}
	s.enc.Encode(final)
	return final
}

// commandStdin is what a streamed command reads: /dev/null when stdin is
// nil, else a pipe that a goroutine fills with stdin. done closes the
// pipe's ends once the command has ended.
func (c *Controller) commandStdin(stdin []byte) (in *os.File, done func(), err error) {
	if stdin == nil {
		return c.devnull, func() {}, nil
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	go func() {
		inW.Write(stdin)
		inW.Close()
	}()
	// Closing the write end when the command has ended ends a write that a
	// command which never read its input left blocked.
	return inR, func() { inW.Close(); inR.Close() }, nil
}

// runResult is what the broker answered a streamed command.
type runResult struct {
	res *rpc.RunResult
	err error
}

// readChunks sends what f holds to chunks as it comes, then an empty
// chunk once f ends; it gives up when quit closes.
func readChunks(p *pipeReader, chunks chan<- chunk, quit <-chan struct{}) {
	buf := make([]byte, 32<<10)
	send := func(ch chunk) bool {
		select {
		case chunks <- ch:
			return true
		case <-quit:
			return false
		}
	}
	for {
		n, err := p.f.Read(buf)
		if n > 0 {
			p.read.Add(1)
			if !send(chunk{p, append([]byte(nil), buf[:n]...)}) {
				return
			}
		}
		if err != nil {
			send(chunk{})
			return
		}
	}
}

// frameStream writes a command's output as NDJSON frames, up to limit
// bytes, and counts it in final.
type frameStream struct {
	enc     *json.Encoder
	flusher http.Flusher
	framer  utf8Framer
	final   ExecFrame
	limit   int64
}

// drainMax bounds how long a stream goes on after its command ended
// while the command's pipes never empty: a leftover of a lane that keeps
// writing to them.
const drainMax = 2 * time.Second

// copy writes the chunks of the pipes' streams as frames until each has
// ended, or, once the command has ended, until all it wrote is out: its
// pipes hold nothing more and every chunk read from them has been
// written, however slowly the reader gets the CPU. Output a lane's
// leftover writes after that is not this command's; one that never lets
// the pipes empty is cut after drainMax. It returns the broker's answer.
func (s *frameStream) copy(chunks <-chan chunk, resc <-chan runResult, pipes []*pipeReader) runResult {
	var poll *time.Ticker
	var pollC <-chan time.Time
	var giveUp <-chan time.Time
	var res runResult
	got := false
	drained := func() bool {
		for _, p := range pipes {
			if !p.drained() {
				return false
			}
		}
		return true
	}
	for readers := len(pipes); readers > 0; {
		select {
		case ch := <-chunks:
			if ch.from == nil {
				readers--
				continue
			}
			ch.from.written++
			s.write(ch)
		case res = <-resc:
			got = true
			poll = time.NewTicker(5 * time.Millisecond)
			defer poll.Stop()
			pollC, giveUp = poll.C, time.After(drainMax)
		case <-pollC:
		case <-giveUp:
			readers = 0
		}
		if got && readers > 0 && drained() {
			readers = 0
		}
	}
	if !got {
		res = <-resc
	}
	return res
}

// write writes one chunk's frames, cut at the limit; past it the output
// is counted and dropped.
func (s *frameStream) write(ch chunk) {
	s.final.OutputBytes += int64(len(ch.data))
	room := s.limit - (s.final.OutputBytes - int64(len(ch.data)))
	if room <= 0 {
		s.final.Truncated = true
		return
	}
	if int64(len(ch.data)) > room {
		ch.data = ch.data[:room]
		s.final.Truncated = true
	}
	for _, f := range s.framer.frames(ch.from.stream, ch.data, s.final.Truncated) {
		s.enc.Encode(f)
	}
	if s.flusher != nil {
		s.flusher.Flush()
	}
}

// laneRun makes an exec request into the broker's run as the trial's
// lane: argv given, cwd a folder inside the workspace, stdin as text or
// bytes but not both.
func (c *Controller) laneRun(rt *trialRT, req ExecRequest) (*rpc.RunRequest, []byte, error) {
	if len(req.Argv) == 0 {
		return nil, nil, errors.New("field argv: empty; it names the command and its arguments")
	}
	if err := ownCommand(req.Argv); err != nil {
		return nil, nil, err
	}
	cwd, err := insideRoot(rt.t.Workspace, req.Cwd)
	if err != nil {
		return nil, nil, fmt.Errorf("field cwd: %w", err)
	}
	var stdin []byte
	switch {
	case req.Stdin != "" && req.StdinB64 != nil:
		return nil, nil, errors.New("fields stdin and stdin_b64: give one, not both")
	case req.StdinB64 != nil:
		stdin = req.StdinB64
	case req.Stdin != "":
		stdin = []byte(req.Stdin)
	}
	lane, _ := c.table.Lane(rt.t.Lane)
	return &rpc.RunRequest{Role: lane.Name, Argv: req.Argv, Env: append(trialEnv(rt.t), req.Env...), Cwd: cwd, Limits: rpc.Limits{TimeoutMS: req.TimeoutMS}}, stdin, nil
}

// insideRoot decides where a path a caller gives lies under root: a
// relative path is taken from root, an absolute one must lie inside it
// (an answer's path is accepted back), and neither may climb out by "..".
// The check is on the name only; what the path is on disk is the role's
// own to reach or not, as it runs as that role.
func insideRoot(root, p string) (string, error) {
	if p == "" || p == "." {
		return root, nil
	}
	if filepath.IsAbs(p) {
		rel, err := filepath.Rel(root, filepath.Clean(p))
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			return "", fmt.Errorf("%q is outside the trial's folder", p)
		}
		p = rel
	}
	p = filepath.Clean(p)
	if p == ".." || strings.HasPrefix(p, "../") {
		return "", fmt.Errorf("%q climbs out of the trial's folder", p)
	}
	return filepath.Join(root, p), nil
}

// ownCommand refuses a command given from outside (an exec, an agent's
// program) that names thermite itself as /proc/self/exe: the broker takes
// such a command for one of its own (a lane's file helper, a probe),
// which the role's disk check passes over as vouched for by the rig, and
// whose filter keeps openat2 for the file helper.
func ownCommand(argv []string) error {
	if len(argv) > 0 && (argv[0] == "/proc/self/exe" || filepath.Clean(argv[0]) == "/proc/self/exe") {
		return fmt.Errorf("field argv: %q is thermite itself, which only the rig starts; name the program to run", argv[0])
	}
	return nil
}
