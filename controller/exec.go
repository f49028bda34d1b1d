package controller

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"time"

	"thermite/internal/rpc"
)

// ExecRequest runs one command in a trial.
type ExecRequest struct {
	Argv      []string `json:"argv"`
	TimeoutMS int64    `json:"timeout_ms,omitempty"`
	Env       []string `json:"env,omitempty"`
}

// ExecFrame is one line of an exec's answer: output as it comes, then one
// frame with Done set that says how it ended.
type ExecFrame struct {
	Stream string `json:"stream,omitempty"` // "stdout" or "stderr"
	Data   string `json:"data,omitempty"`

	Done        bool   `json:"done,omitempty"`
	ExitCode    int    `json:"exit_code"`
	Signal      int    `json:"signal,omitempty"`
	Stopped     string `json:"stopped,omitempty"`
	WallMS      int64  `json:"wall_ms,omitempty"`
	OutputBytes int64  `json:"output_bytes,omitempty"`
	OutputCap   int64  `json:"output_cap,omitempty"`
	Truncated   bool   `json:"truncated,omitempty"`
	Error       string `json:"error,omitempty"`
}

type chunk struct {
	stream string
	data   []byte
}

// streamCommand runs a command through the broker and streams its output
// to w as NDJSON frames as it comes, up to limit bytes; past the limit the
// output is read and dropped, and the last frame says so. The caller
// going away cancels the command.
func (c *Controller) streamCommand(ctx context.Context, w http.ResponseWriter, req *rpc.RunRequest, limit int64) ExecFrame {
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
	readers := 2
	read := func(stream string, f *os.File) {
		defer f.Close()
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
			n, err := f.Read(buf)
			if n > 0 && !send(chunk{stream, append([]byte(nil), buf[:n]...)}) {
				return
			}
			if err != nil {
				send(chunk{})
				return
			}
		}
	}
	go read("stdout", outR)
	go read("stderr", errR)
	type result struct {
		res *rpc.RunResult
		err error
	}
	resc := make(chan result, 1)
	go func() {
		res, err := c.broker.run(ctx, req, []*os.File{c.devnull, outW, errW})
		outW.Close()
		errW.Close()
		resc <- result{res, err}
	}()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	final := ExecFrame{Done: true, OutputCap: limit}
	// Output written after the command ended (by a lane's leftover) is not
	// this command's: stop reading shortly after it ends.
	var drain <-chan time.Time
	var res result
	got := false
	for readers > 0 {
		select {
		case ch := <-chunks:
			if ch.stream == "" {
				readers--
				continue
			}
			final.OutputBytes += int64(len(ch.data))
			room := limit - (final.OutputBytes - int64(len(ch.data)))
			if room <= 0 {
				final.Truncated = true
				continue
			}
			if int64(len(ch.data)) > room {
				ch.data = ch.data[:room]
				final.Truncated = true
			}
			enc.Encode(ExecFrame{Stream: ch.stream, Data: string(ch.data)})
			if flusher != nil {
				flusher.Flush()
			}
		case res = <-resc:
			got = true
			drain = time.After(200 * time.Millisecond)
		case <-drain:
			readers = 0
		}
	}
	if !got {
		res = <-resc
	}
	// A leftover may still hold the pipes: closing our ends ends the reads.
	outR.Close()
	errR.Close()
	if res.res != nil {
		final.ExitCode, final.Signal, final.Stopped = res.res.ExitCode, res.res.Signal, res.res.Stopped
		final.WallMS = res.res.WallNS / 1e6
	} else {
		final.ExitCode = -1
	}
	if res.err != nil {
		final.Error = res.err.Error()
	}
	enc.Encode(final)
	return final
}
