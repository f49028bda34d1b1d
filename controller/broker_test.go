package controller

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"thermite/internal/rpc"
)

// standInBroker answers Runs on a unixpacket socket as the broker does:
// an exit code from Argv[0] ("0", "3"), "refuse" as an error line that
// closes the connection, "hang" never. It counts the connections made,
// and the Runs hanging now.
func standInBroker(t *testing.T) (socket string, conns, hanging *atomic.Int64) {
	t.Helper()
	socket = filepath.Join(t.TempDir(), "broker.sock")
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	conns, hanging = &atomic.Int64{}, &atomic.Int64{}
	go func() {
		for {
			uc, err := l.AcceptUnix()
			if err != nil {
				return
			}
			conns.Add(1)
			go func(c *rpc.Conn) {
				defer c.Close()
				for {
					var req rpc.Request
					if _, err := c.Recv(&req); err != nil {
						return
					}
					switch arg := req.Run.Argv[0]; arg {
					case "refuse":
						c.SendResponse(&rpc.Response{Error: "run: refused"})
						return
					case "hang":
						hanging.Add(1)
						c.Recv(&req) // until the caller goes
						hanging.Add(-1)
						return
					default:
						code := 0
						if arg == "3" {
							code = 3
						}
						c.SendResponse(&rpc.Response{Run: &rpc.RunResult{ExitCode: code}})
					}
				}
			}(rpc.NewConn(uc))
		}
	}()
	return socket, conns, hanging
}

// The controller runs its commands on kept connections: one connection
// serves Run after Run; one whose Run was refused (the broker closed it)
// or cancelled is never used again.
func TestRunConnectionsKeptOnlyAfterAnsweredRuns(t *testing.T) {
	socket, conns, _ := standInBroker(t)
	b := &brokerClient{socket: socket}
	run := func(arg string) (*rpc.RunResult, error) {
		return b.run(context.Background(), &rpc.RunRequest{Role: "lane-1", Argv: []string{arg}}, nil)
	}
	for _, arg := range []string{"0", "3", "0"} {
		res, err := run(arg)
		if err != nil || (arg == "3") != (res.ExitCode == 3) {
			t.Fatalf("Run %s: %+v, %v", arg, res, err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("three Runs took %d connections, want 1", n)
	}
	if _, err := run("refuse"); err == nil {
		t.Fatal("a refused Run answered no error")
	}
	if _, err := run("0"); err != nil {
		t.Fatalf("the Run after a refusal: %v", err)
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("after a refusal, %d connections, want 2 (the refused one not reused)", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := b.run(ctx, &rpc.RunRequest{Role: "lane-1", Argv: []string{"hang"}}, nil); err == nil {
		t.Fatal("a cancelled Run answered no error")
	}
	if _, err := run("0"); err != nil {
		t.Fatalf("the Run after a cancel: %v", err)
	}
	if n := conns.Load(); n != 3 {
		t.Errorf("after a cancel, %d connections, want 3 (the cancelled one closed, not kept)", n)
	}
}

// TestLaneRunBurstLeavesTheJudgeItsConnection: the judge's Run leaves its
// connection kept; 20 lanes' Runs then in flight at once (each hanging)
// take none of it, and the judge's next Run goes on it, with no new
// connection for the broker to accept behind the burst.
func TestLaneRunBurstLeavesTheJudgeItsConnection(t *testing.T) {
	socket, conns, hanging := standInBroker(t)
	b := &brokerClient{socket: socket}
	judge := func() {
		if _, err := b.runAs(context.Background(), runJudge, &rpc.RunRequest{Role: "run", Argv: []string{"0"}}, nil); err != nil {
			t.Fatalf("the judge's Run: %v", err)
		}
	}
	judge()
	base := conns.Load()
	ctx, cancel := context.WithCancel(context.Background())
	var ended sync.WaitGroup
	for range 20 {
		ended.Add(1)
		go func() {
			defer ended.Done()
			b.run(ctx, &rpc.RunRequest{Role: "lane-1", Argv: []string{"hang"}}, nil)
		}()
	}
	for deadline := time.Now().Add(time.Minute); hanging.Load() < 20; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of the 20 lanes' Runs reached the broker", hanging.Load())
		}
	}
	before := conns.Load()
	judge()
	if after := conns.Load(); after != before || before != base+20 {
		t.Errorf("the judge's Run under 20 lanes' Runs made %d new connections (the lanes' took %d), want its kept one and 20", after-before, before-base)
	}
	cancel()
	ended.Wait()
}

// TestLaneOverItsRunCapRefusedOthersNot: lane 1 at api.max_runs_per_lane
// is refused its next command, naming the limit and its value; lane 2 is
// not; once one of lane 1's ends, it may run one more.
func TestLaneOverItsRunCapRefusedOthersNot(t *testing.T) {
	l := &laneRuns{max: 2}
	var held []func()
	for i := range 2 {
		release, msg := l.admitRun(1)
		if release == nil {
			t.Fatalf("lane 1's command %d of 2: %s", i+1, msg)
		}
		held = append(held, release)
	}
	if release, msg := l.admitRun(1); release != nil || !strings.Contains(msg, "api.max_runs_per_lane of 2") {
		t.Fatalf("lane 1's third command: admitted %v, %q", release != nil, msg)
	}
	release, msg := l.admitRun(2)
	if release == nil {
		t.Fatalf("lane 2 refused while lane 1 is at its cap: %s", msg)
	}
	release()
	held[0]()
	held[0]() // a second release gives nothing back twice
	if release, msg := l.admitRun(1); release == nil {
		t.Fatalf("lane 1 after one of its commands ended: %s", msg)
	}
	if release, _ := l.admitRun(1); release != nil {
		t.Fatal("lane 1 went over its cap after a release was called twice")
	}
}
