package controller

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"thermite/controller/fetch"
	"thermite/controller/ledger"
	"thermite/internal/lanefs"
)

// The harness API: what a worker agent's tools call, with its trial's
// token. Every file request runs as the lane's user, inside the trial's
// workspace (root 0) or, read-only, the run's research folder (root 1),
// through the trial's file helper.
const (
	rootWorkspace = 0
	rootResearch  = 1
)

// unauthorized is the one answer for no token, a wrong one and an ended
// trial's: nothing tells them apart.
const unauthorized = "a valid trial token is required"

// apiRoutes is the harness API's router, made from its one route table
// (apiTable), which the OpenAPI document is made from too. A path the
// table has with a method it lacks is answered 405 with the methods it
// takes; any other path 404. CONNECT is the egress proxy (egress.go).
func (c *Controller) apiRoutes() http.Handler {
	mux := http.NewServeMux()
	methods := map[string][]string{}
	var other http.HandlerFunc
	for _, rt := range c.apiTable() {
		methods[rt.Path] = append(methods[rt.Path], rt.Method)
		handle := rt.handle
		if rt.Auth {
			handle = c.authed(c.recordCall(rt, rt.serve))
		}
		handle = c.declaredOnly(rt, handle)
		mux.HandleFunc(rt.Method+" "+rt.Path, func(w http.ResponseWriter, r *http.Request) {
			// The mux serves HEAD with a GET route; the API has no HEAD.
			if r.Method != rt.Method {
				other(w, r)
				return
			}
			handle(w, r)
		})
	}
	other = func(w http.ResponseWriter, r *http.Request) {
		if ms, ok := methods[r.URL.Path]; ok {
			w.Header().Set("Allow", strings.Join(ms, ", "))
			writeProblem(w, http.StatusMethodNotAllowed, CodeMethodNotAllowed, r.URL.Path+" takes "+strings.Join(ms, ", ")+", not "+r.Method)
			return
		}
		writeProblem(w, http.StatusNotFound, CodeNoRoute, "no route "+r.Method+" "+r.URL.Path+"; GET /v1/openapi.json lists them")
	}
	mux.HandleFunc("/", other)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// CONNECT names a host, not a path: the egress proxy's.
		if r.Method == http.MethodConnect {
			c.egress(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// declaredOnly serves a route and logs, as an error, an answer whose
// status the OpenAPI document does not declare for it: the document is a
// promise, and a test run reads the log for breaches of it.
func (c *Controller) declaredOnly(rt apiRoute, next http.HandlerFunc) http.HandlerFunc {
	declared := rt.declared()
	return func(w http.ResponseWriter, r *http.Request) {
		next(&statusCheck{ResponseWriter: w, check: func(status int) {
			if !slices.Contains(declared, status) {
				c.log.Error("an answer's status is not in the API document", "route", rt.Method+" "+rt.Path, "status", status)
			}
		}}, r)
	}
}

// statusCheck sees the status of an answer as it is written.
type statusCheck struct {
	http.ResponseWriter
	check func(int)
	wrote bool
}

func (s *statusCheck) WriteHeader(status int) {
	if !s.wrote {
		s.wrote = true
		s.check(status)
	}
	s.ResponseWriter.WriteHeader(status)
}

func (s *statusCheck) Write(b []byte) (int, error) {
	if !s.wrote {
		s.WriteHeader(http.StatusOK)
	}
	return s.ResponseWriter.Write(b)
}

// Flush and Unwrap keep an exec's stream and the body deadlines working
// through the wrapper.
func (s *statusCheck) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *statusCheck) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// authed finds the open trial a request's token belongs to, or answers
// 401, the same for every kind of bad token, and closes the connection.
// Then, in order: the token's share of concurrent requests, its share of
// body bytes (reserved from the Content-Length, before the body is read),
// the body itself within its deadline, and the decoy guard.
func (c *Controller) authed(f func(http.ResponseWriter, *http.Request, *trialRT)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		rt := c.trialForRequest(r)
		if rt == nil {
			refuse(w, r, http.StatusUnauthorized, unauthorized)
			return
		}
		if n := rt.inflight.Add(1); n > int64(c.cfg.API.MaxConnsPerToken) {
			rt.inflight.Add(-1)
			refuse(w, r, http.StatusTooManyRequests, fmt.Sprintf("more than %d requests at once on this token", c.cfg.API.MaxConnsPerToken))
			return
		}
		defer rt.inflight.Add(-1)
		if rt.closing.Load() {
			refuse(w, r, http.StatusUnauthorized, unauthorized)
			return
		}
		ctx, cancel := rt.within(r.Context())
		defer cancel()
		r = r.WithContext(ctx)
		limit := c.bodyLimit(r)
		want := r.ContentLength
		if want < 0 {
			want = limit
		}
		release, code, msg := c.bodies.reserveBody(rt.t.ID, want)
		if release == nil {
			refuse(w, r, code, msg)
			return
		}
		defer release()
		body, code, msg := readBody(w, r, rt, limit)
		if code != 0 {
			refuse(w, r, code, msg)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if !c.guardDecoy(w, r, rt, body) {
			return
		}
		f(w, r, rt)
	}
}

// TrialForToken decides whether a request's Authorization header belongs
// to an open trial: "Bearer <token>" (the scheme in any case), a running
// lane harness's token or one whose hash the ledger holds for an open
// trial only. Where the token may be used is tokenServes's to decide.
func (c *Controller) TrialForToken(header string) *trialRT {
	rt, _ := c.tokenTrial(header)
	return rt
}

// tokenTrial is TrialForToken with the kind of token found.
func (c *Controller) tokenTrial(header string) (*trialRT, tokenKind) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(header), " ")
	token = strings.TrimSpace(token)
	// RFC 9110 §11.1: the scheme is case-insensitive.
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" || len(token) > 256 {
		return nil, trialToken
	}
	hash := ledger.HashToken(token)
	c.mu.Lock()
	run := c.laneRuns[hash]
	c.mu.Unlock()
	if run != nil {
		return run, laneRunToken
	}
	t, ok, err := c.ledger.TrialByToken(token)
	if err != nil || !ok {
		return nil, trialToken
	}
	c.mu.Lock()
	rt := c.trials[t.ID]
	c.mu.Unlock()
	return rt, trialToken
}

// underRoot takes an absolute path inside dir (as an answer gives it)
// back to the path from dir that a file request takes; any other path is
// left as it is, for the file helper to judge.
func underRoot(dir, p string) string {
	if !filepath.IsAbs(p) {
		return p
	}
	rel, err := filepath.Rel(dir, filepath.Clean(p))
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return p
	}
	return rel
}

// fsCall runs a file helper operation as the lane: it decodes the
// request (refusing a "root": the caller never chooses it), pins it to the
// trial's root, takes back a path inside that root as an answer gives it,
// asks the trial's file helper, and answers.
func (c *Controller) fsCall(w http.ResponseWriter, r *http.Request, rt *trialRT, op *lanefs.Op, root int) {
	q := op.NewRequest()
	if !decode(w, r, c.cfg.API.MaxBodyBytes, q, "root") {
		return
	}
	dir := rt.t.Workspace
	if root == rootResearch {
		dir = rt.t.ResearchDir
	}
	op.Pin(q, root, func(p string) string { return underRoot(dir, p) })
	res := op.NewResponse()
	var err error
	if !rt.effect(func() { err = rt.files().Call(r.Context(), op, q, res) }) {
		refuse(w, r, http.StatusUnauthorized, unauthorized)
		return
	}
	if err != nil {
		var le *lanefs.Error
		if errors.As(err, &le) {
			writeProblem(w, le.HTTPStatus(), le.Code, strings.TrimPrefix(le.Msg, "lanefs: "))
			return
		}
		c.log.Warn("the trial's file helper failed", "trial", rt.t.ID, "err", err)
		writeProblem(w, http.StatusBadGateway, CodeBadGateway, "the trial's file helper failed; the trial's log has why")
		return
	}
	writeJSON(w, 200, res)
}

// What one record takes besides its text, counted against
// max_trial_recorded with it: a step's ledger rows (its event and its
// call's, about 1 KiB), a note's file (a block) and its event. Without
// it an empty step or a one-byte note would count one byte, and the
// 20 MiB budget would admit 20 million of them: 20 GiB of ledger, or
// 80 GiB and 20 million files of notes, for one trial.
const (
	stepOverhead = 1 << 10
	noteOverhead = 4 << 10
)

// record takes n bytes, and overhead for the record itself, from the
// trial's recording budget: at most max_step_bytes of text at once and
// max_trial_recorded in all.
func (c *Controller) record(w http.ResponseWriter, rt *trialRT, n, overhead int64) bool {
	if n > c.cfg.API.MaxStepBytes {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("a recorded step is at most %d bytes; this one is %d", c.cfg.API.MaxStepBytes, n))
		return false
	}
	if total := rt.recorded.Add(n + overhead); total > c.cfg.API.MaxTrialRecorded {
		rt.recorded.Add(-n - overhead)
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the trial has recorded its limit of %d bytes (each step counts %d bytes besides its text, each note %d, for its record)", c.cfg.API.MaxTrialRecorded, stepOverhead, noteOverhead))
		return false
	}
	return true
}

func (c *Controller) apiStep(w http.ResponseWriter, r *http.Request, rt *trialRT) {
	var req StepRequest
	if !decode(w, r, c.cfg.API.MaxStepBytes+4096, &req) {
		return
	}
	if req.Kind == "" {
		writeProblem(w, http.StatusBadRequest, CodeMissingField, "missing field kind")
		return
	}
	if !c.record(w, rt, int64(len(req.Text)+len(req.Kind)), stepOverhead) {
		return
	}
	if !c.trialEvent(rt, "step", req) {
		refuse(w, r, http.StatusUnauthorized, unauthorized)
		return
	}
	writeJSON(w, 200, StepResult{Recorded: len(req.Text)})
}

// apiNote writes a research note into the run's research folder, as the
// controller: every lane can read it, none can change it.
func (c *Controller) apiNote(w http.ResponseWriter, r *http.Request, rt *trialRT) {
	var req NoteRequest
	if !decode(w, r, c.cfg.API.MaxStepBytes+4096, &req) {
		return
	}
	if req.Body == "" {
		writeProblem(w, http.StatusBadRequest, CodeMissingField, "missing field body")
		return
	}
	if !c.record(w, rt, int64(len(req.Title)+len(req.Body)), noteOverhead) {
		return
	}
	var p string
	var err error
	ran := rt.effect(func() {
		n := rt.notes.Add(1)
		name := fmt.Sprintf("%s-%03d.md", rt.t.ID, n)
		text := fmt.Sprintf("# %s\n\nlane %d, trial %s, %s\n\n%s\n", req.Title, rt.t.Lane, rt.t.ID, time.Now().UTC().Format(time.RFC3339), req.Body)
		p = filepath.Join(rt.t.ResearchDir, "notes", name)
		if err = writeNew(p, text); err == nil {
			c.event("research.note", rt.t, map[string]any{"path": p, "title": req.Title})
		}
	})
	switch {
	case !ran:
		refuse(w, r, http.StatusUnauthorized, unauthorized)
	case err != nil:
		c.log.Error("research note", "trial", rt.t.ID, "err", err)
		writeProblem(w, 500, CodeInternal, "the note could not be written")
	default:
		writeJSON(w, 200, NoteResult{Path: researchPath(rt, p)})
	}
}

// writeNew writes a file that must not exist yet.
func writeNew(p, text string) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("note %s: %w", p, err)
	}
	_, err = f.WriteString(text)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("note %s: %w", p, err)
	}
	return nil
}

// trialEvent records an event of a request of the trial, unless the
// trial has ended; it reports whether it did.
func (c *Controller) trialEvent(rt *trialRT, kind string, data any) bool {
	return rt.effect(func() { c.event(kind, rt.t, data) })
}

// archiveOverError: a page would take a trial's fetch archives past
// trial.fetch_archive_mb.
type archiveOverError struct {
	URL        string
	Held, Need int64
	LimitMB    int64
}

func (e *archiveOverError) Error() string {
	return fmt.Sprintf("fetch: %s: the trial's archived pages hold %d bytes, and %d more would pass trial.fetch_archive_mb (%d MiB): refused",
		e.URL, e.Held, e.Need, e.LimitMB)
}

// archiveBudget says whether n more bytes of archived pages fit the
// trial's trial.fetch_archive_mb, without taking them.
func (c *Controller) archiveBudget(rt *trialRT, url string, n int64) error {
	if held := rt.archived.Load(); held+n > c.cfg.Trial.FetchArchiveMB<<20 {
		return &archiveOverError{URL: url, Held: held, Need: n, LimitMB: c.cfg.Trial.FetchArchiveMB}
	}
	return nil
}

// archivePage archives a fetched page in the run's research folder if its
// body and metadata fit the trial's fetch archive budget: the archives are
// the controller's files, so no folder of the lane's counts them, and the
// budget is what bounds them. The bytes are taken before the write, so
// fetches at once cannot pass it together; a write that fails gives them
// back. ran is false when the trial ended first: nothing was written.
func (c *Controller) archivePage(rt *trialRT, page *fetch.Page) (path string, ran bool, err error) {
	// The metadata names both URLs and a few short fields: 1 KiB beyond them.
	need := int64(len(page.Body) + len(page.URL) + len(page.Requested) + 1024)
	limit := c.cfg.Trial.FetchArchiveMB << 20
	for {
		held := rt.archived.Load()
		if held+need > limit {
			return "", true, &archiveOverError{URL: page.URL, Held: held, Need: need, LimitMB: c.cfg.Trial.FetchArchiveMB}
		}
		if rt.archived.CompareAndSwap(held, held+need) {
			break
		}
	}
	ran = rt.effect(func() {
		if path, err = fetch.Archive(filepath.Join(rt.t.ResearchDir, "pages"), page); err == nil {
			c.event("fetch", rt.t, map[string]any{"url": page.URL, "status": page.Status, "bytes": len(page.Body), "archived_bytes": rt.archived.Load()})
		}
	})
	if !ran || err != nil {
		rt.archived.Add(-need)
	}
	return path, ran, err
}

// researchPath is a path in the run's research folder as the research
// routes take it: from the folder.
func researchPath(rt *trialRT, p string) string {
	if rel, err := filepath.Rel(rt.t.ResearchDir, p); err == nil {
		return rel
	}
	return p
}

// apiFetch fetches a page as the controller, refusing private and local
// addresses at dial time, and archives it in the run's research folder.
func (c *Controller) apiFetch(w http.ResponseWriter, r *http.Request, rt *trialRT) {
	var req FetchRequest
	if !decode(w, r, 64<<10, &req) {
		return
	}
	if req.URL == "" {
		writeProblem(w, http.StatusBadRequest, CodeMissingField, "missing field url")
		return
	}
	// A trial whose archives are at their budget fetches nothing more.
	if err := c.archiveBudget(rt, req.URL, 1); err != nil {
		c.agentEvent(rt, "fetch.refused", map[string]any{"url": req.URL, "error": err.Error()})
		writeError(w, http.StatusInsufficientStorage, err.Error())
		return
	}
	page, err := c.fetcher.Fetch(r.Context(), req.URL)
	if err != nil {
		c.agentEvent(rt, "fetch.refused", map[string]any{"url": req.URL, "error": err.Error()})
		status := fetch.HTTPStatus(err)
		code := statusCode(status)
		if status == http.StatusForbidden {
			code = CodeFetchRefused
		}
		writeProblem(w, status, code, fetchDetail(err))
		return
	}
	path, ran, err := c.archivePage(rt, page)
	if !ran {
		refuse(w, r, http.StatusUnauthorized, unauthorized)
		return
	}
	var over *archiveOverError
	if errors.As(err, &over) {
		c.agentEvent(rt, "fetch.refused", map[string]any{"url": page.URL, "error": err.Error()})
		writeError(w, http.StatusInsufficientStorage, err.Error())
		return
	}
	if err != nil {
		c.log.Error("archive a fetched page", "trial", rt.t.ID, "err", err)
		writeProblem(w, 500, CodeInternal, "the page could not be archived")
		return
	}
	writeJSON(w, 200, FetchResult{URL: page.URL, Status: page.Status, ContentType: page.ContentType, Size: len(page.Body), Path: researchPath(rt, path)})
}

// fetchDetail says why a fetch failed in the words of the rig's
// configuration, not the fetcher's own field names.
func fetchDetail(err error) string {
	var tooLarge *fetch.TooLargeError
	var timeout *fetch.TimeoutError
	switch {
	case errors.As(err, &tooLarge):
		return fmt.Sprintf("fetch: %s: the body is over the rig's api.fetch_max_bytes of %d", tooLarge.URL, tooLarge.Limit)
	case errors.As(err, &timeout):
		return fmt.Sprintf("fetch: %s: not done within the rig's api.fetch_timeout of %v", timeout.URL, timeout.Limit)
	}
	return err.Error()
}
