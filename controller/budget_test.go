package controller

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"thermite/controller/ledger"
	"thermite/internal/config"
	"thermite/internal/confined"
	"thermite/internal/procs"
	"thermite/roles"
)

func TestDiskVerdict(t *testing.T) {
	const capBytes = 100
	emfile := fmt.Errorf("disk usage of lane-1: dial unix broker.sock: %w", syscall.EMFILE)
	tooBig := fmt.Errorf("disk usage of lane-1: %s", "walk /x: "+confined.ErrTooBig.Error())
	for _, c := range []struct {
		total int64
		err   error
		want  int
	}{
		{50, nil, diskWithin},
		{150, nil, diskOver},
		{150, emfile, diskOver}, // what was measured is over: a real verdict
		{50, emfile, diskUnmeasured},
		{0, errors.New("broker: connection refused"), diskUnmeasured},
		{0, tooBig, diskUnwalkable},
		// A process that keeps its descriptors from the measure: the lane's doing.
		{0, fmt.Errorf("disk usage of lane-1: unlinked files of lane-1: %w", procs.ErrHidden), diskUnwalkable},
	} {
		if got := diskVerdict(c.total, capBytes, c.err); got != c.want {
			t.Errorf("diskVerdict(%d, %v) = %d, want %d", c.total, c.err, got, c.want)
		}
	}
}

// TestUnreachableBrokerDoesNotEndATrial: a disk check that cannot reach
// the broker leaves the trial open, says why in its status, and retries.
func TestUnreachableBrokerDoesNotEndATrial(t *testing.T) {
	dir := t.TempDir()
	cfg := config.Default()
	table, err := roles.FromConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := ledger.Open(filepath.Join(dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c := &Controller{cfg: cfg, table: table, ledger: l, log: slog.New(slog.NewJSONHandler(io.Discard, nil)),
		broker: &brokerClient{socket: filepath.Join(dir, "no-broker.sock")}, trials: map[string]*trialRT{}}
	tr := ledger.Trial{ID: "t1", Run: "r", Lane: 1, State: "open", Started: time.Now(), TokenHash: ledger.HashToken("x")}
	if err := l.PutRun(ledger.Run{ID: "r", Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := l.StartTrial(tr); err != nil {
		t.Fatal(err)
	}
	rt := newTrialRT(tr)
	c.trials[tr.ID] = rt
	for range 3 {
		c.checkDisk(rt)
	}
	got, _, _ := l.Trial("t1")
	if got.State != "open" || rt.closing.Load() {
		t.Fatalf("the trial ended for the rig's failure: %+v", got)
	}
	if rt.disk.Error == "" || rt.disk.Failures != 3 || !strings.Contains(rt.disk.Error, "no-broker.sock") {
		t.Fatalf("the status does not say why: %+v", rt.disk)
	}
}

// TestBudgets: the per-token and total byte budgets, the per-peer and
// total connection budgets, and a body refused from its Content-Length.
func TestBudgets(t *testing.T) {
	// Two lanes, 100 bytes in all, 60 a token: each trial is guaranteed 50.
	b := newByteBudget(100, 60, 10, 2)
	r1, _, _ := b.reserveBody("a", 50)
	if r1 == nil {
		t.Fatal("a's first 50 bytes refused")
	}
	if r, code, _ := b.reserveBody("a", 11); r != nil || code != http.StatusTooManyRequests {
		t.Fatalf("a over its token's budget: %d", code)
	}
	if r, code, _ := b.reserveBody("a", 1); r != nil || code != http.StatusServiceUnavailable {
		t.Fatalf("a over its share with no pool: %d", code)
	}
	if r, _, _ := b.reserveBody("b", 50); r == nil {
		t.Fatal("b refused its share while a holds its own")
	}
	r1()
	r1()
	if r, _, _ := b.reserveBody("c", 50); r == nil {
		t.Fatal("c refused after a's release")
	}

	cb := newConnBudget(3, 2, 1, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	for i, want := range []bool{true, true, false} {
		if got := admitted(cb, "uid 1"); got != want {
			t.Fatalf("uid 1's connection %d: admitted %v, want %v (a per-peer cap of 2)", i+1, got, want)
		}
	}
	if !admitted(cb, "uid 2") || admitted(cb, "uid 3") {
		t.Fatal("the total cap of 3")
	}
	cb.release("uid 1")
	if !admitted(cb, "uid 3") {
		t.Fatal("a released place is not reused")
	}

	c := &Controller{cfg: config.Default()}
	h := c.apiGate(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { t.Error("an oversized body reached the handler") }))
	req := httptest.NewRequest("POST", "/v1/steps", strings.NewReader("{}"))
	req.ContentLength = 16 << 20
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusRequestEntityTooLarge || strings.Count(strings.TrimSpace(w.Body.String()), "\n") != 0 || w.Header().Get("Connection") != "close" {
		t.Fatalf("oversized step: %d %q %v", w.Code, w.Body.String(), w.Header())
	}
}

// TestFairShareLeavesTheSixteenthLaneItsShare: 15 lanes that each hold all
// their token may (two 16 MiB bodies) cannot keep the 16th from its own
// largest body, nor the operator's uid from its connections; with more
// lanes than whole bodies fit, every lane keeps a floor for small bodies
// while the largest share a pool; and every release gives back exactly
// what was taken.
func TestFairShareLeavesTheSixteenthLaneItsShare(t *testing.T) {
	const mib = 1 << 20
	b := newByteBudget(256*mib, 32*mib, 16*mib, 16)
	var releases []func()
	for lane := 1; lane <= 15; lane++ {
		trial := fmt.Sprintf("t%d", lane)
		r, _, msg := b.reserveBody(trial, 16*mib)
		if r == nil {
			t.Fatalf("lane %d's first body: %s", lane, msg)
		}
		releases = append(releases, r)
		r, code, msg := b.reserveBody(trial, 16*mib)
		if r != nil || code != http.StatusServiceUnavailable || !strings.Contains(msg, "guaranteed") {
			t.Fatalf("lane %d's second body, over its share: %d %q", lane, code, msg)
		}
	}
	if r, _, msg := b.reserveBody("t16", 16*mib); r == nil {
		t.Fatalf("lane 16's largest body behind 15 full lanes: %s", msg)
	} else {
		r()
	}
	for _, r := range releases {
		r()
	}
	if f := b.share; f.Sum() != 0 || f.Borrowed() != 0 || f.Holders() != 0 {
		t.Fatalf("all released, the budget still holds %d (%d borrowed, %d holders)", f.Sum(), f.Borrowed(), f.Holders())
	}

	// 32 lanes: 16 MiB floors would not fit, so half is floors (4 MiB) and
	// half a pool for the largest bodies.
	b = newByteBudget(256*mib, 32*mib, 16*mib, 32)
	if f := b.share; f.Floor() != 4*mib || f.Pool() != 128*mib {
		t.Fatalf("32 lanes: floor %d pool %d, want 4 MiB and 128 MiB", f.Floor(), f.Pool())
	}
	for lane := 1; lane <= 8; lane++ {
		if r, _, msg := b.reserveBody(fmt.Sprintf("t%d", lane), 16*mib+4*mib); r == nil {
			t.Fatalf("lane %d's large body from the pool: %s", lane, msg)
		}
	}
	if r, code, _ := b.reserveBody("t9", 16*mib); r != nil || code != http.StatusServiceUnavailable {
		t.Fatalf("a large body with the pool taken: %d", code)
	}
	for lane := 9; lane <= 32; lane++ {
		if r, _, msg := b.reserveBody(fmt.Sprintf("t%d", lane), 4*mib); r == nil {
			t.Fatalf("lane %d's small body with the pool taken: %s", lane, msg)
		}
	}
	if f := b.share; f.Sum() > f.Max() {
		t.Fatalf("the budget holds %d, over its %d", f.Sum(), f.Max())
	}

	// Connections: 15 lanes' and agents' uids at their cap leave the
	// operator's and lane 16's theirs, even with max_conns lowered.
	peers := 1 + 2*16
	cb := newConnBudget(1000, 64, peers, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	for uid := 1; uid <= 30; uid++ {
		for admitted(cb, fmt.Sprintf("uid %d", uid)) {
		}
	}
	for _, who := range []string{"uid 0", "uid 31", "uid 32"} {
		for i := int64(0); i < cb.share.Floor(); i++ {
			if !admitted(cb, who) {
				t.Fatalf("%s's connection %d of its guaranteed %d refused behind 30 full peers", who, i+1, cb.share.Floor())
			}
		}
	}
}

// admitted is admitConn's verdict alone.
func admitted(b *connBudget, peer string) bool {
	ok, _ := b.admitConn(peer)
	return ok
}

// TestConnectionOverItsPeerCapAnsweredNotDropped: a peer's connection
// beyond api.max_conns_per_peer is not closed without a byte (the peer
// would see EOF and guess): it reads one 503 whose problem names the
// limit and its value, whether it wrote its request before the refusal
// or not; its connections within the cap are served as before.
func TestConnectionOverItsPeerCapAnsweredNotDropped(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "api.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	l := &budgetListener{Listener: ul, budget: newConnBudget(8, 2, 2, slog.New(slog.NewJSONHandler(io.Discard, nil)))}
	served := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			served <- c
		}
	}()
	var kept []net.Conn
	for i := range 2 {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		select {
		case s := <-served:
			kept = append(kept, s)
		case <-time.After(30 * time.Second):
			t.Fatalf("connection %d of 2, within the cap, was never served", i+1)
		}
	}
	for _, writeFirst := range []bool{true, false} {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		if writeFirst {
			io.WriteString(c, "GET /v1/trial HTTP/1.1\r\nHost: api\r\n\r\n")
		}
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("over the cap (request written first: %v): %v, want a 503", writeFirst, err)
		}
		body, _ := io.ReadAll(resp.Body)
		c.Close()
		var p Problem
		if resp.StatusCode != http.StatusServiceUnavailable || json.Unmarshal(body, &p) != nil || p.Code != CodeBusy ||
			!strings.Contains(p.Detail, "api.max_conns_per_peer of 2") || !resp.Close {
			t.Fatalf("over the cap (request written first: %v): %d %v %q", writeFirst, resp.StatusCode, resp.Header, body)
		}
	}
	select {
	case s := <-served:
		t.Fatalf("a connection over the cap was served: %v", s)
	default:
	}
	// One of the peer's connections goes; its next is served again.
	kept[0].Close()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case <-served:
	case <-time.After(30 * time.Second):
		t.Fatal("after one of its connections closed, the peer's next was never served")
	}
}
