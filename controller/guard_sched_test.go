package controller

import (
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"thermite/controller/ledger"
	"thermite/internal/config"
	"thermite/internal/rpc"
	"thermite/roles"
)

// diskBroker answers DiskUsage as the broker does, 1 byte a role, but
// holds every measure of role held until release closes. It counts each
// role's requests, and says on asked which role each came for.
func diskBroker(t *testing.T, held string, release <-chan struct{}) (socket string, asked chan string, counts func(string) int) {
	t.Helper()
	socket = filepath.Join(t.TempDir(), "broker.sock")
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	asked = make(chan string, 1000)
	var mu sync.Mutex
	n := map[string]int{}
	go func() {
		for {
			uc, err := l.AcceptUnix()
			if err != nil {
				return
			}
			go func(c *rpc.Conn) {
				defer c.Close()
				for {
					var req rpc.Request
					if _, err := c.Recv(&req); err != nil || req.DiskUsage == nil {
						return
					}
					role := req.DiskUsage.Role
					mu.Lock()
					n[role]++
					mu.Unlock()
					asked <- role
					if role == held {
						<-release
					}
					c.SendResponse(&rpc.Response{DiskUsage: &rpc.DiskUsage{Bytes: 1}})
				}
			}(rpc.NewConn(uc))
		}
	}()
	return socket, asked, func(role string) int { mu.Lock(); defer mu.Unlock(); return n[role] }
}

// TestSlowDiskCheckOfOneLaneLeavesAnotherOnTime: lane 1's disk measure
// hangs at the broker (a tree too large to walk soon, a measure the
// broker is slow to answer). Round after round of checks returns at
// once, lane 2 is measured in each, and lane 1 is never asked twice while
// its one measure is still out; once the broker answers it, lane 1 is
// measured again. Ordering facts only: no time is asserted.
func TestSlowDiskCheckOfOneLaneLeavesAnotherOnTime(t *testing.T) {
	cfg := config.Default()
	table, err := roles.FromConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l1, _ := table.Lane(1)
	l2, _ := table.Lane(2)
	release := make(chan struct{})
	socket, asked, counts := diskBroker(t, l1.Name, release)
	l, err := ledger.Open(filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c := &Controller{cfg: cfg, table: table, ledger: l, log: slog.New(slog.NewJSONHandler(io.Discard, nil)),
		broker: &brokerClient{socket: socket}, trials: map[string]*trialRT{}}
	if err := l.PutRun(ledger.Run{ID: "r", Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	var rts []*trialRT
	for lane := 1; lane <= 2; lane++ {
		tr := ledger.Trial{ID: "t" + string(rune('0'+lane)), Run: "r", Lane: lane, State: "open", Started: time.Now(), TokenHash: ledger.HashToken(string(rune('a' + lane)))}
		if err := l.StartTrial(tr); err != nil {
			t.Fatal(err)
		}
		rt := newTrialRT(tr)
		c.trials[tr.ID] = rt
		rts = append(rts, rt)
	}
	// round runs one round of checks as the ticker does, and fails the
	// test if the round itself waits on a measure.
	round := func(i int) {
		done := make(chan struct{})
		go func() { c.checkOpenDisks(); close(done) }()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Fatalf("round %d of disk checks waits on lane 1's held measure", i)
		}
	}
	// waitFor waits until the broker was asked for role, or fails.
	waitFor := func(role string, why string) {
		deadline := time.After(time.Minute)
		for {
			select {
			case got := <-asked:
				if got == role {
					return
				}
			case <-deadline:
				t.Fatalf("%s: the broker was never asked for %s", why, role)
			}
		}
	}
	measured := func(rt *trialRT) time.Time {
		rt.mu.Lock()
		defer rt.mu.Unlock()
		return rt.disk.Checked
	}
	round(0)
	waitFor(l1.Name, "the first round")
	for i := 1; i <= 3; i++ {
		// Lane 2's check of the last round ends (its measure answered at
		// once) before the next round starts it again.
		for deadline := time.Now().Add(time.Minute); rts[1].checking.Load() || counts(l2.Name) < i; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: lane 2's check of round %d never ended while lane 1's was held (%d measures)", i, i-1, counts(l2.Name))
			}
		}
		round(i)
	}
	for deadline := time.Now().Add(time.Minute); counts(l2.Name) < 4; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("lane 2 measured %d times in 4 rounds while lane 1's measure was held, want 4", counts(l2.Name))
		}
	}
	if n := counts(l1.Name); n != 1 {
		t.Fatalf("lane 1 asked %d times while its one measure was still out, want 1", n)
	}
	if !measured(rts[0]).IsZero() || measured(rts[1]).IsZero() {
		t.Fatalf("lane 1 measured at %v (its measure is held), lane 2 at %v", measured(rts[0]), measured(rts[1]))
	}
	close(release)
	for deadline := time.Now().Add(time.Minute); rts[0].checking.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("lane 1's check never ended once the broker answered it")
		}
	}
	round(4)
	waitFor(l1.Name, "the round after lane 1's measure was answered")
	if measured(rts[0]).IsZero() {
		t.Fatal("lane 1 was not measured once the broker answered")
	}
}
