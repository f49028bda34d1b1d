package rpc

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func pair(t *testing.T) (*Conn, *Conn) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "s")
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: p, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ch := make(chan *net.UnixConn, 1)
	go func() {
		c, _ := l.AcceptUnix()
		ch <- c
	}()
	c, err := Dial(p)
	if err != nil {
		t.Fatal(err)
	}
	s := NewConn(<-ch)
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

func TestFrameWithDescriptors(t *testing.T) {
	c, s := pair(t)
	r, w, _ := os.Pipe()
	defer r.Close()
	defer w.Close()
	if err := c.Send(&Request{V: Version, Op: OpPing}, int(w.Fd())); err != nil {
		t.Fatal(err)
	}
	var req Request
	files, err := s.Recv(&req)
	if err != nil || req.Op != OpPing || len(files) != 1 {
		t.Fatalf("%v %+v %d", err, req, len(files))
	}
	files[0].Write([]byte("hi"))
	files[0].Close()
	b := make([]byte, 2)
	r.Read(b)
	if string(b) != "hi" {
		t.Fatal("descriptor does not reach the same pipe")
	}
	cred, err := s.PeerCred()
	if err != nil || int(cred.Uid) != os.Geteuid() || int(cred.Pid) != os.Getpid() {
		t.Fatalf("peer cred %+v %v", cred, err)
	}
}

func TestRefusedFrames(t *testing.T) {
	for name, raw := range map[string]string{
		"not json":      "hello",
		"unknown field": `{"v":1,"op":"ping","sudo":true}`,
		"trailing":      `{"v":1,"op":"ping"} {"v":1}`,
		"oversized":     `{"v":1,"op":"` + strings.Repeat("a", MaxFrame) + `"}`,
	} {
		c, s := pair(t)
		if _, err := c.c.Write([]byte(raw)); err != nil {
			t.Fatal(err)
		}
		var req Request
		_, err := s.Recv(&req)
		if !errors.Is(err, ErrFrame) {
			t.Errorf("%s: %v, want ErrFrame", name, err)
		}
	}
}

func TestSendRefusesOversize(t *testing.T) {
	c, _ := pair(t)
	err := c.Send(&Request{V: Version, Op: strings.Repeat("x", MaxFrame)})
	if !errors.Is(err, ErrFrame) {
		t.Fatalf("%v", err)
	}
	if err := c.Send(&Request{}, 0, 1, 2, 0, 1); !errors.Is(err, ErrFrame) {
		t.Fatalf("five descriptors: %v", err)
	}
}

func TestLargeAnswerInParts(t *testing.T) {
	c, s := pair(t)
	big := &Response{Selftest: &SelftestResult{Sentence: "x"}}
	for i := 0; i < 3000; i++ {
		big.Selftest.Probes = append(big.Selftest.Probes, Probe{Role: "lane-1", Attempt: strings.Repeat("a", 100), Got: "EACCES", OK: true})
	}
	go func() {
		var req Request
		s.Recv(&req)
		s.SendResponse(big)
	}()
	resp, err := c.Call(&Request{Op: OpSelftest})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Selftest.Probes) != 3000 || resp.Selftest.Sentence != "x" {
		t.Fatalf("got %d rows", len(resp.Selftest.Probes))
	}
}

// TestRunAnswerDecodedWhole: a Run's answer, read through the narrower
// type a Run's client decodes into, carries the result and the error line
// as sent, and a field no Run answer has is still refused.
func TestRunAnswerDecodedWhole(t *testing.T) {
	c, s := pair(t)
	want := &RunResult{PID: 42, ExitCode: 127, Stopped: StoppedExited, WallNS: 7, SetID: &SetIDReport{Cleared: []string{"/x"}}}
	go func(s *Conn) {
		var req Request
		s.Recv(&req)
		s.SendResponse(&Response{Run: want, Error: "spawn: execve x: not found (ENOENT)"})
	}(s)
	resp, err := c.Call(&Request{Op: OpRun, Run: &RunRequest{Role: "lane-1", Argv: []string{"x"}}})
	if err == nil || err.Error() != "spawn: execve x: not found (ENOENT)" {
		t.Fatalf("error %v", err)
	}
	if resp == nil || resp.Run == nil || resp.Run.PID != 42 || resp.Run.ExitCode != 127 || resp.Run.WallNS != 7 || len(resp.Run.SetID.Cleared) != 1 {
		t.Fatalf("answer %+v", resp)
	}

	c, s = pair(t)
	go func(s *Conn) {
		var req Request
		s.Recv(&req)
		s.SendResponse(&Response{Run: want, Status: &Status{}})
	}(s)
	if _, err := c.Call(&Request{Op: OpRun, Run: &RunRequest{Role: "lane-1", Argv: []string{"x"}}}); !errors.Is(err, ErrFrame) {
		t.Fatalf("a Run answer with a status: %v, want ErrFrame", err)
	}
}

// Peek tells a quiet connection from one with a frame waiting and one
// whose other end is gone, and reads nothing: the frame is still there
// for Recv.
func TestPeekReadsNothing(t *testing.T) {
	a, b := pair(t)
	if got := b.Peek(); got != PeerQuiet || !b.Idle() {
		t.Fatalf("a quiet connection: %v (idle %v), want PeerQuiet", got, b.Idle())
	}
	if err := a.Send(&Request{V: Version, Op: OpPing}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if got := b.Peek(); got != PeerSent || b.Idle() {
			t.Fatalf("a frame waiting: %v (idle %v), want PeerSent", got, b.Idle())
		}
	}
	var req Request
	if _, err := b.Recv(&req); err != nil || req.Op != OpPing {
		t.Fatalf("the frame after two peeks: %+v, %v", req, err)
	}
	a.Close()
	if got := b.Peek(); got != PeerGone || b.Idle() {
		t.Fatalf("the other end closed: %v (idle %v), want PeerGone", got, b.Idle())
	}
}
