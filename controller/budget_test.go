package controller

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
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
	b := newByteBudget(100, 60)
	r1, _, _ := b.reserveBody("a", 60)
	if r1 == nil {
		t.Fatal("a's first 60 bytes refused")
	}
	if r, code, _ := b.reserveBody("a", 1); r != nil || code != http.StatusTooManyRequests {
		t.Fatalf("a over its token's budget: %d", code)
	}
	if r, code, _ := b.reserveBody("b", 50); r != nil || code != http.StatusServiceUnavailable {
		t.Fatalf("b over the total: %d", code)
	}
	r1()
	r1()
	if r, _, _ := b.reserveBody("b", 60); r == nil {
		t.Fatal("b refused after a's release")
	}

	cb := newConnBudget(3, 2, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	for i, want := range []bool{true, true, false} {
		if got := cb.admitConn("uid 1"); got != want {
			t.Fatalf("uid 1's connection %d: admitted %v, want %v (a per-peer cap of 2)", i+1, got, want)
		}
	}
	if !cb.admitConn("uid 2") || cb.admitConn("uid 3") {
		t.Fatal("the total cap of 3")
	}
	cb.release("uid 1")
	if !cb.admitConn("uid 3") {
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
