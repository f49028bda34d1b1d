package controller

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"testing"
	"time"
)

// slowWriter is an answer that a loaded machine writes slowly: each write
// waits first.
type slowWriter struct {
	bytes.Buffer
	wait time.Duration
}

func (w *slowWriter) Write(p []byte) (int, error) {
	time.Sleep(w.wait)
	return w.Buffer.Write(p)
}

// streamPipe runs frameStream.copy over one pipe that holds data when the
// command's answer comes, while a leftover keeps the pipe's write end
// open (and, with more, writes on), and returns the stdout bytes the
// stream wrote.
func streamPipe(t *testing.T, data []byte, wait time.Duration, more func(w *os.File)) []byte {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if more != nil {
		go more(w)
	}
	chunks := make(chan chunk, 16)
	quit := make(chan struct{})
	defer close(quit)
	pipes := []*pipeReader{{stream: "stdout", f: r}}
	go readChunks(pipes[0], chunks, quit)
	resc := make(chan runResult, 1)
	resc <- runResult{} // the command has ended; its output is in the pipe
	out := &slowWriter{wait: wait}
	s := frameStream{enc: json.NewEncoder(out), limit: 1 << 30}
	done := make(chan struct{})
	go func() {
		s.copy(chunks, resc, pipes)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(drainMax + 10*time.Second):
		t.Fatal("the stream never ended after its command did")
	}
	r.Close()
	var got []byte
	dec := json.NewDecoder(&out.Buffer)
	for {
		var f ExecFrame
		if err := dec.Decode(&f); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		got = append(append(got, f.Data...), f.DataB64...)
	}
	return got
}

// A command's last output still in its pipe when it ends is its output,
// however long the stream takes to write what came before: on a loaded
// machine a stream cut 200 ms after the end lost up to a pipe's worth
// (`trial agent -- head -c 3000000 /dev/zero` gave 2,973,696 bytes).
func TestCommandsLastOutputKeptWhenTheStreamIsSlow(t *testing.T) {
	data := bytes.Repeat([]byte("x"), 64<<10)
	got := streamPipe(t, data, 300*time.Millisecond, nil)
	if len(got) != len(data) {
		t.Fatalf("the stream wrote %d of the %d bytes the command left in its pipe", len(got), len(data))
	}
}

// A leftover that never lets the pipe empty does not hold the stream
// open: it ends within drainMax of the command's end, with the command's
// output.
func TestLeftoverWritingOnDoesNotHoldTheStream(t *testing.T) {
	data := []byte("the command's own\n")
	got := streamPipe(t, data, 0, func(w *os.File) {
		for {
			if _, err := w.Write([]byte("leftover\n")); err != nil {
				return
			}
		}
	})
	if !bytes.HasPrefix(got, data) {
		t.Fatalf("the stream began %q, want the command's own output first", got[:min(len(got), 40)])
	}
}
