package controller

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"thermite/controller/ledger"
	"thermite/internal/rpc"
)

// The two ways to run a trial's worker agent.
const (
	// HarnessPi runs it as agent-N, its trial's folder as HOME: it reads
	// none of the lane's files and reaches the workspace only through the
	// API, with its token (Pi's agent and any program of that kind).
	HarnessPi = "pi"
	// HarnessLane runs it as the lane's user in the workspace (OpenCode,
	// Claude Code, Codex): the lane's access and none of the judge's, its
	// token and MCP configuration in a home of its own.
	HarnessLane = "lane"
)

// AgentRequest runs a trial's worker agent.
type AgentRequest struct {
	Argv      []string `json:"argv"`
	TimeoutMS int64    `json:"timeout_ms,omitempty"`
	Env       []string `json:"env,omitempty"`
	// Harness is HarnessPi ("" too) or HarnessLane.
	Harness string `json:"harness,omitempty"`
}

// trialRequest is an operator's request about one open trial: its body
// decoded, the trial found and held open while the request runs.
func trialRequest[Q any](c *Controller, run func(http.ResponseWriter, *http.Request, *trialRT, Q)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req Q
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

// agentTimeout decides how long an agent's run may last: what it asks,
// at most agent.wall_timeout, which is also the default.
func (c *Controller) agentTimeout(ms int64) (time.Duration, error) {
	max := c.cfg.Agent.WallTimeout.Duration
	switch {
	case ms < 0:
		return 0, fmt.Errorf("timeout_ms: %d is negative", ms)
	case ms == 0:
		return max, nil
	case time.Duration(ms)*time.Millisecond > max:
		return 0, fmt.Errorf("timeout: %s is over the rig's agent.wall_timeout of %s", time.Duration(ms)*time.Millisecond, max)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// runAgent runs the trial's worker agent by its harness, under the
// agent's own limits: agent.wall_timeout (hours, not a lane command's
// minutes), its output streamed, capped only by agent.output_cap_mb.
func (c *Controller) runAgent(w http.ResponseWriter, r *http.Request, rt *trialRT, req AgentRequest) {
	if len(req.Argv) == 0 {
		writeProblem(w, http.StatusBadRequest, CodeMissingField, "field argv: empty; it names the agent's program and its arguments")
		return
	}
	if err := ownCommand(req.Argv); err != nil {
		writeProblem(w, http.StatusBadRequest, CodeBadField, err.Error())
		return
	}
	timeout, err := c.agentTimeout(req.TimeoutMS)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, CodeBadField, err.Error())
		return
	}
	var run *rpc.RunRequest
	end := func() {}
	switch req.Harness {
	case "", HarnessPi:
		run, err = c.piAgent(rt, req)
	case HarnessLane:
		run, end, err = c.laneAgent(rt, req)
	default:
		err = fmt.Errorf("harness: %q is not one of %s, %s", req.Harness, HarnessPi, HarnessLane)
	}
	switch {
	case errors.Is(err, errLaneRunning):
		writeProblem(w, http.StatusConflict, CodeConflict, err.Error())
		return
	case err != nil:
		writeProblem(w, http.StatusBadRequest, CodeBadField, err.Error())
		return
	}
	// The lane harness run's token is revoked, and its file gone, once
	// the run is over.
	defer end()
	// The broker's wall timeout is a lane command's; the agent's is kept
	// here, and the broker stops the run when this request ends.
	run.NoTimeout = true
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	limit := c.cfg.Agent.OutputCapMB << 20
	if limit == 0 {
		limit = 1 << 62
	}
	c.trialEvent(rt, "trial.agent.start", map[string]any{"harness": cmp.Or(req.Harness, HarnessPi), "role": run.Role, "argv0": filepath.Base(req.Argv[0])})
	f := c.streamAgent(ctx, w, run, limit)
	c.afterExec(rt, f)
	c.trialEvent(rt, "trial.agent", map[string]any{"harness": cmp.Or(req.Harness, HarnessPi), "role": run.Role, "argv0": filepath.Base(req.Argv[0]), "exit_code": f.ExitCode, "stopped": f.Stopped, "wall_ms": f.WallMS})
}

// streamAgent streams a run whose deadline is ctx's, and says "timeout"
// when that deadline stopped it.
func (c *Controller) streamAgent(ctx context.Context, w http.ResponseWriter, run *rpc.RunRequest, limit int64) ExecFrame {
	start := time.Now()
	return c.streamCommandThen(ctx, w, run, limit, nil, func(f *ExecFrame) {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			// The broker saw its caller go: that was the agent's deadline.
			f.Stopped, f.Error, f.WallMS = rpc.StoppedTimeout, "", time.Since(start).Milliseconds()
		}
	})
}

// agentEnv is what an agent's program, run as role, finds its trial by:
// that role's own API socket among them (documented in
// docs/trial-client.md).
func (c *Controller) agentEnv(rt *trialRT, role, tokenFile string) []string {
	env := append(trialEnv(rt.t),
		"THERMITE_TRIAL="+rt.t.ID,
		"THERMITE_API_SOCKET="+c.cfg.RoleAPISocket(role),
		"THERMITE_TOKEN_FILE="+tokenFile)
	// No THERMITE_API_URL: the api network policy gives lanes and agents
	// no TCP (issue 13). Where the rig lists providers the agent runs in
	// egress mode, whose one TCP address is its proxy: HTTPS_PROXY.
	return append(env, c.egressProxyEnv()...)
}

// piAgent runs the agent as agent-N, with the trial's folder as its home:
// it can read none of the lane's files and reaches the workspace only
// through the API, with its token. Pi itself runs only with thermite's
// extension in place (piReady), whose tools are its way to the workspace,
// and with its start-up network traffic and telemetry off.
func (c *Controller) piAgent(rt *trialRT, req AgentRequest) (*rpc.RunRequest, error) {
	agent, _ := c.table.Agent(rt.t.Lane)
	env := c.agentEnv(rt, agent.Name, c.info(rt.t).TokenFile)
	argv := req.Argv
	if runsPi(argv) {
		if err := piReady(c.cfg.Agent.PiExtension, req); err != nil {
			return nil, fmt.Errorf("harness pi: %w", err)
		}
		// Before the operator's: the broker keeps a variable's first value.
		env = append(env, piEnv(rt.t.AgentDir)...)
		argv = piArgv(argv, c.cfg.Agent.PiExtension)
	}
	env = append(env, req.Env...)
	return &rpc.RunRequest{Role: agent.Name, Argv: argv, Env: env, Home: rt.t.AgentDir, Cwd: rt.t.AgentDir}, nil
}

// writeAgentHome writes agent-N's program configuration into the trial's
// agent folder before it is handed to agent-N (the controller cannot
// write there after): Pi's settings, which load thermite's extension.
func (c *Controller) writeAgentHome(dir string) error {
	if err := writeHomeFiles(dir, piFiles(c.cfg.Agent.PiExtension)); err != nil {
		return fmt.Errorf("agent folder: %w", err)
	}
	return nil
}

// writeHomeFiles writes files below dir, the controller's own (0600, their
// folders 0700), before dir is handed to its role.
func writeHomeFiles(dir string, files []homeFile) error {
	for _, f := range files {
		p := filepath.Join(dir, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(f.data), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// laneHome is the lane harness's home: the trial's folder "lane", the
// lane's (0700), with the trial's details and each agent program's MCP
// configuration where that program reads it.
func (c *Controller) laneHome(rt *trialRT) string {
	return filepath.Join(c.trialDir(rt.t.ID), "lane")
}

// laneTokenDir holds a lane harness run's token while the run lasts: the
// trial's folder "lane-token", the lane's for that run and removed after.
// Its token file is the one every program's MCP configuration names.
func (c *Controller) laneTokenDir(id string) string {
	return filepath.Join(c.trialDir(id), "lane-token")
}

// errLaneRunning refuses a second lane harness run while one runs: the
// token file is the running one's.
var errLaneRunning = errors.New("harness lane: a lane harness run of this trial is running; one runs at a time, each with a token of its own")

// laneAgent runs the agent program as the lane's user in the workspace,
// with the lane's access (and none of the judge's), its home the lane
// harness's folder holding its MCP configurations, and a token of its own
// for the lane's API socket (grantLaneRun). end revokes the token.
func (c *Controller) laneAgent(rt *trialRT, req AgentRequest) (run *rpc.RunRequest, end func(), err error) {
	if runsCodex(req.Argv) {
		if err := codexOwnSandbox(req.Argv, req.Env); err != nil {
			return nil, nil, fmt.Errorf("harness lane: %w", err)
		}
	}
	home := c.laneHome(rt)
	lane, _ := c.table.Lane(rt.t.Lane)
	if err := c.writeLaneHome(rt, home, lane.Name); err != nil {
		return nil, nil, fmt.Errorf("harness lane: %w", err)
	}
	tokenFile, end, err := c.grantLaneRun(rt, lane.Name)
	if err != nil {
		return nil, nil, err
	}
	env := append(append(c.agentEnv(rt, lane.Name, tokenFile), req.Env...), laneProgramEnv...)
	// The lane harness's run, and no other command of the lane, is in
	// egress mode: in the lane's network namespace with its proxy.
	egress := len(c.cfg.Agent.Egress) > 0
	return &rpc.RunRequest{Role: lane.Name, Argv: req.Argv, Env: env, Home: home, Cwd: rt.t.Workspace, Egress: egress}, end, nil
}

// grantLaneRun mints the token of one lane harness run: served only on
// the lane's own API socket (tokenServes), its file the lane's
// (laneTokenDir) for the run alone. end revokes it and takes the file
// away, so that no later command of the lane (a Pi's bash, trial exec)
// finds a token that works: the trial's own token is never the lane's.
func (c *Controller) grantLaneRun(rt *trialRT, lane string) (tokenFile string, end func(), err error) {
	rt.mu.Lock()
	busy := rt.laneRun
	rt.laneRun = true
	rt.mu.Unlock()
	if busy {
		return "", nil, errLaneRunning
	}
	dir := c.laneTokenDir(rt.t.ID)
	tokenFile = filepath.Join(dir, "token")
	hash := ""
	end = func() {
		if hash != "" {
			c.mu.Lock()
			delete(c.laneRuns, hash)
			c.mu.Unlock()
		}
		// A trial that ends takes its whole folder from every role
		// (retireTrial): nothing to take back then.
		if !rt.closing.Load() {
			if err := c.dropLaneTokenDir(dir); err != nil && !rt.closing.Load() {
				c.log.Warn("a lane harness run's token folder stays (its token is revoked)", "trial", rt.t.ID, "folder", dir, "err", err)
			}
		}
		rt.mu.Lock()
		rt.laneRun = false
		rt.mu.Unlock()
	}
	fail := func(err error) (string, func(), error) {
		end()
		return "", nil, fmt.Errorf("harness lane: its token %s: %w", tokenFile, err)
	}
	// What a run that never ended left (a controller stopped mid-run).
	if err := c.dropLaneTokenDir(dir); err != nil {
		return fail(err)
	}
	token := randomID("", 32)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fail(err)
	}
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		return fail(err)
	}
	if err := c.broker.handFolder(dir, lane, 0o700, true); err != nil {
		return fail(err)
	}
	hash = ledger.HashToken(token)
	c.mu.Lock()
	if c.laneRuns == nil {
		c.laneRuns = map[string]*trialRT{}
	}
	c.laneRuns[hash] = rt
	c.mu.Unlock()
	return tokenFile, end, nil
}

// dropLaneTokenDir takes a lane harness run's token folder back from the
// lane, whatever it made there, and removes it.
func (c *Controller) dropLaneTokenDir(dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := c.broker.handFolder(dir, c.table.Controller().Name, 0o700, false); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// writeLaneHome makes the lane harness's home once, as the controller,
// then hands it to the lane: the trial's details, and each agent
// program's configuration where that program reads it
// (laneProgramFiles), each starting `thermite trial-client mcp` with the
// lane's socket and the lane harness run's token file (laneTokenDir).
func (c *Controller) writeLaneHome(rt *trialRT, home, lane string) error {
	if _, err := os.Lstat(home); err == nil {
		return nil
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("the thermite binary's path: %w", err)
	}
	info := c.info(rt.t)
	info.APISocket = c.cfg.RoleAPISocket(lane)
	info.TokenFile = filepath.Join(c.laneTokenDir(rt.t.ID), "token")
	mcp := mcpServer{command: self, args: []string{"trial-client", "--socket", info.APISocket, "--token-file", info.TokenFile, "mcp"}}
	details, _ := json.MarshalIndent(info, "", "  ")
	files := []homeFile{{"trial.json", string(details) + "\n"}}
	for _, program := range laneProgramFiles {
		files = append(files, program(mcp)...)
	}
	if err := os.Mkdir(home, 0o700); err != nil {
		return err
	}
	// A home half written is removed: the next run would take it as made.
	if err := writeHomeFiles(home, files); err != nil {
		os.RemoveAll(home)
		return err
	}
	if err := c.broker.handFolder(home, lane, 0o700, false); err != nil {
		os.RemoveAll(home)
		return fmt.Errorf("hand %s to %s: %w", home, lane, err)
	}
	return nil
}
