package controller

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"thermite/controller/fetch"
	"thermite/controller/ledger"
	"thermite/internal/config"
	"thermite/roles"
)

// Issue 13, point 5: 45 fetches of 5 MiB each were archived where every
// lane reads them, and counted nowhere. A trial's archives now have a
// budget of their own (trial.fetch_archive_mb): a page that would pass it
// is refused with 507 naming the key, nothing of it is written, and once
// the budget is spent the API refuses a fetch before it dials.
func TestFetchArchivesOverTheirBudgetRefused(t *testing.T) {
	dir := t.TempDir()
	cfg := config.Default()
	cfg.Trial.FetchArchiveMB = 1
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
		trials: map[string]*trialRT{}}
	research := filepath.Join(dir, "research")
	tr := ledger.Trial{ID: "t1", Run: "r", Lane: 1, State: "open", Started: time.Now(), TokenHash: ledger.HashToken("x"), ResearchDir: research}
	if err := l.PutRun(ledger.Run{ID: "r", Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := l.StartTrial(tr); err != nil {
		t.Fatal(err)
	}
	rt := newTrialRT(tr)
	c.trials[tr.ID] = rt
	page := func(i int) *fetch.Page {
		u := "https://example.com/page-" + string(rune('a'+i))
		return &fetch.Page{URL: u, Requested: u, Status: 200, Body: bytes.Repeat([]byte{'x'}, 300<<10), FetchedAt: time.Now().UTC()}
	}
	// Three pages of 300 KiB fit in 1 MiB; the fourth does not.
	for i := 0; i < 3; i++ {
		if _, ran, err := c.archivePage(rt, page(i)); !ran || err != nil {
			t.Fatalf("page %d within the budget: ran %v, %v", i, ran, err)
		}
	}
	_, ran, err := c.archivePage(rt, page(3))
	var over *archiveOverError
	if !ran || !errors.As(err, &over) || !strings.Contains(err.Error(), "trial.fetch_archive_mb (1 MiB)") {
		t.Fatalf("the page past the budget: ran %v, %v; want a refusal naming trial.fetch_archive_mb", ran, err)
	}
	bodies, _ := filepath.Glob(filepath.Join(research, "pages", "*.body"))
	if len(bodies) != 3 {
		t.Fatalf("%d pages archived, want the 3 within the budget", len(bodies))
	}
	if _, err := os.Stat(filepath.Join(research, "pages", fetch.ArchiveName(page(3))+".body")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused page was written: %v", err)
	}
	// The API: with the budget spent, a fetch is refused with 507 before
	// the fetcher is asked (it is nil here: asking it would panic).
	rt.archived.Store(cfg.Trial.FetchArchiveMB << 20)
	c.fetcher = nil
	w := httptest.NewRecorder()
	r := httptest.NewRequest("POST", "/v1/fetch", strings.NewReader(`{"url":"http://198.51.100.9:9/"}`))
	c.apiFetch(w, r, rt)
	if w.Code != http.StatusInsufficientStorage || !strings.Contains(w.Body.String(), "trial.fetch_archive_mb") {
		t.Fatalf("a fetch with the budget spent: %d %s; want 507 naming trial.fetch_archive_mb", w.Code, w.Body)
	}
}
