package controller

import (
	"context"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"thermite/internal/rpc"
)

// standInBroker answers Runs on a unixpacket socket as the broker does:
// an exit code from Argv[0] ("0", "3"), "refuse" as an error line that
// closes the connection, "hang" never. It counts the connections made.
func standInBroker(t *testing.T) (socket string, conns *atomic.Int64) {
	t.Helper()
	socket = filepath.Join(t.TempDir(), "broker.sock")
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	conns = &atomic.Int64{}
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
						c.Recv(&req) // until the caller goes
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
	return socket, conns
}

// The controller runs its commands on kept connections: one connection
// serves Run after Run; one whose Run was refused (the broker closed it)
// or cancelled is never used again.
func TestRunConnectionsKeptOnlyAfterAnsweredRuns(t *testing.T) {
	socket, conns := standInBroker(t)
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
