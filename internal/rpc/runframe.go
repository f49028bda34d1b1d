package rpc

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"
)

// A Run, the call every command of every role makes, travels in a fixed
// binary layout instead of JSON: encoding/json's reflection is most of
// what reading and writing a frame costs where the process wakes up cold
// for each call (about 30-40 us a side, against a few for this layout).
// Every other request and answer is JSON.
//
// A frame's first byte says which it is; JSON's is '{' or a space. Then
// come the protocol version and the fields below, in this order and
// nothing else: an unsigned varint for a count or length, a signed varint
// for a number, a string as its length and UTF-8 bytes, a list as its
// count and its items. A frame that is not whole, holds anything after
// its last field, a string that is not UTF-8, or a flag this side does not
// know is an ErrFrame, as an unknown JSON field is.
const (
	// runRequestTag starts a Run request: role, argv, env, cwd, the six
	// limits (processes, open files, address space, file size, CPU
	// seconds, timeout), cpus, gpus, home, and a flag byte.
	runRequestTag = 0xb1
	// runAnswerTag starts a Run's answer: the error line, then whether a
	// result follows (0 or 1), and if so pid, exit code, signal, stopped,
	// wall, user and sys time, max RSS, cpus, leftovers, card stops,
	// whether a set-id report follows, with its cleared, skipped and
	// scanned, then the start's wait and the starts ahead of it.
	runAnswerTag = 0xb2
)

// The Run request's flag byte.
const (
	runFlagNoTimeout = 1 << iota
	runFlagEgress
	runFlagsKnown = runFlagNoTimeout | runFlagEgress
)

// runOnly says whether req is a Run request and nothing else, which the
// binary layout carries whole.
func runOnly(req *Request) bool {
	return req.Op == OpRun && req.Run != nil && req.StopUser == nil && req.HandFolder == nil &&
		req.ClearSetID == nil && req.Selftest == nil && req.DiskUsage == nil && req.RunFolder == nil && req.Retire == nil && req.TrialFolder == nil
}

// runAnswerOnly says whether resp is a Run's answer and nothing else.
func runAnswerOnly(resp *Response) bool {
	return resp.Run != nil && resp.Part == nil && !resp.More && resp.StopUser == nil && resp.HandFolder == nil &&
		resp.ClearSetID == nil && resp.Status == nil && resp.Selftest == nil && resp.DiskUsage == nil && resp.Retire == nil
}

type frameWriter struct{ b []byte }

func (w *frameWriter) uint(v uint64) { w.b = binary.AppendUvarint(w.b, v) }
func (w *frameWriter) int(v int64)   { w.b = binary.AppendVarint(w.b, v) }
func (w *frameWriter) str(s string)  { w.uint(uint64(len(s))); w.b = append(w.b, s...) }
func (w *frameWriter) strs(ss []string) {
	w.uint(uint64(len(ss)))
	for _, s := range ss {
		w.str(s)
	}
}
func (w *frameWriter) bool(v bool) {
	if v {
		w.b = append(w.b, 1)
	} else {
		w.b = append(w.b, 0)
	}
}

// appendRunRequest is req (runOnly) as a binary frame.
func appendRunRequest(b []byte, req *Request) []byte {
	w := frameWriter{b: append(b, runRequestTag)}
	r := req.Run
	w.int(int64(req.V))
	w.str(r.Role)
	w.strs(r.Argv)
	w.strs(r.Env)
	w.str(r.Cwd)
	w.int(int64(r.Limits.Processes))
	w.int(int64(r.Limits.OpenFiles))
	w.int(r.Limits.AddressSpaceMB)
	w.int(r.Limits.FileSizeMB)
	w.int(int64(r.Limits.CPUSeconds))
	w.int(r.Limits.TimeoutMS)
	w.str(r.CPUs)
	w.uint(uint64(len(r.GPUs)))
	for _, g := range r.GPUs {
		w.int(int64(g))
	}
	w.str(r.Home)
	var flags byte
	if r.NoTimeout {
		flags |= runFlagNoTimeout
	}
	if r.Egress {
		flags |= runFlagEgress
	}
	w.b = append(w.b, flags)
	return w.b
}

// appendRunAnswer is resp (runAnswerOnly) as a binary frame.
func appendRunAnswer(b []byte, resp *Response) []byte {
	w := frameWriter{b: append(b, runAnswerTag)}
	w.int(int64(resp.V))
	w.str(resp.Error)
	r := resp.Run
	w.bool(true)
	w.int(int64(r.PID))
	w.int(int64(r.ExitCode))
	w.int(int64(r.Signal))
	w.str(r.Stopped)
	w.int(r.WallNS)
	w.int(r.UserNS)
	w.int(r.SysNS)
	w.int(r.MaxRSSKB)
	w.str(r.CPUs)
	w.int(int64(r.Leftovers))
	w.strs(r.CardStops)
	w.bool(r.SetID != nil)
	if r.SetID != nil {
		w.strs(r.SetID.Cleared)
		w.strs(r.SetID.Skipped)
		w.int(int64(r.SetID.Scanned))
	}
	w.int(r.StartWaitNS)
	w.int(int64(r.StartsAhead))
	return w.b
}

// frameReader reads a binary frame; the first thing wrong sticks in err,
// and every later read gives zero values.
type frameReader struct {
	b   []byte
	err error
}

func (r *frameReader) fail(format string, a ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: "+format, append([]any{ErrFrame}, a...)...)
	}
}

func (r *frameReader) uint(what string) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("%s: not a whole number", what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *frameReader) int64(what string) int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail("%s: not a whole number", what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *frameReader) int(what string) int { return int(r.int64(what)) }

// count is a list's length, which cannot be more than the bytes left
// (every item takes one at least).
func (r *frameReader) count(what string) int {
	n := r.uint(what)
	if r.err == nil && n > uint64(len(r.b)) {
		r.fail("%s: %d items in %d bytes", what, n, len(r.b))
		return 0
	}
	return int(n)
}

func (r *frameReader) str(what string) string {
	n := r.count(what)
	if r.err != nil {
		return ""
	}
	s := r.b[:n]
	r.b = r.b[n:]
	if !utf8.Valid(s) {
		r.fail("%s: not UTF-8", what)
		return ""
	}
	return string(s)
}

func (r *frameReader) strs(what string) []string {
	n := r.count(what)
	if r.err != nil || n == 0 {
		return nil
	}
	out := make([]string, n)
	for i := range out {
		out[i] = r.str(what)
	}
	return out
}

func (r *frameReader) bool(what string) bool {
	if r.err != nil {
		return false
	}
	if len(r.b) == 0 || r.b[0] > 1 {
		r.fail("%s: not 0 or 1", what)
		return false
	}
	v := r.b[0] == 1
	r.b = r.b[1:]
	return v
}

// end refuses anything after the last field.
func (r *frameReader) end() error {
	if r.err == nil && len(r.b) != 0 {
		r.fail("%d bytes after the last field", len(r.b))
	}
	return r.err
}

// decodeRunRequest reads a Run request frame (its tag included) into req.
func decodeRunRequest(data []byte, req *Request) error {
	r := frameReader{b: data[1:]}
	run := &RunRequest{}
	v := r.int("v")
	run.Role = r.str("role")
	run.Argv = r.strs("argv")
	run.Env = r.strs("env")
	run.Cwd = r.str("cwd")
	run.Limits.Processes = r.int("limits.processes")
	run.Limits.OpenFiles = r.int("limits.open_files")
	run.Limits.AddressSpaceMB = r.int64("limits.address_space_mb")
	run.Limits.FileSizeMB = r.int64("limits.file_size_mb")
	run.Limits.CPUSeconds = r.int("limits.cpu_seconds")
	run.Limits.TimeoutMS = r.int64("limits.timeout_ms")
	run.CPUs = r.str("cpus")
	if n := r.count("gpus"); n > 0 {
		run.GPUs = make([]int, n)
		for i := range run.GPUs {
			run.GPUs[i] = r.int("gpus")
		}
	}
	run.Home = r.str("home")
	var flags byte
	if r.err == nil {
		if len(r.b) == 0 {
			r.fail("flags: missing")
		} else {
			flags, r.b = r.b[0], r.b[1:]
		}
	}
	if flags&^runFlagsKnown != 0 {
		r.fail("flags %#x: unknown", flags)
	}
	run.NoTimeout = flags&runFlagNoTimeout != 0
	run.Egress = flags&runFlagEgress != 0
	if err := r.end(); err != nil {
		return err
	}
	*req = Request{V: v, Op: OpRun, Run: run}
	return nil
}

// decodeRunAnswer reads a Run answer frame (its tag included) into resp.
func decodeRunAnswer(data []byte, resp *Response) error {
	r := frameReader{b: data[1:]}
	out := Response{V: r.int("v"), Error: r.str("error")}
	if r.bool("run") {
		res := &RunResult{}
		res.PID = r.int("pid")
		res.ExitCode = r.int("exit_code")
		res.Signal = r.int("signal")
		res.Stopped = r.str("stopped")
		res.WallNS = r.int64("wall_ns")
		res.UserNS = r.int64("user_ns")
		res.SysNS = r.int64("sys_ns")
		res.MaxRSSKB = r.int64("max_rss_kb")
		res.CPUs = r.str("cpus")
		res.Leftovers = r.int("leftovers_stopped")
		res.CardStops = r.strs("card_stops")
		if r.bool("setid") {
			res.SetID = &SetIDReport{Cleared: r.strs("setid.cleared"), Skipped: r.strs("setid.skipped"), Scanned: r.int("setid.scanned")}
		}
		res.StartWaitNS = r.int64("start_wait_ns")
		res.StartsAhead = r.int("starts_ahead")
		out.Run = res
	}
	if err := r.end(); err != nil {
		return err
	}
	*resp = out
	return nil
}

// decodeRunFrame reads a binary Run frame into v: a request only into a
// *Request, an answer only into a *Response or a Run's *runResponse.
func decodeRunFrame(data []byte, v any) error {
	switch to := v.(type) {
	case *Request:
		if data[0] == runRequestTag {
			return decodeRunRequest(data, to)
		}
	case *Response:
		if data[0] == runAnswerTag {
			return decodeRunAnswer(data, to)
		}
	case *runResponse:
		if data[0] == runAnswerTag {
			var resp Response
			if err := decodeRunAnswer(data, &resp); err != nil {
				return err
			}
			*to = runResponse{V: resp.V, Error: resp.Error, Run: resp.Run}
			return nil
		}
	}
	return fmt.Errorf("%w: a binary Run frame (%#x) where a %T was due", ErrFrame, data[0], v)
}
