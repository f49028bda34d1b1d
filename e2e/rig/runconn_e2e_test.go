package rig

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"thermite/internal/rpc"
	"thermite/internal/testrig"
)

// A Run's connection carries the caller's next request once the Run is
// answered (the controller keeps its connections so), while during the
// Run the broker still watches it: the caller going away ends the
// command, and a frame sent while it runs ends the command and the
// connection, unserved.

// sleepsOf are the pids of role's `sleep SECONDS` commands.
func sleepsOf(r *testrig.Rig, role, seconds string) []int {
	var out []int
	for _, pid := range r.Procs(role) {
		cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if strings.Join(strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00"), " ") == "sleep "+seconds {
			out = append(out, pid)
		}
	}
	return out
}

// sendSleepRun sends a Run of `sleep SECONDS` as lane-1 on a connection of
// its own, and returns the connection once the command runs.
func sendSleepRun(t *testing.T, r *testrig.Rig, seconds string) *rpc.Conn {
	t.Helper()
	c, err := rpc.Dial(r.Cfg.BrokerSocket())
	if err != nil {
		t.Fatal(err)
	}
	req := &rpc.Request{V: rpc.Version, Op: rpc.OpRun, Run: &rpc.RunRequest{Role: "lane-1", Argv: []string{"sleep", seconds}, Limits: rpc.Limits{TimeoutMS: 60000}}}
	if err := c.Send(req); err != nil {
		t.Fatal(err)
	}
	if !waitFor(20*time.Second, func() bool { return len(sleepsOf(r, "lane-1", seconds)) == 1 }) {
		t.Fatalf("the command never ran: lane-1 runs %v", r.Procs("lane-1"))
	}
	return c
}

func TestRunConnectionCarriesTheNextRequest(t *testing.T) {
	r := newRig(t)
	c, err := rpc.Dial(r.Cfg.BrokerSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i, want := range []int{3, 0, 7} {
		resp, err := c.Call(&rpc.Request{Op: rpc.OpRun, Run: &rpc.RunRequest{Role: "lane-1", Argv: []string{"sh", "-c", "exit " + strconv.Itoa(want)}}})
		if err != nil {
			t.Fatalf("Run %d on the kept connection: %v", i, err)
		}
		if resp.Run.ExitCode != want {
			t.Errorf("Run %d: exit %d, want %d", i, resp.Run.ExitCode, want)
		}
	}
	if _, err := c.Call(&rpc.Request{Op: rpc.OpPing}); err != nil {
		t.Errorf("a ping after three Runs on one connection: %v", err)
	}
	// A refused Run closes its connection: the refusal is the last answer.
	if _, err := c.Call(&rpc.Request{Op: rpc.OpRun, Run: &rpc.RunRequest{Role: "no-such-role", Argv: []string{"true"}}}); err == nil || !strings.Contains(err.Error(), "no-such-role") {
		t.Fatalf("a Run as an unknown role: %v, want a refusal naming it", err)
	}
	if _, err := c.Call(&rpc.Request{Op: rpc.OpPing}); err == nil {
		t.Errorf("the connection of a refused Run still answered")
	}
}

func TestRunCallerGoneEndsItsCommand(t *testing.T) {
	r := newRig(t)
	c := sendSleepRun(t, r, "47")
	c.Close()
	if !waitFor(10*time.Second, func() bool { return len(sleepsOf(r, "lane-1", "47")) == 0 }) {
		t.Errorf("the caller went away and its command still runs: %v", sleepsOf(r, "lane-1", "47"))
	}
	// The broker serves on.
	if _, err := rpc.Call(r.Cfg.BrokerSocket(), &rpc.Request{Op: rpc.OpPing}); err != nil {
		t.Errorf("ping after a cancelled Run: %v", err)
	}
}

func TestRunFrameSentDuringTheRunCancelsItUnserved(t *testing.T) {
	r := newRig(t)
	c := sendSleepRun(t, r, "48")
	defer c.Close()
	if err := c.Send(&rpc.Request{V: rpc.Version, Op: rpc.OpStatus}); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	resp, err := c.Answer()
	if err == nil || !strings.Contains(err.Error(), "sent a frame while the command ran") {
		t.Fatalf("the Run's answer: %+v, %v; want the refusal of the frame sent during it", resp, err)
	}
	if left := sleepsOf(r, "lane-1", "48"); len(left) != 0 {
		t.Errorf("the command still runs after its cancel: %v", left)
	}
	// The status request is never answered: the connection is closed.
	if resp, err := c.Answer(); err == nil {
		t.Errorf("the frame sent during the Run was served: %+v", resp)
	}
}
