package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"thermite/controller/ledger"
	"thermite/internal/copytree"
	"thermite/internal/lanefs"
	"thermite/internal/rpc"
)

// LaneFSArg is the hidden subcommand of the per-trial file helper.
const LaneFSArg = lanefs.Arg

// trialRT is what an open trial holds while it runs: its file helper and
// its API accounting.
type trialRT struct {
	checking atomic.Bool // a disk check of it runs
	// The file helper and its change count at the last good disk measure.
	measuredFS      *lanefs.Client
	measuredChanges uint64
	t               ledger.Trial
	fs              *lanefs.Client
	stopFS          func()
	inflight        atomic.Int64 // API requests in flight on its token
	recorded        atomic.Int64 // bytes of steps and notes recorded
	notes           atomic.Int64
	archived        atomic.Int64 // bytes its fetches archived (trial.fetch_archive_mb)
	agentEvents     atomic.Int64 // API calls and tunnels recorded or not (maxAgentEvents)
	mu              sync.Mutex
	// closing is set, and ctx cancelled, when the trial begins to end: no
	// request starts after it, and those in flight are cancelled, so no
	// command of the lane starts after its processes are stopped.
	closing atomic.Bool
	ctx     context.Context
	cancel  context.CancelFunc
	// life is the lock a trial's end takes; every effect of a request
	// (a note written, an event recorded, a file changed) holds it shared
	// and checks ended under it, so none lands after the end.
	life  sync.RWMutex
	ended bool
	// disk is the last measurement of its folders, and why it failed.
	disk       DiskState
	diskLogged time.Time
	// laneRun is set while a lane harness run holds its token (rt.mu):
	// one runs at a time (grantLaneRun).
	laneRun bool
}

// DiskState is what the watcher last found of a trial's folders.
type DiskState struct {
	Bytes   int64     `json:"bytes"`
	Checked time.Time `json:"checked,omitzero"`
	// Error is why the last measurement failed: the rig's failure, not the
	// lane's, retried every disk_check; Since is when the failures began.
	Error    string    `json:"error,omitempty"`
	Since    time.Time `json:"since,omitzero"`
	Failures int       `json:"failures,omitempty"`
	// IntervalMS is the real time between its last two measurements; more
	// than twice disk_check is shown as an alert, never silently.
	IntervalMS int64 `json:"interval_ms,omitempty"`
	// Reused says the last check walked nothing: no command of the lane
	// or agent ran and its file helper changed nothing since the walk
	// before, so that walk's figure still held.
	Reused bool `json:"reused,omitempty"`
}

// effect decides whether a request of the trial may still act: it runs f
// while the trial is open, under the lock its end takes, and reports
// whether it ran. A request authenticated before the end, whose body
// arrives after it, acts on nothing.
func (rt *trialRT) effect(f func()) bool {
	rt.life.RLock()
	defer rt.life.RUnlock()
	if rt.ended {
		return false
	}
	f()
	return true
}

func newTrialRT(t ledger.Trial) *trialRT {
	rt := &trialRT{t: t}
	rt.ctx, rt.cancel = context.WithCancel(context.Background())
	return rt
}

// within is ctx, cancelled also when the trial begins to end.
func (rt *trialRT) within(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(rt.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

var runName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`) })

func randomID(prefix string, n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

func (c *Controller) trialDir(id string) string {
	return filepath.Join(c.cfg.ScratchDir(), "trials", id)
}

func (c *Controller) info(t ledger.Trial) TrialInfo {
	i := TrialInfo{
		ID: t.ID, Run: t.Run, Lane: t.Lane, Workspace: t.Workspace, AgentDir: t.AgentDir,
		TokenFile: filepath.Join(t.AgentDir, "token"), ResearchDir: t.ResearchDir,
		LaneArea:  filepath.Join(t.ResearchDir, "lanes", fmt.Sprintf("lane-%d", t.Lane)),
		APISocket: c.cfg.RoleAPISocket(fmt.Sprintf("agent-%d", t.Lane)),
	}
	return i
}

// StartTrial makes a trial for a lane: a fresh copy of the project owned by
// the lane's user, the agent's folder with the trial's details and token
// owned by the agent's user, the lane's research area, the record, and the
// lane's file helper. Anything that fails undoes what was done.
func (c *Controller) StartTrial(req StartRequest) (TrialInfo, error) {
	lane, project, run := req.Lane, req.Project, req.Run
	if lane < 1 || lane > c.cfg.Lanes {
		return TrialInfo{}, fmt.Errorf("trial: lane %d is out of range 1..%d", lane, c.cfg.Lanes)
	}
	if run == "" {
		run = "default"
	}
	if !runName().MatchString(run) {
		return TrialInfo{}, fmt.Errorf("trial: run %q is not a run name (a-z, 0-9, . _ -, at most 64)", run)
	}
	if err := c.importedProject(project); err != nil {
		return TrialInfo{}, err
	}
	if t, open, err := c.ledger.OpenTrialOnLane(lane); err != nil {
		return TrialInfo{}, err
	} else if open {
		return TrialInfo{}, fmt.Errorf("trial: lane %d already has an open trial, %s", lane, t.ID)
	}
	laneRole, _ := c.table.Lane(lane)
	agentRole, _ := c.table.Agent(lane)
	// Nothing of an earlier trial on this lane lives on into this one.
	for _, r := range []string{laneRole.Name, agentRole.Name} {
		if _, err := c.broker.stopUser(r); err != nil {
			return TrialInfo{}, fmt.Errorf("trial: %w", err)
		}
	}
	id := randomID("t", 8)
	dir := c.trialDir(id)
	var undo []func()
	ok := false
	defer func() {
		if !ok {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	if err := os.Mkdir(dir, 0o700); err != nil {
		return TrialInfo{}, fmt.Errorf("trial: %w", err)
	}
	undo = append(undo, func() { c.removeTrialDir(dir) })
	// Closed to every role but this lane and its agent before anything is
	// in it: whatever the lane opens inside, no other role passes.
	if err := c.broker.trialFolder(dir, laneRole.Name); err != nil {
		return TrialInfo{}, fmt.Errorf("trial: %w", err)
	}
	ws := filepath.Join(dir, "workspace")
	var st copytree.Stats
	if req.LaneOwned {
		// The one copy was the import: moved into place, its top handed.
		if err := os.Rename(project, ws); err != nil {
			return TrialInfo{}, fmt.Errorf("trial: move the imported project into the workspace (the controller's folder and scratch must be on one file system): %w", err)
		}
		if err := c.broker.handTop(ws, laneRole.Name); err != nil {
			return TrialInfo{}, fmt.Errorf("trial: workspace: %w", err)
		}
	} else {
		var err error
		st, err = copytree.Copy(project, ws, copytree.Options{UID: -1, GID: -1})
		if err != nil {
			return TrialInfo{}, fmt.Errorf("trial: %w", err)
		}
		if err := c.broker.handFolder(ws, laneRole.Name, 0o700, false); err != nil {
			return TrialInfo{}, fmt.Errorf("trial: workspace: %w", err)
		}
	}
	research, err := c.researchRun(run)
	if err != nil {
		return TrialInfo{}, err
	}
	area := filepath.Join(research, "lanes", laneRole.Name)
	if err := os.Mkdir(area, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return TrialInfo{}, fmt.Errorf("trial: research area: %w", err)
	}
	if err := c.broker.handArea(area, laneRole.Name); err != nil {
		return TrialInfo{}, fmt.Errorf("trial: research area: %w", err)
	}
	undo = append(undo, func() { c.broker.publish(area) })
	token := randomID("", 32)
	keyID, secret := decoyPair()
	t := ledger.Trial{
		ID: id, Run: run, Lane: lane, Workspace: ws, AgentDir: filepath.Join(dir, "agent"), ResearchDir: research,
		TokenHash: ledger.HashToken(token), State: "open", Started: time.Now().UTC(),
		DecoyKeyID: keyID, DecoySecret: secret,
	}
	info := c.info(t)
	if err := os.Mkdir(t.AgentDir, 0o700); err != nil {
		return TrialInfo{}, fmt.Errorf("trial: %w", err)
	}
	details, _ := json.MarshalIndent(info, "", "  ")
	if err := os.WriteFile(filepath.Join(t.AgentDir, "trial.json"), append(details, '\n'), 0o600); err != nil {
		return TrialInfo{}, fmt.Errorf("trial: %w", err)
	}
	if err := os.WriteFile(info.TokenFile, []byte(token+"\n"), 0o600); err != nil {
		return TrialInfo{}, fmt.Errorf("trial: %w", err)
	}
	if err := c.writeAgentHome(t.AgentDir); err != nil {
		return TrialInfo{}, fmt.Errorf("trial: %w", err)
	}
	if err := c.broker.handFolder(t.AgentDir, agentRole.Name, 0o700, false); err != nil {
		return TrialInfo{}, fmt.Errorf("trial: agent folder: %w", err)
	}
	if err := c.ledger.StartTrial(t); err != nil {
		return TrialInfo{}, err
	}
	undo = append(undo, func() { c.ledger.EndTrial(id, "start failed", time.Now().UTC()) })
	rt := newTrialRT(t)
	if err := c.startLaneFS(rt); err != nil {
		return TrialInfo{}, err
	}
	c.mu.Lock()
	c.trials[id] = rt
	c.mu.Unlock()
	ok = true
	c.event("trial.start", t, map[string]any{"lane": lane, "files": st.Files, "bytes": st.Bytes, "reflinked": st.Reflinked})
	c.log.Info("trial started", "trial", id, "lane", lane, "run", run, "files", st.Files, "reflinked", st.Reflinked)
	return info, nil
}

// importedProject checks that a project is one of the controller's own
// copies: the operator's command imports it first.
func (c *Controller) importedProject(p string) error {
	root := filepath.Join(c.cfg.ControllerDir(), "projects") + "/"
	if !strings.HasPrefix(filepath.Clean(p)+"/", root) || filepath.Clean(p)+"/" == root {
		return fmt.Errorf("trial: project %s is not one of the controller's imported projects", p)
	}
	st, err := os.Lstat(p)
	if err != nil || !st.IsDir() {
		return fmt.Errorf("trial: project %s: not a folder", p)
	}
	return nil
}

// researchRun makes the run's research folder, written by the controller
// alone: pages, notes, and the lanes' areas.
func (c *Controller) researchRun(run string) (string, error) {
	dir := filepath.Join(c.cfg.ResearchDir(), run)
	for _, d := range []string{dir, filepath.Join(dir, "pages"), filepath.Join(dir, "notes"), filepath.Join(dir, "lanes")} {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("research: %w", err)
		}
	}
	if _, ok, _ := c.ledger.Run(run); !ok {
		c.ledger.PutRun(ledger.Run{ID: run, Created: time.Now().UTC()})
	}
	return dir, nil
}

// startLaneFS starts the trial's file helper: `thermite __lanefs` as the
// lane's user, in its workspace, with the run's research folder as a
// second, read-only root, speaking over a socketpair. When it dies while
// the trial is open (a forced self-test stops every role's processes), a
// new one takes its place.
func (c *Controller) startLaneFS(rt *trialRT) error {
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for attempt := 0; ctx.Err() == nil; attempt++ {
			mine, exited, err := c.launchLaneFS(ctx, rt)
			if attempt == 0 {
				first <- err
			}
			if err != nil {
				if attempt == 0 {
					return
				}
				c.log.Error("lane file helper did not start", "trial", rt.t.ID, "err", err)
			} else {
				<-exited
				mine.Close()
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
			c.log.Warn("lane file helper ended; starting another", "trial", rt.t.ID)
		}
	}()
	if err := <-first; err != nil {
		cancel()
		<-done
		return err
	}
	rt.stopFS = func() {
		cancel()
		rt.mu.Lock()
		if rt.fs != nil {
			rt.fs.Close()
		}
		rt.mu.Unlock()
		<-done
	}
	return nil
}

// launchLaneFS starts one file helper and installs its client.
func (c *Controller) launchLaneFS(ctx context.Context, rt *trialRT) (*os.File, <-chan struct{}, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("trial: helper: %w", err)
	}
	mine := os.NewFile(uintptr(fds[0]), "lanefs")
	theirs := os.NewFile(uintptr(fds[1]), "lanefs-helper")
	laneRole, _ := c.table.Lane(rt.t.Lane)
	req := &rpc.RunRequest{
		Role: laneRole.Name, Argv: []string{"/proc/self/exe", LaneFSArg, rt.t.Workspace, rt.t.ResearchDir},
		Cwd: rt.t.Workspace, NoTimeout: true, Env: trialEnv(rt.t),
	}
	exited := make(chan struct{})
	sent := make(chan error, 2)
	go func() {
		defer close(exited)
		defer theirs.Close()
		// Once the broker holds its copy, ours of the helper's end goes, so
		// that the helper's exit closes the connection.
		_, err := c.broker.run(ctx, req, []*os.File{theirs, theirs, c.devnull}, func() { theirs.Close(); sent <- nil })
		sent <- err
		if err != nil && ctx.Err() == nil {
			c.log.Warn("lane file helper ended", "trial", rt.t.ID, "err", err)
		}
	}()
	if err := <-sent; err != nil {
		mine.Close()
		return nil, nil, fmt.Errorf("trial: helper: %w", err)
	}
	rt.mu.Lock()
	rt.fs = lanefs.NewClient(mine)
	rt.mu.Unlock()
	return mine, exited, nil
}

// files is the trial's current file helper client.
func (rt *trialRT) files() *lanefs.Client {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.fs
}

// EndTrial ends a trial: its token stops working at once, the lane's and
// the agent's processes stop, set-id bits go, the lane's research area is
// published read-only, and the end is recorded.
func (c *Controller) EndTrial(id, reason string) error {
	t, ok, err := c.ledger.Trial(id)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("trial: no trial %s", id)
	}
	if t.State != "open" {
		return fmt.Errorf("trial: %s already ended (%s)", id, t.EndReason)
	}
	if reason == "" {
		reason = "ended"
	}
	c.mu.Lock()
	rt := c.trials[id]
	delete(c.trials, id)
	if c.ending == nil {
		c.ending = map[string]bool{}
	}
	c.ending[id] = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.ending, id)
		c.mu.Unlock()
	}()
	if rt != nil {
		// No request starts after this, and those in flight are cancelled
		// (a body still arriving is cut short), so that they end before
		// the lane's processes are stopped.
		rt.closing.Store(true)
		rt.cancel()
		for deadline := time.Now().Add(10 * time.Second); rt.inflight.Load() > 0 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		if rt.stopFS != nil {
			rt.stopFS()
		}
		// The end itself: from here no effect of any request of the
		// trial, however far it got, lands.
		rt.life.Lock()
		rt.ended = true
	}
	err = c.ledger.EndTrial(id, reason, time.Now().UTC())
	if rt != nil {
		rt.life.Unlock()
	}
	if err != nil {
		return err
	}
	laneRole, _ := c.table.Lane(t.Lane)
	agentRole, _ := c.table.Agent(t.Lane)
	var errs []error
	stopped := 0
	for _, r := range []string{laneRole.Name, agentRole.Name} {
		n, err := c.broker.stopUser(r)
		stopped += n
		errs = append(errs, err)
	}
	// The one walk of its end: what its folders hold, for the ledger and
	// for what the rig keeps of ended trials.
	if n, err := c.measure(t.Lane); err == nil {
		t.DiskBytes = n
		errs = append(errs, c.ledger.SetTrialDisk(id, n))
	} else if rt != nil {
		t.DiskBytes = rt.t.DiskBytes
	}
	// The research area is published (a walk that also clears set-id
	// bits); the workspace and agent folder are not walked again: the
	// trial's folder becomes root's alone in one step, out of every
	// role's reach, and is removed when the rig keeps it no longer.
	area := filepath.Join(t.ResearchDir, "lanes", laneRole.Name)
	removed, perr := c.broker.publish(area)
	errs = append(errs, perr, c.retireTrial(t))
	data := map[string]any{"reason": reason, "processes_stopped": stopped, "disk_bytes": t.DiskBytes}
	if len(removed) > 0 {
		// What every role could have opened and been held by (a FIFO) or
		// reached (a socket) is not published: the end says what went.
		data["research_removed"] = removed
	}
	if rt != nil {
		data["events_unrecorded"] = rt.unrecordedEvents()
	}
	c.event("trial.end", t, data)
	c.log.Info("trial ended", "trial", id, "reason", reason, "processes_stopped", stopped)
	return errors.Join(errs...)
}

// removeTrialDir undoes a trial folder a failed start left: hand back what
// was handed, then remove it.
func (c *Controller) removeTrialDir(dir string) {
	// The broker removes it whoever owns what is in it; where it cannot
	// (a role's process still runs), it is handed back and removed here.
	if _, err := c.broker.retire(dir, true); err == nil {
		return
	}
	for _, sub := range []string{"workspace", "agent"} {
		p := filepath.Join(dir, sub)
		if _, err := os.Lstat(p); err == nil {
			c.broker.handFolder(p, "thermite", 0o700, false)
		}
	}
	os.RemoveAll(dir)
}

// resumeTrials picks up the trials the ledger holds open: those whose
// workspace still exists get a new file helper (the broker stopped every
// role's process when the last controller ended); the others are ended.
func (c *Controller) resumeTrials() {
	ts, err := c.ledger.Trials()
	if err != nil {
		c.log.Error("resume trials", "err", err)
		return
	}
	for _, t := range ts {
		if t.State != "open" {
			continue
		}
		if _, err := os.Lstat(t.Workspace); err != nil {
			const why = "its workspace is gone: the rig restarted"
			if c.ledger.EndTrial(t.ID, why, time.Now().UTC()) == nil {
				c.event("trial.end", t, map[string]any{"reason": why})
			}
			c.log.Warn("trial ended at resume", "trial", t.ID, "why", "workspace gone")
			continue
		}
		rt := newTrialRT(t)
		if err := c.startLaneFS(rt); err != nil {
			c.log.Error("resume trial", "trial", t.ID, "err", err)
			continue
		}
		c.mu.Lock()
		c.trials[t.ID] = rt
		c.mu.Unlock()
		c.log.Info("trial resumed", "trial", t.ID)
	}
}

func (c *Controller) event(kind string, t ledger.Trial, data any) {
	raw, _ := json.Marshal(data)
	if _, err := c.ledger.AddEvent(ledger.Event{At: time.Now().UTC(), Kind: kind, Trial: t.ID, Run: t.Run, Data: raw}); err != nil {
		c.log.Error("event", "kind", kind, "err", err)
		return
	}
	c.newEvent.ring()
}

// trial finds an open trial's runtime.
func (c *Controller) trial(id string) (*trialRT, error) {
	c.mu.Lock()
	rt := c.trials[id]
	c.mu.Unlock()
	if rt == nil {
		if t, ok, _ := c.ledger.Trial(id); ok {
			return nil, fmt.Errorf("trial: %s ended (%s)", id, t.EndReason)
		}
		return nil, fmt.Errorf("trial: no trial %s", id)
	}
	return rt, nil
}
