package controller

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"

	"thermite/controller/ledger"
	"thermite/internal/rpc"
)

// StartRequest asks for a trial. Project is one of the controller's
// imported projects (the operator's command imports it first).
type StartRequest struct {
	Lane    int    `json:"lane"`
	Project string `json:"project"`
	Run     string `json:"run,omitempty"`
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

// decode reads a JSON body with a size limit and no unknown fields.
func decode(w http.ResponseWriter, r *http.Request, limit int64, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if ok := asMaxBytes(err, &tooBig); ok {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body over the %d-byte limit", limit))
			return false
		}
		writeError(w, http.StatusBadRequest, "bad JSON: "+err.Error())
		return false
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, "bad JSON: trailing data")
		return false
	}
	return true
}

func asMaxBytes(err error, target **http.MaxBytesError) bool {
	for err != nil {
		if e, ok := err.(*http.MaxBytesError); ok {
			*target = e
			return true
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		err = u.Unwrap()
	}
	return false
}

// operatorRoutes is the operator's door to the controller, on a socket
// that only root and the controller's user can reach.
func (c *Controller) operatorRoutes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+rpc.ControllerPing, func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		addr := c.apiAddr
		c.mu.Unlock()
		writeJSON(w, 200, map[string]any{"ok": true, "pid": os.Getpid(), "secrets": len(c.secrets), "api_tcp": addr, "api_socket": c.cfg.APISocket()})
	})
	mux.HandleFunc("POST /v1/trials", func(w http.ResponseWriter, r *http.Request) {
		var req StartRequest
		if !decode(w, r, 1<<20, &req) {
			return
		}
		info, err := c.StartTrial(req.Lane, req.Project, req.Run)
		if err != nil {
			writeError(w, http.StatusConflict, err.Error())
			return
		}
		writeJSON(w, 200, info)
	})
	mux.HandleFunc("GET /v1/trials", func(w http.ResponseWriter, r *http.Request) {
		ts, err := c.ledger.Trials()
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
	})
	trialCommand := func(run func(http.ResponseWriter, *http.Request, *trialRT, ExecRequest)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			var req ExecRequest
			if !decode(w, r, 1<<20, &req) {
				return
			}
			rt, err := c.trial(r.PathValue("id"))
			if err != nil {
				writeError(w, http.StatusNotFound, err.Error())
				return
			}
			rt.inflight.Add(1)
			defer rt.inflight.Add(-1)
			if rt.closing.Load() {
				writeError(w, http.StatusConflict, "trial: "+rt.t.ID+" is ending")
				return
			}
			ctx, cancel := rt.within(r.Context())
			defer cancel()
			run(w, r.WithContext(ctx), rt, req)
		}
	}
	mux.HandleFunc("POST /v1/trials/{id}/exec", trialCommand(func(w http.ResponseWriter, r *http.Request, rt *trialRT, req ExecRequest) {
		c.execInTrial(w, r, rt, req)
	}))
	mux.HandleFunc("POST /v1/trials/{id}/agent", trialCommand(c.runAgent))
	mux.HandleFunc("POST /v1/trials/{id}/end", func(w http.ResponseWriter, r *http.Request) {
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
	})
	mux.HandleFunc("POST /v1/judge/builds", func(w http.ResponseWriter, r *http.Request) {
		var req BuildRequest
		if decode(w, r, 1<<20, &req) {
			b, err := c.Build(r.Context(), req)
			judgeAnswer(w, "build", b, b.ID != "", err)
		}
	})
	mux.HandleFunc("POST /v1/judge/runs", func(w http.ResponseWriter, r *http.Request) {
		var req TimeRequest
		if decode(w, r, 1<<20, &req) {
			tr, err := c.Time(r.Context(), req)
			judgeAnswer(w, "run", tr, tr.ID != "", err)
		}
	})
	mux.HandleFunc("GET /v1/judge", func(w http.ResponseWriter, r *http.Request) {
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
	})
	mux.HandleFunc("GET /v1/judge/{id}", func(w http.ResponseWriter, r *http.Request) {
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
	})
	mux.HandleFunc("GET /v1/ledger/export", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if err := c.ledger.Export(w); err != nil {
			c.log.Error("export", "err", err)
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no route "+r.Method+" "+r.URL.Path)
	})
	return mux
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
	if len(req.Argv) == 0 {
		writeError(w, http.StatusBadRequest, "argv is empty")
		return ExecFrame{}
	}
	lane, _ := c.table.Lane(rt.t.Lane)
	run := &rpc.RunRequest{Role: lane.Name, Argv: req.Argv, Env: append(trialEnv(rt.t), req.Env...), Cwd: rt.t.Workspace, Limits: rpc.Limits{TimeoutMS: req.TimeoutMS}}
	f := c.streamCommand(r.Context(), w, run, c.cfg.API.ExecOutputCap)
	c.afterExec(rt, f)
	c.trialEvent(rt, "trial.exec", map[string]any{"argv0": filepath.Base(req.Argv[0]), "exit_code": f.ExitCode, "stopped": f.Stopped, "wall_ms": f.WallMS})
	return f
}

// runAgent runs the trial's worker agent as agent-N, with the trial's
// folder as its home: it can read none of the lane's files and reaches the
// workspace only through the API, with its token.
func (c *Controller) runAgent(w http.ResponseWriter, r *http.Request, rt *trialRT, req ExecRequest) {
	if len(req.Argv) == 0 {
		writeError(w, http.StatusBadRequest, "argv is empty")
		return
	}
	agent, _ := c.table.Agent(rt.t.Lane)
	info := c.info(rt.t)
	env := append(trialEnv(rt.t),
		"THERMITE_TRIAL="+rt.t.ID,
		"THERMITE_API_SOCKET="+info.APISocket,
		"THERMITE_TOKEN_FILE="+info.TokenFile)
	env = append(env, req.Env...)
	run := &rpc.RunRequest{Role: agent.Name, Argv: req.Argv, Env: env, Home: rt.t.AgentDir, Cwd: rt.t.AgentDir, Limits: rpc.Limits{TimeoutMS: req.TimeoutMS}}
	f := c.streamCommand(r.Context(), w, run, c.cfg.API.ExecOutputCap)
	c.trialEvent(rt, "trial.agent", map[string]any{"argv0": filepath.Base(req.Argv[0]), "exit_code": f.ExitCode, "stopped": f.Stopped})
}
