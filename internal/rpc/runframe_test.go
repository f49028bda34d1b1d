package rpc

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// fillAll sets every field of the struct v points to, and of the structs
// it holds, to a value of its own that is not the zero value, so that a
// field the binary layout leaves out shows as a difference.
func fillAll(t *testing.T, v reflect.Value, n *int) {
	t.Helper()
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		*n++
		switch f.Kind() {
		case reflect.String:
			f.SetString(fmt.Sprintf("s%d/é", *n))
		case reflect.Int, reflect.Int64:
			f.SetInt(int64(-*n * 1000003))
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Slice:
			s := reflect.MakeSlice(f.Type(), 2, 2)
			for j := 0; j < 2; j++ {
				switch f.Type().Elem().Kind() {
				case reflect.String:
					s.Index(j).SetString(fmt.Sprintf("item%d.%d", *n, j))
				case reflect.Int:
					s.Index(j).SetInt(int64(*n*10 + j))
				default:
					t.Fatalf("field %s: no filler for %s", v.Type().Field(i).Name, f.Type())
				}
			}
			f.Set(s)
		case reflect.Struct:
			fillAll(t, f, n)
		case reflect.Pointer:
			p := reflect.New(f.Type().Elem())
			fillAll(t, p.Elem(), n)
			f.Set(p)
		default:
			t.Fatalf("field %s: no filler for %s", v.Type().Field(i).Name, f.Type())
		}
	}
}

// TestRunFramesCarryEveryField: a Run request with every field set reaches
// the broker as sent, and its answer, with every field of the result and
// the set-id report and an error line, reaches the caller as sent, through
// Send and Recv, SendResponse and Answer, and Call. A field added to the
// types and not to the binary layout fails here.
func TestRunFramesCarryEveryField(t *testing.T) {
	var n int
	run := &RunRequest{}
	fillAll(t, reflect.ValueOf(run).Elem(), &n)
	res := &RunResult{}
	fillAll(t, reflect.ValueOf(res).Elem(), &n)
	sent := &Request{V: Version, Op: OpRun, Run: run}

	c, s := pair(t)
	if err := c.Send(sent); err != nil {
		t.Fatal(err)
	}
	var got Request
	if _, err := s.Recv(&got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&got, sent) {
		t.Fatalf("request:\n%#v\nwant\n%#v", got.Run, sent.Run)
	}
	if err := s.SendResponse(&Response{Error: "spawn: execve x: not found (ENOENT)", Run: res}); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Answer()
	if err == nil || err.Error() != "spawn: execve x: not found (ENOENT)" || resp == nil || !reflect.DeepEqual(resp.Run, res) {
		t.Fatalf("answer %v:\n%#v\nwant\n%#v", err, resp, res)
	}

	// Call reads a Run's answer through its narrower type.
	c, s = pair(t)
	go func(s *Conn) {
		var req Request
		s.Recv(&req)
		s.SendResponse(&Response{Run: res})
	}(s)
	resp, err = c.Call(&Request{Op: OpRun, Run: run})
	if err != nil || !reflect.DeepEqual(resp.Run, res) {
		t.Fatalf("Call: %v %#v", err, resp)
	}
}

// TestRefusedRunFrames: a binary Run frame that is not whole, has more
// after its last field, a string that is not UTF-8, a flag this broker
// does not know, a list longer than the frame, or the wrong kind for its
// reader is refused with ErrFrame, and the descriptors beside it are
// closed.
func TestRefusedRunFrames(t *testing.T) {
	good := appendRunRequest(nil, &Request{V: Version, Op: OpRun, Run: &RunRequest{Role: "lane-1", Argv: []string{"/bin/true"}}})
	answer := appendRunAnswer(nil, &Response{V: Version, Run: &RunResult{PID: 1}})
	badUTF8 := appendRunRequest(nil, &Request{V: Version, Op: OpRun, Run: &RunRequest{Role: "lane-1", Argv: []string{"/bin/\xff"}}})
	for name, frame := range map[string][]byte{
		"cut short":          good[:len(good)-1],
		"trailing byte":      append(slices.Clone(good), 0),
		"not UTF-8":          badUTF8,
		"unknown flag":       append(slices.Clone(good[:len(good)-1]), 0x80),
		"list past the end":  {runRequestTag, 2, 0, 0xff, 0x7f},
		"answer to a broker": answer,
		"tag alone":          {runRequestTag},
	} {
		t.Run(name, func(t *testing.T) {
			var p [2]int
			if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
				t.Fatal(err)
			}
			raw, s := seqpacketPair(t)
			if err := unix.Sendmsg(raw, frame, unix.UnixRights(p[0]), nil, 0); err != nil {
				t.Fatal(err)
			}
			unix.Close(p[0])
			unix.Close(p[1])
			before := openFDs(t)
			var req Request
			files, err := s.Recv(&req)
			if !errors.Is(err, ErrFrame) || files != nil {
				t.Fatalf("Recv = %d files, %v; want ErrFrame", len(files), err)
			}
			if after := openFDs(t); !slices.Equal(before, after) {
				t.Fatalf("the refused frame's descriptor is still open: before %v, after %v", before, after)
			}
		})
	}
	// A Run request where the caller waits for an answer is no answer.
	raw, c := seqpacketPair(t)
	if err := unix.Sendmsg(raw, good, nil, nil, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Answer(); !errors.Is(err, ErrFrame) {
		t.Fatalf("a request as the answer: %v, want ErrFrame", err)
	}
}
