package rpc

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"os"
	"reflect"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// seqpacketPair is a connected SOCK_SEQPACKET pair: raw is the sending
// end's descriptor, so a test can write any bytes and descriptors as one
// message, and c is the receiving end as the broker holds it.
func seqpacketPair(t *testing.T) (raw int, c *Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fds[1]), "recv")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		unix.Close(fds[0])
		t.Fatal(err)
	}
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		t.Fatalf("FileConn gave a %T", nc)
	}
	c = NewConn(uc)
	t.Cleanup(func() { unix.Close(fds[0]); c.Close() })
	return fds[0], c
}

// openFDs lists this process's open descriptors.
func openFDs(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// FuzzRecvRequest sends any bytes, with up to six descriptors beside
// them, as one frame to the broker's end of a connection. Recv must
// either refuse the frame with ErrFrame and leave no received descriptor
// open, or return a request that came whole: within MaxFrame, with every
// descriptor sent (at most MaxFDs), that the protocol's own Send and Recv
// carry unchanged.
func FuzzRecvRequest(f *testing.F) {
	f.Add([]byte(`{"v":1,"op":"ping"}`), uint8(0))
	f.Add([]byte(`{"v":1,"op":"run","run":{"role":"lane-1","argv":["/bin/true"],"limits":{}}}`), uint8(3))
	f.Add([]byte(`{"v":1,"op":"ping","extra":1}`), uint8(0))
	f.Add([]byte(`{"v":1,"op":"ping"} {}`), uint8(5))
	f.Add(appendRunRequest(nil, &Request{V: 1, Op: OpRun, Run: &RunRequest{Role: "lane-1", Argv: []string{"/bin/true"}, Env: []string{"A=b"}, GPUs: []int{0, 3}, NoTimeout: true}}), uint8(3))
	f.Add(appendRunAnswer(nil, &Response{V: 1, Run: &RunResult{PID: 7, SetID: &SetIDReport{Cleared: []string{"/x"}}}}), uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, nfds uint8) {
		if len(data) > MaxFrame+16 {
			data = data[:MaxFrame+16]
		}
		n := int(nfds % 7)
		// Each descriptor sent is a fresh pipe end, so that one left open
		// by Recv shows as an extra entry in /proc/self/fd.
		var send []int
		for range n {
			var p [2]int
			if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
				t.Fatal(err)
			}
			send = append(send, p[0], p[1])
		}
		raw, c := seqpacketPair(t)
		var oob []byte
		if n > 0 {
			oob = unix.UnixRights(send[:n]...)
		}
		if err := unix.Sendmsg(raw, data, oob, nil, 0); err != nil {
			t.Skipf("sendmsg: %v", err)
		}
		for _, fd := range send {
			unix.Close(fd)
		}
		before := openFDs(t)
		var req Request
		files, err := c.Recv(&req)
		after := openFDs(t)
		if err != nil {
			if len(data) == 0 && n == 0 {
				return // an empty message reads as the peer closing
			}
			if !errors.Is(err, ErrFrame) {
				t.Fatalf("Recv refused a frame without ErrFrame: %v", err)
			}
			if files != nil {
				t.Fatalf("Recv returned %d descriptors with its error", len(files))
			}
			if !slices.Equal(before, after) {
				t.Fatalf("a refused frame left descriptors open: before %v, after %v", before, after)
			}
			return
		}
		defer func() {
			for _, f := range files {
				f.Close()
			}
		}()
		if len(data) > MaxFrame {
			t.Fatalf("accepted a frame of %d bytes, over MaxFrame", len(data))
		}
		if len(files) > MaxFDs || len(files) != n {
			t.Fatalf("sent %d descriptors, received %d (MaxFDs %d)", n, len(files), MaxFDs)
		}
		// Whatever Recv accepts the protocol's own sender can send again,
		// and it arrives as the same request.
		enc, err := json.Marshal(&req)
		if err != nil {
			t.Fatalf("an accepted request does not encode: %v", err)
		}
		if len(enc) > MaxFrame {
			return // a frame with many escapes grows past the limit
		}
		raw2, c2 := seqpacketPair(t)
		if err := unix.Sendmsg(raw2, enc, nil, nil, 0); err != nil {
			t.Fatal(err)
		}
		var again Request
		if _, err := c2.Recv(&again); err != nil {
			t.Fatalf("the re-encoded request %s is refused: %v", enc, err)
		}
		if !reflect.DeepEqual(req, again) {
			t.Fatalf("round trip changed the request:\n%#v\n%#v", req, again)
		}
		// A Run request travels in the binary layout too, unchanged but
		// for an empty list, which it carries as none.
		if runOnly(&req) {
			var back Request
			if err := decodeRunRequest(appendRunRequest(nil, &req), &back); err != nil {
				t.Fatalf("the binary layout of an accepted Run request is refused: %v", err)
			}
			if a, b := noEmptyLists(*req.Run), noEmptyLists(*back.Run); req.V != back.V || !reflect.DeepEqual(a, b) {
				t.Fatalf("the binary layout changed the request:\n%#v\n%#v", a, b)
			}
		}
	})
}

// FuzzRecvResponse feeds the controller's side any sequence of frames,
// split at 0xff bytes, as the broker's answer, then closes the broker's
// end. Putting parts together ends in an answer or an error, never a
// panic or a wait for parts that cannot come.
func FuzzRecvResponse(f *testing.F) {
	f.Add([]byte(`{"v":1}`))
	f.Add([]byte(`{"v":1,"error":"no"}`))
	f.Add([]byte(`{"v":1,"part":"eyJ2IjoxLA==","more":true}` + "\xff" + `{"v":1,"part":"ImVycm9yIjoieCJ9"}`))
	f.Add([]byte(`{"v":1,"part":"e30=","more":true}`))
	f.Add(appendRunAnswer(nil, &Response{V: 1, Error: "no", Run: &RunResult{PID: 7, CardStops: []string{"a"}}}))
	f.Fuzz(func(t *testing.T, data []byte) {
		raw, c := seqpacketPair(t)
		frames := bytes.Split(data, []byte{0xff})
		if len(frames) > 32 {
			frames = frames[:32]
		}
		for _, fr := range frames {
			if len(fr) == 0 || len(fr) > MaxFrame+16 {
				continue
			}
			if err := unix.Sendmsg(raw, fr, nil, nil, 0); err != nil {
				t.Skipf("sendmsg: %v", err)
			}
		}
		// The broker going away ends any answer still waiting for parts.
		unix.Shutdown(raw, unix.SHUT_WR)
		resp, err := c.Answer()
		if err != nil && resp != nil && resp.Error == "" {
			t.Fatalf("Answer failed (%v) but returned an answer %+v", err, resp)
		}
		if err == nil && (resp == nil || resp.Error != "") {
			t.Fatalf("no error, but the answer is %+v", resp)
		}
	})
}

// noEmptyLists is r with its empty lists as none.
func noEmptyLists(r RunRequest) RunRequest {
	if len(r.Argv) == 0 {
		r.Argv = nil
	}
	if len(r.Env) == 0 {
		r.Env = nil
	}
	if len(r.GPUs) == 0 {
		r.GPUs = nil
	}
	return r
}
