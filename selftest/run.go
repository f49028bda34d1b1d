package selftest

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"thermite/fence"
	"thermite/internal/config"
	"thermite/internal/cpuset"
	"thermite/internal/procs"
	"thermite/internal/rpc"
	"thermite/roles"
)

// Host is what the self-test needs from the broker: the rig, and running
// a probe as a role through the very path a real command of that role
// takes.
type Host interface {
	Config() config.Config
	Table() *roles.Table
	BrokerPID() int
	ControllerPID() int
	SecretValues() map[string]string
	EnvAllowed() []string
	LandlockABI() int
	RunProbe(role roles.Role, gpus []int, stdin []byte) (stdout, stderr []byte, res *rpc.RunResult, err error)
	// RunControllerProbe runs the probe confined exactly as the controller
	// daemon is.
	RunControllerProbe(stdin []byte) (stdout, stderr []byte, res *rpc.RunResult, err error)
	// ControllerCgroup is the controller daemon's cgroup ("" without one).
	ControllerCgroup() (tail string, dirs []string, memoryBytes, pids int64)
	StartCanary(role roles.Role, gpus []int) (pid int, stop func(), err error)
	StopUser(role roles.Role) (int, error)
	HandFolder(req *rpc.HandFolderRequest) (*rpc.HandFolderResult, error)
	RunFolder(req *rpc.RunFolderRequest) error
	TrialFolder(req *rpc.TrialFolderRequest) error
	// MeasureDisk is a role's disk check as a trial's runs it, less what
	// its processes hold unlinked, and a full walk of the same folders.
	MeasureDisk(role roles.Role) (counted, walked int64, err error)
	// HoldAsTimedRun holds a timing user's judge CPUs (and cards) as a
	// timed run does, until release is called.
	HoldAsTimedRun(role roles.Role, cards []int) (cpus string, release func(), err error)
	// JudgeCPUsWhy says why judge CPUs cannot be held in the kernel here
	// (timed runs are then refused), "" when they can.
	JudgeCPUsWhy() string
	GPULayout() *fence.Layout
	APIPort() int
	CgroupOf(role roles.Role) string
	ControlKeySHA256() string
	CgroupStatus() string
	// CPUWeights are the CPU weights the kernel holds for the rig's groups
	// made so far, by group (a role's name, or the controller daemon's
	// group), on cgroup v2's scale; and the broker's status of them, "on:
	// ..." or "off: <why>".
	CPUWeights() (weights map[string]int64, status string, err error)
	// Without names the protections the operator accepted losing on this
	// host (host.accept_lost), each with why it is missing.
	Without() []string
}

// Sentence is the verdict, worded as the seed words it. Protections the
// host lacks and the operator accepted are named: never a plain "holds"
// on a rig that runs with less.
func Sentence(holds bool, roles int, failures, without []string) string {
	if !holds {
		return "isolation does NOT hold: " + strings.Join(failures, "; ")
	}
	if len(without) > 0 {
		return fmt.Sprintf("isolation holds, without: %s; every other probe of %d roles came out as it must", strings.Join(without, ", "), roles)
	}
	return fmt.Sprintf("isolation holds: every probe of %d roles came out as it must", roles)
}

// Parallel is how many probes run at once, each as a different user:
// twice the CPUs, for a probe's time is half its start and half waits on
// the broker, at least 4 and at most 16.
var Parallel = min(16, max(4, 2*runtime.NumCPU()))

// verdict gathers the rows from probes that run side by side.
type verdict struct {
	mu       sync.Mutex
	res      *rpc.SelftestResult
	failures []string
}

// record adds a probe's judged rows.
func (v *verdict) record(rows []rpc.Probe) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, p := range rows {
		v.res.Probes = append(v.res.Probes, p)
		if !p.OK {
			v.failures = append(v.failures, fmt.Sprintf("%s %s: %s (want %s)", p.Role, p.Attempt, p.Got, p.Expect))
		}
	}
}

// fail adds a row of the rig's own that did not come out as it must.
func (v *verdict) fail(role, attempt, expect, got string) {
	v.record([]rpc.Probe{{Role: role, Attempt: attempt, Expect: expect, Got: got}})
}

// Run runs the whole self-test: canaries where real targets do not exist
// yet, a probe as every role, the rig's own checks, and the verdict.
func Run(h Host) *rpc.SelftestResult {
	start := time.Now()
	v := &verdict{res: &rpc.SelftestResult{At: start.UTC().Format(time.RFC3339), LandlockV: h.LandlockABI()}}
	res, record, fail := v.res, v.record, v.fail
	c := newContext(h)
	var undo []func()
	defer func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}()
	setUp(h, c, &undo, fail)
	canaryPhases(h, c, record, fail)
	// The controller daemon, confined as it runs, tries what a flaw in its
	// parsing would try.
	record(probeRows(c, c.Table.Controller(), DaemonLabel, DaemonRows, func(plan []Attempt) ([]Outcome, string) {
		return runControllerProbe(h, plan)
	}, nil))
	egressPhase(h, c, record, fail)
	heldPhase(h, c, record, fail)
	diskPhase(h, c, record, fail)
	startsPhase(h, c, record)
	// Where no writable cgroup tree exists the rig runs on rlimits alone:
	// the self-test says so, in its own row.
	if cg := h.CgroupStatus(); strings.HasPrefix(cg, "none") {
		record([]rpc.Probe{{Role: "rig", Attempt: "per-role cgroups", Expect: "in force, or said", Got: cg, OK: true}})
	} else {
		record([]rpc.Probe{{Role: "rig", Attempt: "per-role cgroups", Expect: "in force, or said", Got: "in force: " + cg, OK: true}})
	}
	// Every role's group is made by now (newContext), the controller's
	// too (setUp).
	c.CPUWeights, res.CPUWeights, c.CPUWeightsErr = h.CPUWeights()
	c.CPUWeightsStatus = res.CPUWeights
	for _, rc := range RigChecks {
		if got := rc.Check(c); strings.HasPrefix(got, Off) {
			record([]rpc.Probe{{Role: "rig", Attempt: rc.Attempt, Expect: "holds, or off and said", Got: got, OK: true}})
		} else if got != "" {
			fail("rig", rc.Attempt, "holds", got)
		} else {
			record([]rpc.Probe{{Role: "rig", Attempt: rc.Attempt, Expect: "holds", Got: "holds", OK: true}})
		}
	}
	sort.SliceStable(res.Probes, func(i, j int) bool { return roleOrder(c, res.Probes[i].Role) < roleOrder(c, res.Probes[j].Role) })
	res.Roles = len(c.Table.Roles)
	res.Holds = len(v.failures) == 0
	res.Sentence = Sentence(res.Holds, res.Roles, v.failures, h.Without())
	if strings.HasPrefix(res.CPUWeights, Off) {
		// Not isolation, so not the verdict's; but never a verdict that
		// reads as if the rig's own work kept its CPU under a flood.
		res.Sentence += "; CPU weights " + res.CPUWeights
	}
	res.WallMS = time.Since(start).Milliseconds()
	return res
}

// newContext is what the probes' rows are made from: the rig as the host
// gives it, before any canary is placed.
func newContext(h Host) *Context {
	c := &Context{
		Cfg: h.Config(), Table: h.Table(), BrokerPID: h.BrokerPID(),
		OtherPID: map[string]int{}, Workspace: map[int]string{}, RunKit: map[int]string{}, RunOut: map[int]string{},
		RunDir: map[int]string{}, RunBuild: map[int]string{},
		AgentDir: map[int]string{}, LaneArea: map[int]string{}, OpenedByLane: map[int]string{},
		EnvAllowed: map[string]bool{}, Given: map[string][]int{}, Lost: map[string]bool{},
	}
	for _, w := range h.Without() {
		name, _, _ := strings.Cut(w, " ")
		c.Lost[name] = true
	}
	c.GPU = h.GPULayout()
	c.LandlockABI = h.LandlockABI()
	c.ProcHidden = ProcHidesOthers("/proc")
	if online, err := cpuset.Online(); err == nil {
		c.Online = online.String()
	}
	if st, err := procs.Status("/proc/self/status"); err == nil {
		c.BrokerCapBnd = st["CapBnd"]
	}
	givenCards(c)
	c.APIPort = h.APIPort()
	c.ControlKeySHA = h.ControlKeySHA256()
	c.Network, c.Cgroup = roleNetworks{}, map[string]string{}
	for _, r := range c.Table.Roles {
		pol, _ := roles.PolicyFor(r, c.Cfg.Network, c.Cfg.Perf)
		c.Network[r.Name] = networkOf(c, r, pol)
		c.Cgroup[r.Name] = h.CgroupOf(r)
	}
	for _, n := range h.EnvAllowed() {
		c.EnvAllowed[n] = true
	}
	for _, v := range h.SecretValues() {
		if v != "" {
			c.SecretValues = append(c.SecretValues, v)
		}
	}
	return c
}

// setUp places the canaries and leftovers the probes aim at (undo removes
// them) and finds the controller, or starts a canary as its user.
func setUp(h Host, c *Context, undo *[]func(), fail func(role, attempt, expect, got string)) {
	if err := placeCanaries(h, c, undo); err != nil {
		fail("rig", "place canary targets", "placed", err.Error())
	}
	if err := placeLeftovers(h, c, undo); err != nil {
		fail("rig", "leave SysV IPC objects and set-id files for the probes", "left", err.Error())
	}
	if err := listenCanaries(c, undo); err != nil {
		fail("rig", "listen on a canary socket", "listening", err.Error())
	}
	if err := listenEgressCanary(c, undo); err != nil {
		fail("rig", "listen on a canary socket", "listening", err.Error())
	}
	c.ControllerPID = h.ControllerPID()
	c.LiveController = c.ControllerPID
	c.CtlCgroup, c.CtlCgroupDirs, c.CtlMemory, c.CtlPids = h.ControllerCgroup()
	if c.ControllerPID == 0 {
		pid, stop, err := h.StartCanary(c.Table.Controller(), nil)
		if err != nil {
			fail("rig", "start a canary process as the controller's user", "started", err.Error())
		} else {
			c.ControllerPID = pid
			*undo = append(*undo, stop)
		}
	}
}

// canaryPhases probes every role, beside a canary of another role to aim
// at. Two phases, so no probe's clean-up stops the canary it targets: a
// canary as planner for every role but the planner, then one as
// model-check for the planner. Probes of different roles run side by
// side; timing users' probes hold the judge CPUs (and cards) as a timed
// run does, so they run alone, after the others.
func canaryPhases(h Host, c *Context, record func([]rpc.Probe), fail func(role, attempt, expect, got string)) {
	var first, second []roles.Role
	for _, r := range c.Table.Roles {
		if r.Name == "planner" {
			second = append(second, r)
		} else {
			first = append(first, r)
		}
	}
	for _, phase := range []struct {
		canary string
		probes []roles.Role
	}{{"planner", first}, {"model-check", second}} {
		cr, _ := c.Table.Role(phase.canary)
		pid, stop, err := h.StartCanary(cr, nil)
		if err != nil {
			fail("rig", "start a canary process as "+phase.canary, "started", err.Error())
			continue
		}
		var timing, rest []roles.Role
		for _, r := range phase.probes {
			c.OtherPID[r.Name] = pid
			if r.Kind == roles.Timing {
				timing = append(timing, r)
			} else {
				rest = append(rest, r)
			}
		}
		sideBySide(rest, func(r roles.Role) { record(probeRole(h, c, r)) })
		for _, r := range timing {
			record(probeTiming(h, c, r))
		}
		stop()
	}
}

// probeTiming probes a timing user, or says why its timed runs are
// refused and it has nothing to probe.
func probeTiming(h Host, c *Context, r roles.Role) []rpc.Probe {
	// A card without judge CPUs of its own has its timed runs refused; its
	// timing user runs nothing to probe.
	if _, err := c.Cfg.JudgeCPUsOf(r.Index - 1); err != nil {
		return []rpc.Probe{{Role: r.Name, Attempt: "timed runs on its card", Expect: "judge CPUs of its own, or refused", Got: "refused: " + err.Error(), OK: true}}
	}
	if why := h.JudgeCPUsWhy(); why != "" {
		return []rpc.Probe{{Role: r.Name, Attempt: "timed runs on its card", Expect: "judge CPUs held in the kernel, or refused", Got: "refused: " + why, OK: true}}
	}
	return probeRole(h, c, r)
}

// sideBySide runs probe for each of rs, Parallel at a time, and returns
// once every one has. Each role is its own user, with its own folders and
// limits, and every probe is stopped by its own role's StopUser alone, so
// probes of different roles do not reach each other.
func sideBySide(rs []roles.Role, probe func(roles.Role)) {
	work := make(chan roles.Role)
	var wg sync.WaitGroup
	for range min(Parallel, len(rs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range work {
				probe(r)
			}
		}()
	}
	for _, r := range rs {
		work <- r
	}
	close(work)
	wg.Wait()
}

func roleOrder(c *Context, name string) int {
	for i, r := range c.Table.Roles {
		if r.Name == name {
			return i
		}
	}
	return len(c.Table.Roles)
}

// probeRole runs one role's probe and judges every row against it. A row
// marked Alone gets a probe process of its own, so that whatever its
// attempt does to that process (the broker kills a process that made it
// its tracer) costs no other row its answer. A role's probe processes run
// one after another (the broker's clean-up after each, the set-id sweep of
// the role's folders, would reach a sibling's targets), and its user is
// stopped once they all have.
func probeRole(h Host, c *Context, r roles.Role) []rpc.Probe {
	return probeRows(c, r, r.Name, Policy, func(plan []Attempt) ([]Outcome, string) {
		return runProbe(h, c, r, plan)
	}, func() { stopRole(h, r) })
}

// probeRows plans the rows of table that apply to r, runs them with run
// (the rows marked Alone each in a probe of their own, one after
// another), calls settle (where set) once every run has answered, and
// judges every outcome, naming who as the prober.
func probeRows(c *Context, r roles.Role, who string, table []Row, run func(plan []Attempt) ([]Outcome, string), settle func()) []rpc.Probe {
	type planned struct {
		row     *Row
		attempt Attempt
	}
	var plan []Attempt
	var alone [][]Attempt
	var rows []planned
	for i := range table {
		row := &table[i]
		if (row.Who != nil && !row.Who(r)) || row.Held != c.Holding || row.Starts != c.Starting {
			continue
		}
		for k, a := range row.Make(c, r) {
			a.ID = fmt.Sprintf("%d.%d", i, k)
			if row.Alone {
				alone = append(alone, []Attempt{a})
			} else {
				plan = append(plan, a)
			}
			rows = append(rows, planned{row, a})
		}
	}
	byID := map[string]Outcome{}
	failedRun := map[string]string{} // attempt ID -> why its probe gave no answer
	for i, p := range append([][]Attempt{plan}, alone...) {
		outs, why := run(p)
		if why != "" && i == 0 {
			failedRun[""] = why
			break
		}
		for _, a := range p {
			failedRun[a.ID] = why
		}
		for _, o := range outs {
			byID[o.ID] = o
		}
	}
	if settle != nil {
		settle()
	}
	if why := failedRun[""]; why != "" {
		return []rpc.Probe{{Role: who, Attempt: "run its probe", Expect: "ran", Got: why}}
	}
	var out []rpc.Probe
	for _, p := range rows {
		o, ok := byID[p.attempt.ID]
		label := p.row.Attempt
		if p.attempt.Path != "" {
			label += " (" + p.attempt.Path + ")"
		} else if p.attempt.PID != 0 {
			label += fmt.Sprintf(" (pid %d)", p.attempt.PID)
		}
		want := p.row.Want
		if p.row.WantFor != nil {
			want = p.row.WantFor(c, r)
		}
		row := rpc.Probe{Role: who, Attempt: label, Expect: strings.Join(want, " or ")}
		if !ok {
			row.Got = "no answer from the probe"
			if why := failedRun[p.attempt.ID]; why != "" {
				row.Got += ": " + why
			}
			out = append(out, row)
			continue
		}
		row.Got = o.Got
		row.OK = contains(want, o.Got)
		wantMet := row.OK
		if row.OK && p.row.Check != nil {
			if bad := p.row.Check(c, r, o); bad != "" {
				row.OK, row.Got = false, bad
			}
		}
		if !row.OK && p.row.Lost != "" && c.Lost[p.row.Lost] {
			// The operator accepted this host's lack of the protection the
			// row proves; the verdict names it, the row says what it saw.
			row.OK = true
			row.Got = fmt.Sprintf("%s: lost, accepted (host.accept_lost has %s)", row.Got, p.row.Lost)
		}
		if !row.OK && !wantMet && o.Got == "ENOENT" {
			row.Got = "ENOENT: the target was not there, so nothing was tried"
		}
		out = append(out, row)
	}
	return out
}

// runProbe runs one probe process with plan and reads its outcomes, or says
// why there are none. Its role's processes are left to stopRole.
func runProbe(h Host, c *Context, r roles.Role, plan []Attempt) ([]Outcome, string) {
	data, _ := json.Marshal(plan)
	cards := c.Given[r.Name]
	if c.Holding {
		// A held card is no other role's meanwhile: asking for it is refused.
		cards = nil
	}
	return probeOutcomes(h.RunProbe(r, cards, data))
}

// stopRole stops a role's processes once its probes have answered. A role
// whose user the broker stops after each command
// (roles.StopsAfterEachCommand: all but lanes) was stopped after every
// probe of it already, its HOME and TMPDIR emptied, and a stop that failed
// failed that probe's run; the controller's user is the controller
// itself, and is left alone.
func stopRole(h Host, r roles.Role) {
	if r.Kind != roles.Controller && !r.StopsAfterEachCommand() {
		h.StopUser(r)
	}
}

// runControllerProbe runs one probe confined as the controller daemon.
// Nothing is stopped after it: its user is the controller's.
func runControllerProbe(h Host, plan []Attempt) ([]Outcome, string) {
	data, _ := json.Marshal(plan)
	return probeOutcomes(h.RunControllerProbe(data))
}

// probeOutcomes reads a probe's answer, or says why there is none.
func probeOutcomes(stdout, stderr []byte, run *rpc.RunResult, err error) ([]Outcome, string) {
	if err != nil || run == nil || run.ExitCode != 0 {
		why := fmt.Sprintf("%v", err)
		if run != nil {
			why = fmt.Sprintf("%v, exit %d (%s), %s", err, run.ExitCode, run.Stopped, strings.TrimSpace(string(stderr)))
		}
		return nil, "the probe could not run: " + why
	}
	var outs []Outcome
	if err := json.Unmarshal(stdout, &outs); err != nil {
		return nil, "the probe's answer is unreadable: " + err.Error()
	}
	return outs, ""
}

// givenCards decides the cards each probe runs with, where the layout
// places them: a timing user its own card, lane N a development run on a
// card in turn; every other role none.
func givenCards(c *Context) {
	if c.GPU == nil || c.GPU.Refused != "" || len(c.GPU.Cards) == 0 {
		return
	}
	for card, role := range c.GPU.Timing {
		c.Given[role] = []int{card}
	}
	for _, r := range c.Table.Roles {
		if r.Kind == roles.Lane {
			c.Given[r.Name] = []int{c.GPU.Cards[(r.Index-1)%len(c.GPU.Cards)].Index}
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func randomName(prefix string) string {
	b := make([]byte, 8)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// placeCanaries puts a target where each real one lives, with the same
// owner and mode, when the real one does not exist yet. undo removes them.
// Each canary is placed in turn; a failed one does not stop the others,
// and every failure is returned.
func placeCanaries(h Host, c *Context, undo *[]func()) error {
	p := &canaryPlacer{h: h, c: c, undo: undo, state: c.Cfg.StateDir, ctl: c.Table.Controller()}
	for _, place := range canaries {
		place(p)
	}
	return errors.Join(p.errs...)
}

// canaries are placeCanaries' targets, one function each, in the order
// they are placed: later ones use the folders of earlier ones (the lanes'
// and agents' folders the trials folder, the timed runs the stored build).
var canaries = []func(*canaryPlacer){
	(*canaryPlacer).ledger,
	(*canaryPlacer).kit,
	(*canaryPlacer).secret,
	(*canaryPlacer).storedBuild,
	(*canaryPlacer).laneWorkspaces,
	(*canaryPlacer).buildDir,
	(*canaryPlacer).openDir,
	(*canaryPlacer).agentFolders,
	(*canaryPlacer).laneAreas,
	func(p *canaryPlacer) { p.c.EndedToken = endedToken(p.c) },
	(*canaryPlacer).timedRuns,
}

// canaryPlacer is what placing the canaries shares: the host, the context
// it fills, the undo list, the failures so far, and the folders that later
// canaries go into.
type canaryPlacer struct {
	h     Host
	c     *Context
	undo  *[]func()
	state string
	ctl   roles.Role
	errs  []error

	trialDirs      map[int]string // lane number -> its trial folder: its workspace and its agent's folder
	storedBuildDir string         // the stored build's folder, the timed runs' link
}

// file places a file at path and its removal in undo.
func (p *canaryPlacer) file(path string, uid, gid int, mode os.FileMode) error {
	if err := placeFile(p.state, path, uid, gid, mode); err != nil {
		return err
	}
	*p.undo = append(*p.undo, func() { removePlaced(p.state, path) })
	return nil
}

// dir places a folder at path and its removal in undo.
func (p *canaryPlacer) dir(path string, uid, gid int, mode os.FileMode) error {
	if err := placeDir(p.state, path, uid, gid, mode); err != nil {
		return err
	}
	*p.undo = append(*p.undo, func() { removePlaced(p.state, path) })
	return nil
}

// handBack puts in undo the handing of path back to the controller.
func (p *canaryPlacer) handBack(path string) {
	*p.undo = append(*p.undo, func() { p.h.HandFolder(&rpc.HandFolderRequest{Path: path, Role: p.ctl.Name}) })
}

// ledger: the ledger lives in the controller's folder.
func (p *canaryPlacer) ledger() {
	c, ctl := p.c, p.ctl
	c.Ledger = filepath.Join(c.Cfg.ControllerDir(), "ledger.db")
	if _, err := os.Lstat(c.Ledger); err != nil {
		p.errs = append(p.errs, p.file(c.Ledger, ctl.UID, ctl.GID, 0o600))
	}
}

// kit: the kits live in the controller's folder.
func (p *canaryPlacer) kit() {
	c, ctl := p.c, p.ctl
	kits := filepath.Join(c.Cfg.ControllerDir(), "kits")
	c.Kit = firstFile(kits, "kit.toml")
	if c.Kit == "" {
		if _, err := os.Lstat(kits); err != nil {
			p.errs = append(p.errs, p.dir(kits, ctl.UID, ctl.GID, 0o700))
		}
		k := filepath.Join(kits, randomName("selftest-"))
		p.errs = append(p.errs, p.dir(k, ctl.UID, ctl.GID, 0o700))
		c.Kit = filepath.Join(k, "kit.toml")
		p.errs = append(p.errs, p.file(c.Kit, ctl.UID, ctl.GID, 0o600))
	}
}

// secret: a real one if there is one, a canary beside them if the folder
// is empty, and on a rig with no secrets folder (a fresh machine, the
// embedded defaults) a canary in a root-only folder of the broker's that
// stands in for it: the property is the same, root's files stay root's.
// The self-test makes nothing outside the state dir.
func (p *canaryPlacer) secret() {
	c := p.c
	names, _ := readNames(c.Cfg.SecretsDir)
	_, noFolder := os.Lstat(c.Cfg.SecretsDir)
	switch {
	case len(names) > 0:
		c.Secret = filepath.Join(c.Cfg.SecretsDir, names[0])
	case noFolder == nil:
		c.Secret = filepath.Join(c.Cfg.SecretsDir, ".selftest-canary")
		p.errs = append(p.errs, p.file(c.Secret, 0, 0, 0o600))
	default:
		standIn := filepath.Join(c.Cfg.BrokerDir(), randomName("selftest-secrets-"))
		p.errs = append(p.errs, p.dir(standIn, 0, 0, 0o700))
		c.Secret = filepath.Join(standIn, "canary")
		p.errs = append(p.errs, p.file(c.Secret, 0, 0, 0o600))
	}
}

// storedBuild: read-only, reachable only by its exact path.
func (p *canaryPlacer) storedBuild() {
	c, ctl := p.c, p.ctl
	sb := filepath.Join(c.Cfg.StoreDir(), randomName("selftest-"))
	p.storedBuildDir = sb
	p.errs = append(p.errs, p.dir(sb, ctl.UID, ctl.GID, 0o700))
	c.StoredFile = filepath.Join(sb, "program")
	p.errs = append(p.errs, p.file(c.StoredFile, ctl.UID, ctl.GID, 0o555), os.Chmod(sb, 0o555))
}

// laneWorkspaces: a trial's folder for each lane, closed to every role
// but the lane and its agent as a trial's is (the broker's TrialFolder),
// holding the lane's workspace and a folder of the lane's that it opened
// to every role (0777), as a lane that chmods its workspace open would.
func (p *canaryPlacer) laneWorkspaces() {
	c, ctl := p.c, p.ctl
	base := randomName("selftest-")
	p.trialDirs = map[int]string{}
	for _, r := range c.Table.Roles {
		if r.Kind != roles.Lane {
			continue
		}
		dir := filepath.Join(c.Cfg.ScratchDir(), "trials", base+"-"+r.Name)
		if err := p.dir(dir, ctl.UID, ctl.GID, 0o700); err != nil {
			p.errs = append(p.errs, err)
			continue
		}
		if err := p.h.TrialFolder(&rpc.TrialFolderRequest{Path: dir, Lane: r.Name}); err != nil {
			p.errs = append(p.errs, err)
			continue
		}
		p.trialDirs[r.Index] = dir
		for _, f := range []struct {
			name string
			mode uint32
			into map[int]string
		}{{"workspace", 0o700, c.Workspace}, {"opened", 0o777, c.OpenedByLane}} {
			ws := filepath.Join(dir, f.name)
			if err := p.dir(ws, ctl.UID, ctl.GID, 0o700); err != nil {
				p.errs = append(p.errs, err)
				continue
			}
			if _, err := p.h.HandFolder(&rpc.HandFolderRequest{Path: ws, Role: r.Name, Mode: f.mode}); err != nil {
				p.errs = append(p.errs, err)
				continue
			}
			f.into[r.Index] = ws
			p.handBack(ws)
		}
	}
}

// buildDir: a build folder handed to the builder, as a build's is.
func (p *canaryPlacer) buildDir() {
	c, ctl := p.c, p.ctl
	builds := filepath.Join(c.Cfg.ScratchDir(), "builds", randomName("selftest-"))
	p.errs = append(p.errs, p.dir(builds, ctl.UID, ctl.GID, 0o711))
	c.BuildDir = filepath.Join(builds, "src")
	if err := p.dir(c.BuildDir, ctl.UID, ctl.GID, 0o700); err != nil {
		p.errs = append(p.errs, err)
	} else if _, err := p.h.HandFolder(&rpc.HandFolderRequest{Path: c.BuildDir, Role: "builder", Mode: 0o700}); err != nil {
		p.errs = append(p.errs, err)
	} else {
		p.handBack(c.BuildDir)
	}
}

// openDir: a folder whose mode lets everyone write: only the rule set
// keeps a role out of it.
func (p *canaryPlacer) openDir() {
	c := p.c
	c.OpenDir = filepath.Join(c.Cfg.ScratchDir(), randomName("selftest-open-"))
	p.errs = append(p.errs, p.dir(c.OpenDir, 0, 0, 0o777))
}

// agentFolders: an agent folder with a token for each agent, handed to it
// as a trial's is.
func (p *canaryPlacer) agentFolders() {
	c, ctl := p.c, p.ctl
	for _, r := range c.Table.Roles {
		if r.Kind != roles.Agent {
			continue
		}
		if p.trialDirs[r.Index] == "" {
			continue // its lane's trial folder was not placed: said there
		}
		ad := filepath.Join(p.trialDirs[r.Index], "agent")
		if err := p.dir(ad, ctl.UID, ctl.GID, 0o700); err != nil {
			p.errs = append(p.errs, err)
			continue
		}
		p.errs = append(p.errs, p.file(filepath.Join(ad, "token"), ctl.UID, ctl.GID, 0o600))
		if _, err := p.h.HandFolder(&rpc.HandFolderRequest{Path: ad, Role: r.Name, Mode: 0o700}); err != nil {
			p.errs = append(p.errs, err)
			continue
		}
		c.AgentDir[r.Index] = ad
		p.handBack(ad)
	}
}

// laneAreas: a research run with an area handed to each lane.
func (p *canaryPlacer) laneAreas() {
	c, ctl := p.c, p.ctl
	c.ResearchRun = filepath.Join(c.Cfg.ResearchDir(), randomName("selftest-"))
	p.errs = append(p.errs, p.dir(c.ResearchRun, ctl.UID, ctl.GID, 0o755))
	lanes := filepath.Join(c.ResearchRun, "lanes")
	p.errs = append(p.errs, p.dir(lanes, ctl.UID, ctl.GID, 0o755))
	for _, r := range c.Table.Roles {
		if r.Kind != roles.Lane {
			continue
		}
		area := filepath.Join(lanes, r.Name)
		if err := p.dir(area, ctl.UID, ctl.GID, 0o700); err != nil {
			p.errs = append(p.errs, err)
			continue
		}
		if _, err := p.h.HandFolder(&rpc.HandFolderRequest{Path: area, Role: r.Name, GroupTop: true}); err != nil {
			p.errs = append(p.errs, err)
			continue
		}
		c.LaneArea[r.Index] = area
		p.handBack(area)
	}
}

// timedRuns: a timed run's folder for each timing user, made as the judge
// makes one: the controller's, with a read-only kit copy, a link to the
// stored build and an out/ of the timing user's own, then opened to the
// timing user alone by the broker (the same request the judge makes).
func (p *canaryPlacer) timedRuns() {
	c, ctl := p.c, p.ctl
	for _, r := range c.Table.Roles {
		if r.Kind != roles.Timing {
			continue
		}
		run := filepath.Join(c.Cfg.ScratchDir(), "runs", randomName("selftest-"))
		if err := p.dir(run, ctl.UID, ctl.GID, 0o700); err != nil {
			p.errs = append(p.errs, err)
			continue
		}
		kit := filepath.Join(run, "kit")
		p.errs = append(p.errs, p.dir(kit, ctl.UID, ctl.GID, 0o755))
		c.RunKit[r.Index] = filepath.Join(kit, "input.txt")
		p.errs = append(p.errs, p.file(c.RunKit[r.Index], ctl.UID, ctl.GID, 0o444), os.Chmod(kit, 0o555))
		build := filepath.Join(run, "build")
		if err := placeSymlink(p.state, build, p.storedBuildDir, ctl.UID, ctl.GID); err != nil {
			p.errs = append(p.errs, err)
		} else {
			c.RunBuild[r.Index] = build
		}
		out := filepath.Join(run, "out")
		p.errs = append(p.errs, p.dir(out, ctl.UID, ctl.GID, 0o700))
		if _, err := p.h.HandFolder(&rpc.HandFolderRequest{Path: out, Role: r.Name, Mode: 0o700}); err != nil {
			p.errs = append(p.errs, err)
		}
		c.RunOut[r.Index] = out
		p.handBack(out)
		if err := p.h.RunFolder(&rpc.RunFolderRequest{Path: run, Role: r.Name}); err != nil {
			p.errs = append(p.errs, err)
			continue
		}
		c.RunDir[r.Index] = run
	}
}

// listenCanaries opens, for the probes to aim at, an abstract unix socket,
// a TCP port on loopback and, where the API has a TCP port, that port on
// another loopback address (what the API's port reaches beyond the API),
// each accepting and closing at once.
func listenCanaries(c *Context, undo *[]func()) error {
	c.Abstract = randomName("thermite-selftest-")
	var ls []net.Listener
	closeAll := func() {
		for _, l := range ls {
			l.Close()
		}
	}
	ul, err := net.Listen("unix", "@"+c.Abstract)
	if err != nil {
		return err
	}
	ls = append(ls, ul)
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		closeAll()
		return err
	}
	ls = append(ls, tl)
	c.TCPPort = tl.Addr().(*net.TCPAddr).Port
	if c.APIPort != 0 {
		// 127.0.0.0/8 is all loopback; the API listens on one address of it
		// (or on ::1), so a second one at its port is free.
		other := otherLoopback(c.Cfg.API.TCP, c.APIPort)
		ol, err := net.Listen("tcp4", other)
		if err != nil {
			closeAll()
			return fmt.Errorf("a canary on %s, the API's port on another loopback address: %w", other, err)
		}
		ls = append(ls, ol)
		c.OtherLoopback = other
	}
	for _, l := range ls {
		go func(l net.Listener) {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				conn.Close()
			}
		}(l)
	}
	*undo = append(*undo, closeAll)
	return nil
}

// otherLoopback is ADDRESS:PORT on a loopback address the API does not
// listen on (the API's listen address is apiTCP).
func otherLoopback(apiTCP string, port int) string {
	host, _, _ := net.SplitHostPort(apiTCP)
	addr := "127.0.0.2"
	if host == addr {
		addr = "127.0.0.3"
	}
	return net.JoinHostPort(addr, strconv.Itoa(port))
}

// endedToken finds the token of a trial that has ended: its trial folder
// is retired (root's, 0700) and its agent folder still holds the token,
// the agent's file.
func endedToken(c *Context) string {
	trials := filepath.Join(c.Cfg.ScratchDir(), "trials")
	ids, _ := readNames(trials)
	isAgent := func(uid int) bool {
		r, ok := c.Table.ByUID(uid)
		return ok && r.Kind == roles.Agent
	}
	for _, id := range ids {
		st, err := os.Lstat(filepath.Join(trials, id))
		if err != nil || !st.IsDir() || st.Sys().(*syscall.Stat_t).Uid != 0 || st.Mode().Perm() != 0o700 {
			continue
		}
		if tok, err := readToken(trials, filepath.Join(id, "agent", "token"), isAgent); err == nil && tok != "" {
			return tok
		}
	}
	return ""
}

func readNames(dir string) ([]string, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	sort.Strings(names)
	return names, err
}

// firstFile finds dir/*/name.
func firstFile(dir, name string) string {
	subs, _ := readNames(dir)
	for _, s := range subs {
		p := filepath.Join(dir, s, name)
		if st, err := os.Lstat(p); err == nil && st.Mode().IsRegular() {
			return p
		}
	}
	return ""
}

// heldPhase probes every role but the timing users while the first timing
// user holds its judge CPUs as a timed run does: the Held rows.
func heldPhase(h Host, c *Context, record func([]rpc.Probe), fail func(role, attempt, expect, got string)) {
	t, ok := c.Table.Timing(1)
	if !ok {
		return
	}
	if _, err := c.Cfg.JudgeCPUsOf(0); err != nil {
		return
	}
	if why := h.JudgeCPUsWhy(); why != "" {
		// Timed runs are refused here, so nothing is ever held: said.
		record([]rpc.Probe{{Role: "rig", Attempt: "judge CPUs held in the kernel during timed runs", Expect: "held, or timed runs refused", Got: "timed runs refused: " + why, OK: true}})
		return
	}
	// A development run on the card the timing user is about to hold: the
	// hold must stop it.
	if cards := c.Given[t.Name]; len(cards) > 0 {
		if lane, ok := c.Table.Lane(1); ok {
			pid, stop, err := h.StartCanary(lane, cards)
			if err != nil {
				fail("rig", "start a canary process as lane-1 with card "+strconv.Itoa(cards[0]), "started", err.Error())
			} else {
				c.CardCanaryPID = pid
				defer stop()
			}
		}
	}
	cpus, release, err := h.HoldAsTimedRun(t, c.Given[t.Name])
	if err != nil {
		fail("rig", "hold judge CPUs as a timed run does", "held", err.Error())
		return
	}
	defer release()
	c.HeldCPUs, c.Holding = cpus, true
	defer func() { c.Holding, c.CardCanaryPID = false, 0 }()
	var probed []roles.Role
	for _, r := range c.Table.Roles {
		if r.Kind != roles.Timing {
			probed = append(probed, r)
		}
	}
	sideBySide(probed, func(r roles.Role) { record(probeRole(h, c, r)) })
}
