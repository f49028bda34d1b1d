package controller

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"thermite/controller/ledger"
	"thermite/internal/rpc"
)

// StartRequest asks for a trial. Project is one of the controller's
// imported projects (the operator's command imports it first).
type StartRequest struct {
	Lane    int    `json:"lane"`
	Project string `json:"project"`
	Run     string `json:"run,omitempty"`
	// LaneOwned says the operator's import already made every entry but
	// the top the lane's: the controller moves it into place and the
	// broker hands over only its top, so a trial's start copies once.
	LaneOwned bool `json:"lane_owned,omitempty"`
}

// TrialStatus is a trial as `thermite trial list` shows it: its record
// and, while it is open, what the disk watcher last found.
type TrialStatus struct {
	ledger.Trial
	Disk *DiskState `json:"disk,omitempty"`
}

// EndRequest ends a trial.
type EndRequest struct {
	Reason string `json:"reason,omitempty"`
}

// decode reads a JSON body with a size limit and no unknown fields, or
// answers the problem with it.
func decode(w http.ResponseWriter, r *http.Request, limit int64, v any, hidden ...string) bool {
	if e := decodeStrict(r.Body, limit, v, hidden); e != nil {
		writeProblem(w, e.status, e.code, e.msg)
		return false
	}
	return true
}

// operatorRoutes is the operator's door to the controller, on a socket
// that only root and the controller's user can reach: the table of its
// routes, one handler each.
func (c *Controller) operatorRoutes() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range []struct {
		pattern string
		handle  http.HandlerFunc
	}{
		{"GET " + rpc.ControllerPing, c.opPing},
		{"POST /v1/trials", c.opStartTrial},
		{"GET /v1/trials", c.opListTrials},
		{"POST /v1/trials/prune", c.opPrune},
		{"GET /v1/trials/kept", c.opKept},
		{"POST /v1/trials/{id}/exec", trialRequest(c, func(w http.ResponseWriter, r *http.Request, rt *trialRT, req ExecRequest) {
			c.execInTrial(w, r, rt, req)
		})},
		{"POST /v1/trials/{id}/agent", trialRequest(c, c.runAgent)},
		{"GET /v1/trials/{id}/events", c.trialEvents},
		{"POST /v1/trials/{id}/end", c.opEndTrial},
		{"POST /v1/judge/builds", c.opBuild},
		{"POST /v1/judge/runs", c.opTime},
		{"GET /v1/judge", c.opJudgeList},
		{"GET /v1/judge/{id}", c.opJudgeOne},
		{"GET /v1/ledger/export", c.opExport},
		{"/", func(w http.ResponseWriter, r *http.Request) {
			writeError(w, http.StatusNotFound, "no route "+r.Method+" "+r.URL.Path)
		}},
	} {
		mux.HandleFunc(rt.pattern, rt.handle)
	}
	return mux
}

// opPing answers the broker's ping: the controller's pid, how many
// secrets it holds and where the harness API listens.
func (c *Controller) opPing(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	addr := c.apiAddr
	c.mu.Unlock()
	writeJSON(w, 200, map[string]any{"ok": true, "pid": os.Getpid(), "secrets": len(c.secrets), "api_tcp": addr, "api_socket": c.cfg.APISocket()})
}

// opStartTrial starts a trial on the operator's imported project.
func (c *Controller) opStartTrial(w http.ResponseWriter, r *http.Request) {
	var req StartRequest
	if !decode(w, r, 1<<20, &req) {
		return
	}
	info, err := c.StartTrial(req)
	if err != nil {
		writeError(w, http.StatusConflict, err.Error())
		return
	}
	writeJSON(w, 200, info)
}

// opListTrials lists the trials, each open one with its disk's state.
func (c *Controller) opListTrials(w http.ResponseWriter, r *http.Request) {
	// ?state=open reads only the open trials' index (what status
	// shows), so its cost never grows with the ledger's history.
	list := c.ledger.Trials
	if r.URL.Query().Get("state") == "open" {
		list = c.ledger.OpenTrials
	}
	ts, err := list()
	if err != nil {
		writeError(w, 500, err.Error())
		return
	}
	out := make([]TrialStatus, len(ts))
	c.mu.Lock()
	for i, t := range ts {
		out[i].Trial = t
		if rt := c.trials[t.ID]; rt != nil && t.State == "open" {
			rt.mu.Lock()
			d := rt.disk
			rt.mu.Unlock()
			out[i].Disk = &d
		}
	}
	c.mu.Unlock()
	writeJSON(w, 200, out)
}

// opPrune removes the folders of the trials that ended long enough ago.
func (c *Controller) opPrune(w http.ResponseWriter, r *http.Request) {
	var req PruneRequest
	if !decode(w, r, 4<<10, &req) {
		return
	}
	older := time.Duration(0)
	if req.OlderThan != "" {
		d, err := time.ParseDuration(req.OlderThan)
		if err != nil || d < 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("older_than: %q is not a duration of 0 or more (like 2h)", req.OlderThan))
			return
		}
		older = d
	}
	res, err := c.pruneEnded(older)
	if err != nil {
		writeError(w, 500, err.Error())
		return
	}
	writeJSON(w, 200, res)
}

// opKept says how much the ended trials' kept folders hold.
func (c *Controller) opKept(w http.ResponseWriter, r *http.Request) {
	k, err := c.keptEnded()
	if err != nil {
		writeError(w, 500, err.Error())
		return
	}
	writeJSON(w, 200, k)
}

// opEndTrial ends a trial and answers its ledger record.
func (c *Controller) opEndTrial(w http.ResponseWriter, r *http.Request) {
	var req EndRequest
	if !decode(w, r, 1<<20, &req) {
		return
	}
	if err := c.EndTrial(r.PathValue("id"), req.Reason); err != nil {
		writeError(w, http.StatusConflict, err.Error())
		return
	}
	t, _, _ := c.ledger.Trial(r.PathValue("id"))
	writeJSON(w, 200, t)
}

// opBuild builds a project under a kit.
func (c *Controller) opBuild(w http.ResponseWriter, r *http.Request) {
	var req BuildRequest
	if decode(w, r, 1<<20, &req) {
		b, err := c.Build(r.Context(), req)
		judgeAnswer(w, "build", b, b.ID != "", err)
	}
}

// opTime times a stored build.
func (c *Controller) opTime(w http.ResponseWriter, r *http.Request) {
	var req TimeRequest
	if decode(w, r, 1<<20, &req) {
		tr, err := c.Time(r.Context(), req)
		judgeAnswer(w, "run", tr, tr.ID != "", err)
	}
}

// opJudgeList answers every build, less its log, and every timed run.
func (c *Controller) opJudgeList(w http.ResponseWriter, r *http.Request) {
	bs, err := c.ledger.Builds()
	if err != nil {
		writeError(w, 500, err.Error())
		return
	}
	rs, err := c.ledger.TimedRuns()
	if err != nil {
		writeError(w, 500, err.Error())
		return
	}
	for i := range bs {
		bs[i].Log = ""
	}
	writeJSON(w, 200, map[string]any{"builds": bs, "runs": rs})
}

// opJudgeOne answers one build or timed run by its id.
func (c *Controller) opJudgeOne(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if b, ok, _ := c.ledger.Build(id); ok {
		writeJSON(w, 200, map[string]any{"build": b})
		return
	}
	if tr, ok, _ := c.ledger.TimedRun(id); ok {
		writeJSON(w, 200, map[string]any{"run": tr})
		return
	}
	writeError(w, http.StatusNotFound, "no build or timed run "+id)
}

// opExport writes the ledger, less the hidden test results, as JSON.
func (c *Controller) opExport(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if err := c.ledger.Export(w); err != nil {
		c.log.Error("export", "err", err)
	}
}

// judgeAnswer answers a build or a timed run: the record, or an error
// with the record beside it when there is one (a failed build's log).
func judgeAnswer(w http.ResponseWriter, field string, rec any, recorded bool, err error) {
	switch {
	case err != nil && !recorded:
		writeError(w, http.StatusBadRequest, err.Error())
	case err != nil:
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"error": err.Error(), field: rec})
	default:
		writeJSON(w, 200, rec)
	}
}

// execInTrial runs a command as the trial's lane, in its workspace.
func (c *Controller) execInTrial(w http.ResponseWriter, r *http.Request, rt *trialRT, req ExecRequest) ExecFrame {
	run, stdin, err := c.laneRun(rt, req)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return ExecFrame{}
	}
	f := c.streamCommand(r.Context(), w, run, c.cfg.API.ExecOutputCap, stdin)
	c.afterExec(rt, f)
	c.trialEvent(rt, "trial.exec", map[string]any{"argv0": filepath.Base(req.Argv[0]), "role": run.Role, "exit_code": f.ExitCode, "stopped": f.Stopped, "wall_ms": f.WallMS})
	return f
}
