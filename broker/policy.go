package broker

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"thermite/fence"
	"thermite/internal/cgroup"
	"thermite/internal/config"
	"thermite/internal/confined"
	"thermite/internal/cpuset"
	"thermite/internal/hostpolicy"
	"thermite/internal/landlock"
	"thermite/internal/lanefs"
	"thermite/internal/netpolicy"
	"thermite/internal/rpc"
	"thermite/internal/seccomp"
	"thermite/internal/spawn"
	"thermite/internal/weaken"
	"thermite/roles"
)

// This file is the one place that decides what a role's command may do.
// PlanRun is pure: it opens no file, takes no lock and makes no system
// call, so every decision is tested by plain table tests (policy_test.go).
// The broker takes a Snapshot under its locks, asks PlanRun, and carries
// the Plan out in carryOut (run.go): only there is anything opened, built
// or held.

// Snapshot is what the rig holds at the moment a command is planned.
type Snapshot struct {
	Online    cpuset.Set   // every CPU the broker may use
	JudgeCPUs cpuset.Set   // judge_cpus as the broker resolved it at start
	HeldCPUs  cpuset.Set   // judge CPUs timed runs hold now
	HeldCards map[int]bool // cards timed runs hold now
	// Layout is the GPU layout as last discovered; nil grants no card.
	Layout *fence.Layout
	// Handed are the folders handed to each role's uid (hand_folder).
	Handed map[int][]string
	// Kernel is what this kernel and cgroup tree give; the operator's
	// accepted losses are the configuration's host.accept_lost.
	Kernel hostpolicy.Host
	// Cgroups says a writable cgroup tree exists.
	Cgroups bool
	// CPUWeights says its groups carry the cpu controller, so that a
	// group's CPU weight holds in the kernel.
	CPUWeights bool
	// APIPort is the harness API's TCP port (only a weakened build uses it).
	APIPort int
	// Weakened are the switches a thermite_weaken test build was started
	// with; empty in every other build.
	Weakened map[string]bool
}

// Plan is everything one command of a role is: what it runs, as whom,
// where, with what, under which limits and confinement. The broker does
// exactly this and nothing else.
type Plan struct {
	Role roles.Role
	Argv []string
	Env  []string
	// Cwd is absolute and lexically inside scratch and none of another
	// role's places; carryOut opens it beneath scratch refusing symlinks.
	Cwd  string
	Home string
	// HomeOwned says Home was asked for: carryOut checks that the role's
	// user owns it (a stat, so not here).
	HomeOwned bool
	UID, GID  int
	Groups    []int // supplementary groups: the role's and its cards' GPU groups
	Rlimits   []spawn.Rlimit
	// Timeout is the wall timeout; NoTimeout says it was lifted.
	Timeout   time.Duration
	NoTimeout bool
	CPUs      cpuset.Set
	Cards     []int
	// Hold is a timed run's hold of its CPUs and cards; nil for every
	// other command.
	Hold *Hold
	// Cgroup is the role's group; nil where there is none.
	Cgroup *CgroupPlan
	// Landlock is the rule set's spec (carryOut drops writable places
	// that do not exist); nil only in a weakened test build.
	Landlock *landlock.RoleSpec
	// LandlockABI is the ABI the rule set (Landlock or Controller) is
	// built for: the policy's, or less where the kernel has less and the
	// operator accepted the loss; 0 builds none (planLandlockABI).
	LandlockABI int
	// Controller is the controller daemon's rule set's spec, in place of
	// Landlock; nil for every role command.
	Controller *landlock.ControllerSpec
	// Seccomp is the filter's options; nil only in a weakened test build.
	Seccomp *seccomp.Options
	Network netpolicy.Network // none, api, egress or open
	// Egress: the command starts in its role's egress network namespace
	// (netns.go), whose only listener is the controller's egress proxy.
	Egress bool
	// OwnBinary: the command is thermite itself (ownBinary), which holds
	// nothing of its role's: the disk measure passes over it.
	OwnBinary bool
	// StopsAfter: the role's user is stopped after the command, and its
	// commands run one at a time; while its last stop failed, a command
	// starts only once a new stop succeeds (leftoverRefusal).
	StopsAfter bool
}

// Hold is what a timed run holds while it runs.
type Hold struct {
	CPUs  cpuset.Set
	Cards []int
	// Advisory: no cpuset holds the CPUs in the kernel, by the operator's
	// accept_lost (or a weakened test build); affinity alone keeps them.
	Advisory bool
}

// CgroupPlan is a role's cgroup: its name beneath the broker's parent and
// its limits over everything the role's user runs.
type CgroupPlan struct {
	Name   string
	Limits cgroup.Limits
}

// Refusal is a request the policy refuses. Field names the request's field
// at fault (argv, env, limits.processes, cpus, gpus, cwd, home,
// no_timeout, role); Msg is the one line the caller sees.
type Refusal struct {
	Field string
	Msg   string
	err   error
}

func (e *Refusal) Error() string { return e.Msg }
func (e *Refusal) Unwrap() error { return e.err }

// refuse makes a refusal whose line begins with its field.
func refuse(field, format string, args ...any) *Refusal {
	return &Refusal{Field: field, Msg: field + ": " + fmt.Sprintf(format, args...)}
}

// NoTimeout is the wall timeout of a command whose request lifts it.
const NoTimeout = 100 * 365 * 24 * time.Hour

// fixedEnv are the variables the broker sets for every role command; a
// request that names one is not refused, its value is dropped.
var fixedEnv = []string{"HOME", "TMPDIR", "USER", "LOGNAME", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"}

// PlanRun decides one command of a role: the whole policy of a run request
// against the rig's configuration, its role table and what is held now.
// It refuses with a *Refusal naming the field at fault.
func PlanRun(cfg *config.Config, table *roles.Table, req *rpc.RunRequest, now *Snapshot) (*Plan, error) {
	r, ok := table.Role(req.Role)
	if !ok {
		return nil, &Refusal{Field: "role", Msg: fmt.Sprintf("role %q is not in the role table", req.Role)}
	}
	if err := checkArgv(req.Argv); err != nil {
		return nil, err
	}
	p := &Plan{Role: r, Argv: req.Argv, UID: r.UID, GID: r.GID, OwnBinary: ownBinary(req.Argv), StopsAfter: r.StopsAfterEachCommand()}
	var err error
	if p.Home, p.HomeOwned, err = planHome(cfg, table, r, req.Home, now); err != nil {
		return nil, err
	}
	if p.Rlimits, p.Timeout, err = planLimits(cfg.Limits, req.Limits); err != nil {
		return nil, err
	}
	if req.NoTimeout {
		if r.Kind != roles.Lane && r.Kind != roles.Agent {
			return nil, refuse("no_timeout", "only a lane's or an agent's helper may run without a timeout, not %s", r.Name)
		}
		p.Timeout, p.NoTimeout = NoTimeout, true
	}
	if p.CPUs, err = planCPUs(cfg, r, req.CPUs, now); err != nil {
		return nil, err
	}
	l := now.Layout
	if l == nil {
		l = &fence.Layout{Group: map[int]string{}, Timing: map[int]string{}}
	}
	var gpuEnv []string
	if p.Cards, p.Groups, gpuEnv, err = planGPUs(table, r, l, req.GPUs, now.HeldCards); err != nil {
		return nil, err
	}
	if p.Env, err = planEnv(cfg, r, p.Home, req.Env, gpuEnv); err != nil {
		return nil, err
	}
	pol, err := roles.PolicyFor(r, cfg.Network, cfg.Perf)
	if err != nil {
		return nil, &Refusal{Field: "network", Msg: err.Error(), err: err}
	}
	if p.Egress, err = planEgress(cfg, r, &pol, req.Egress, now); err != nil {
		return nil, err
	}
	p.Network = pol.Network
	p.Landlock, p.Seccomp = planConfinement(cfg, r, req.Argv, l, p.Cards, p.Home, pol, now)
	if p.Landlock != nil {
		p.LandlockABI = planLandlockABI(now.Kernel.ABI, p.Landlock.FenceOnly)
	}
	p.Cgroup = planCgroup(cfg, r, now.Cgroups, now.CPUWeights, now.Weakened)
	if p.Cwd, err = planCwd(cfg, table, r, req.Cwd, p.Home, now); err != nil {
		return nil, err
	}
	if r.Kind == roles.Timing {
		advisory, err := timedRunHold(cfg, now)
		if err != nil {
			return nil, &Refusal{Field: "cpus", Msg: fmt.Sprintf("judge CPUs %s: %v", p.CPUs, err), err: err}
		}
		p.Hold = &Hold{CPUs: p.CPUs, Cards: p.Cards, Advisory: advisory}
	}
	return p, nil
}

// checkArgv refuses an empty argv and a NUL byte, which execve would cut
// the argument at.
func checkArgv(argv []string) error {
	if len(argv) == 0 || argv[0] == "" {
		return refuse("argv", "empty: the request names no program")
	}
	for i, a := range argv {
		if strings.ContainsRune(a, 0) {
			return refuse("argv", "argument %d holds a NUL byte", i)
		}
	}
	return nil
}

// roleHome and roleTmp are a role's own HOME and TMPDIR in scratch.
func roleHome(cfg *config.Config, r roles.Role) string {
	return filepath.Join(cfg.ScratchDir(), "home", r.Name)
}

func roleTmp(cfg *config.Config, r roles.Role) string {
	return filepath.Join(cfg.ScratchDir(), "tmp", r.Name)
}

// planHome is a command's HOME: the role's own folder in scratch, or a
// folder in scratch/trials that the request names. That folder must not
// be one handed to another role; that the role's user owns it is checked
// where it is opened (carryOut).
func planHome(cfg *config.Config, t *roles.Table, r roles.Role, requested string, now *Snapshot) (string, bool, error) {
	if requested == "" {
		return roleHome(cfg, r), false, nil
	}
	trials := filepath.Join(cfg.ScratchDir(), "trials")
	p, err := beneath(trials, requested)
	if err != nil {
		return "", false, refuse("home", "%v", err)
	}
	if p == trials {
		return "", false, refuse("home", "%s: not a folder inside %s", requested, trials)
	}
	if other, ok := otherOwner(cfg, t, r, p, now); ok {
		return "", false, refuse("home", "%s is %s, not %s's", requested, other, r.Name)
	}
	return p, true, nil
}

// planCwd is where a command starts: its HOME unless the request names a
// folder inside scratch (a relative one is taken from scratch). A folder
// of another role's (its HOME, its TMPDIR, a folder handed to it) is
// refused, by name, before anything is opened; a symlink on the way is
// refused where it is opened beneath scratch (carryOut), as the kernel
// sees it then: a name cannot say what it points to.
func planCwd(cfg *config.Config, t *roles.Table, r roles.Role, requested, home string, now *Snapshot) (string, error) {
	if requested == "" {
		return home, nil
	}
	p, err := beneath(cfg.ScratchDir(), requested)
	if err != nil {
		return "", refuse("cwd", "%v", err)
	}
	if other, ok := otherOwner(cfg, t, r, p, now); ok {
		return "", refuse("cwd", "%s is %s, not %s's", requested, other, r.Name)
	}
	return p, nil
}

// beneath is path, absolute or taken from root, as an absolute path inside
// root. A ".." anywhere is refused rather than resolved: the kernel, not
// the name, says where it leads.
func beneath(root, path string) (string, error) {
	rel, err := confined.Rel(root, path)
	if err != nil {
		return "", err
	}
	for _, e := range strings.Split(rel, "/") {
		if e == ".." {
			return "", fmt.Errorf("%s: leaves %s (no .. in a path beneath it)", path, root)
		}
	}
	return filepath.Join(root, rel), nil
}

// otherOwner says whose place p is, where it is at or beneath another
// role's HOME, TMPDIR or a folder handed to another role: "lane-2's HOME".
func otherOwner(cfg *config.Config, t *roles.Table, r roles.Role, p string, now *Snapshot) (string, bool) {
	in := func(dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }
	for _, o := range t.Roles {
		if o.UID == r.UID {
			continue
		}
		if in(roleHome(cfg, o)) {
			return o.Name + "'s HOME", true
		}
		if in(roleTmp(cfg, o)) {
			return o.Name + "'s TMPDIR", true
		}
		for _, h := range now.Handed[o.UID] {
			if in(h) {
				return "a folder handed to " + o.Name, true
			}
		}
	}
	return "", false
}

// validEnvName is a shell-safe variable name. (Not a regexp: package-level
// regexps compile at start-up of every thermite process, the stop helper's
// and the probe's too.)
func validEnvName(k string) bool {
	if k == "" {
		return false
	}
	for i, c := range k {
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// planEnv is the whole environment of a role's command: what the request
// gives, then PATH unless the request sets it, then HOME, TMPDIR, USER,
// LOGNAME and the GPU variables (gpuEnv), which no request can change.
// Nothing of the broker's own environment is passed on.
func planEnv(cfg *config.Config, r roles.Role, home string, requested, gpuEnv []string) ([]string, error) {
	fixed := map[string]bool{}
	for _, k := range fixedEnv {
		fixed[k] = true
	}
	var env []string
	hasPath := false
	seen := map[string]bool{}
	for _, kv := range requested {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || !validEnvName(k) {
			return nil, refuse("env", "%q is not NAME=value", kv)
		}
		if strings.ContainsRune(kv, 0) {
			return nil, refuse("env", "%s holds a NUL byte", k)
		}
		if fixed[k] || seen[k] {
			continue
		}
		seen[k] = true
		if k == "PATH" {
			hasPath = true
		}
		env = append(env, kv)
	}
	if !hasPath {
		env = append(env, "PATH="+DefaultPath)
	}
	env = append(env, "HOME="+home, "TMPDIR="+roleTmp(cfg, r), "USER="+r.User, "LOGNAME="+r.User)
	return append(env, gpuEnv...), nil
}

// planLimits turns a request's limits into rlimits: the rig's defaults,
// lowered where the request asks. A request can never raise a default.
// RLIMIT_CORE is always 0, so no command leaves a core with its memory.
func planLimits(d config.Limits, req rpc.Limits) (rl []spawn.Rlimit, timeout time.Duration, err error) {
	lower := func(name string, req, def int64) (int64, error) {
		switch {
		case req < 0:
			return 0, refuse("limits."+name, "%d is negative", req)
		case req == 0:
			return def, nil
		case def > 0 && req > def:
			return 0, refuse("limits."+name, "%d is above the rig's limit of %d", req, def)
		}
		return req, nil
	}
	nproc, err := lower("processes", int64(req.Processes), int64(d.Processes))
	if err != nil {
		return nil, 0, err
	}
	nofile, err := lower("open_files", int64(req.OpenFiles), int64(d.OpenFiles))
	if err != nil {
		return nil, 0, err
	}
	as, err := lower("address_space_mb", req.AddressSpaceMB, d.AddressSpaceMB)
	if err != nil {
		return nil, 0, err
	}
	fsize, err := lower("file_size_mb", req.FileSizeMB, d.FileSizeMB)
	if err != nil {
		return nil, 0, err
	}
	cpu, err := lower("cpu_seconds", int64(req.CPUSeconds), int64(d.CPUSeconds))
	if err != nil {
		return nil, 0, err
	}
	to, err := lower("timeout_ms", req.TimeoutMS, d.WallTimeout.Milliseconds())
	if err != nil {
		return nil, 0, err
	}
	set := func(r int, v uint64) { rl = append(rl, spawn.Rlimit{Resource: r, Cur: v, Max: v}) }
	set(unix.RLIMIT_CORE, 0)
	set(unix.RLIMIT_NOFILE, uint64(nofile))
	if as > 0 {
		set(unix.RLIMIT_AS, uint64(as)<<20)
	}
	if fsize > 0 {
		set(unix.RLIMIT_FSIZE, uint64(fsize)<<20)
	}
	if cpu > 0 {
		// SIGXCPU at the limit, SIGKILL a second later.
		rl = append(rl, spawn.Rlimit{Resource: unix.RLIMIT_CPU, Cur: uint64(cpu), Max: uint64(cpu) + 1})
	}
	set(unix.RLIMIT_NPROC, uint64(nproc))
	return rl, time.Duration(to) * time.Millisecond, nil
}

// judgeShare is a timing user's share of the judge CPUs, split from the
// set the broker resolved at start (judge_cpus = "auto" is read once).
func judgeShare(cfg *config.Config, r roles.Role, judge cpuset.Set) (cpuset.Set, error) {
	c := *cfg
	if len(judge) > 0 {
		c.JudgeCPUs = judge.String()
	}
	return c.JudgeCPUsOf(r.Index - 1)
}

// planCPUs decides which CPUs a role's command runs on. A timing user runs
// only on its card's share of the judge's CPUs; every other role runs
// anywhere the broker may, except on judge CPUs a timed run holds now.
func planCPUs(cfg *config.Config, r roles.Role, requested string, now *Snapshot) (cpuset.Set, error) {
	var allowed cpuset.Set
	if r.Kind == roles.Timing {
		share, err := judgeShare(cfg, r, now.JudgeCPUs)
		if err != nil {
			return nil, &Refusal{Field: "cpus", Msg: fmt.Sprintf("cpus: %s: %v", r.Name, err), err: err}
		}
		allowed = share
	} else {
		allowed = now.Online.Minus(now.HeldCPUs)
	}
	if len(allowed) == 0 {
		return nil, refuse("cpus", "no CPU is free for %s (judge CPUs %s are held by a timed run)", r.Name, now.JudgeCPUs)
	}
	if requested == "" {
		return allowed, nil
	}
	want, err := cpuset.Parse(requested)
	if err != nil {
		return nil, &Refusal{Field: "cpus", Msg: "cpus: " + err.Error(), err: err}
	}
	if len(want) == 0 {
		return nil, refuse("cpus", "%q names no CPU", requested)
	}
	if r.Kind != roles.Timing && want.Intersects(now.HeldCPUs) {
		return nil, refuse("cpus", "CPUs %s are held by a timed run; %s may use %s now", now.HeldCPUs, r.Name, allowed)
	}
	if !allowed.Contains(want) {
		return nil, refuse("cpus", "%s may not use CPUs %s (it may use %s)", r.Name, want.Minus(allowed), allowed)
	}
	return want, nil
}

// planGroupCPUs decides which CPUs a role's cgroup gives its processes
// now, in the kernel: a timing user holding CPUs (own) exactly those; a
// timing user without a hold its card's share of the judge CPUs (none
// where it has no share: its commands are refused); every other role
// every CPU the broker has but those timed runs hold.
func planGroupCPUs(cfg *config.Config, r roles.Role, online, judge, held, own cpuset.Set) cpuset.Set {
	if r.Kind == roles.Timing {
		if len(own) > 0 {
			out := append(cpuset.Set(nil), own...)
			sort.Ints(out)
			return out
		}
		share, err := judgeShare(cfg, r, judge)
		if err != nil {
			return nil
		}
		return share
	}
	return online.Minus(held)
}

// planGPUs decides a command's GPU access: the cards it may open, its
// supplementary groups for this run (the role's and the cards' GPU
// groups), and CUDA_VISIBLE_DEVICES. A command that asks for cards is
// refused unless the layout gives them to its role; a development run
// never gets a card a timed run holds.
func planGPUs(t *roles.Table, r roles.Role, l *fence.Layout, requested []int, held map[int]bool) (cards, groups []int, env []string, err error) {
	if cards, err = l.CardsFor(r, requested); err != nil {
		return nil, nil, nil, &Refusal{Field: "gpus", Msg: err.Error(), err: err}
	}
	if r.Kind != roles.Timing {
		// A timed run has its card to itself: development runs take turns.
		for _, i := range cards {
			if held[i] {
				return nil, nil, nil, refuse("gpus", "card %d is held by a timed run; try again when it ends", i)
			}
		}
	}
	groups = append([]int(nil), r.Groups...)
	for _, g := range l.Groups(cards) {
		gid, ok := groupGIDIn(t, g)
		if !ok {
			return nil, nil, nil, refuse("gpus", "group %s is not in the role table", g)
		}
		groups = append(groups, gid)
	}
	return cards, uniqueInts(groups), l.Env(cards), nil
}

// groupGIDIn is a GPU group's gid in the role table.
func groupGIDIn(t *roles.Table, name string) (int, bool) {
	for _, g := range t.Groups {
		if g.Name == name {
			return g.GID, true
		}
	}
	return 0, false
}

// planConfinement decides a role command's confinement. Its Landlock rule
// set lets it read everything but the GPU device files it may not open,
// write only its own places (HOME, TMPDIR, the folders handed to its
// user) and the safe devices, reach TCP only where its network policy is
// open, and scopes abstract unix sockets and signals to its own domain.
// Its seccomp filter refuses mounts, namespaces, set-id modes and the
// rest, and sockets its network policy forbids. Where the kernel cannot
// do all of it, the rule set's build refuses the command: never a weaker
// sandbox.
// planEgress decides whether a command runs in egress mode
// (roles.EgressFor): then its network is egress, TCP connect to its proxy
// alone in a network namespace of its own. A request for egress that the
// rig does not give is refused, never run on the host's network. The
// egress-open test build runs it on the host's network with every socket.
func planEgress(cfg *config.Config, r roles.Role, pol *roles.Policy, asked bool, now *Snapshot) (bool, error) {
	if !roles.EgressFor(r, *pol, cfg.Agent.Egress, asked) {
		if asked {
			return false, refuse("egress", "%s gets none (only a lane's or an agent's command with network api, where agent.egress lists providers)", r.Name)
		}
		return false, nil
	}
	if now.Weakened[weaken.EgressOpen] {
		pol.Network = netpolicy.Open
		return false, nil
	}
	pol.Network = netpolicy.Egress
	return true, nil
}

func planConfinement(cfg *config.Config, r roles.Role, argv []string, l *fence.Layout, cards []int, home string, pol roles.Policy, now *Snapshot) (*landlock.RoleSpec, *seccomp.Options) {
	w := now.Weakened
	sc := &seccomp.Options{Network: pol.Network, AllowPerf: pol.AllowPerf, FileHelper: fileHelper(r, argv),
		NoUnixSockets: pol.NoUnixSockets, NoWatches: pol.NoWatches}
	for _, name := range []string{seccomp.WeakenSysVIPC, seccomp.WeakenSetIDOpenat2, seccomp.WeakenAPITCP, seccomp.WeakenAIO, seccomp.WeakenStopSignals, seccomp.WeakenPOSIXQueues} {
		if w[name] {
			sc.Weakened = append(sc.Weakened, name)
		}
	}
	if w[weaken.NoLandlock] {
		return nil, nil
	}
	var gpu []string
	if len(cards) > 0 {
		for _, i := range cards {
			card, _ := l.Card(i)
			gpu = append(gpu, card.Path)
		}
		gpu = append(gpu, l.Control...)
	}
	spec := &landlock.RoleSpec{
		DenyGPU: l.Deny(cards), GPU: gpu, Writable: writableFor(cfg, r, home, now.Handed[r.UID]),
		DevRoot: cfg.GPU.DevRoot, Network: pol.Network, NoMeetingPoints: pol.NoUnixSockets,
	}
	if pol.Network == netpolicy.Egress {
		spec.EgressPort = cfg.Agent.EgressPort
	}
	if w[weaken.APITCP] {
		spec.APIPort = now.APIPort
	}
	if w[weaken.FenceOnly] {
		return &landlock.RoleSpec{DenyGPU: l.Deny(cards), DevRoot: cfg.GPU.DevRoot, FenceOnly: true}, nil
	}
	return spec, sc
}

// fileHelper decides which command keeps openat2, which every other role
// command is refused (it could make a set-id file, its mode out of the
// filter's sight): the lane's file helper, `thermite __lanefs`, started by
// the controller as a lane's command. /proc/self/exe in spawn.Start's
// child, which shares the broker's memory until its execve, is this very
// binary, and the helper refuses any mode beyond 0777 itself. Only the
// controller asks for commands, so no lane can dress its own up as one.
func fileHelper(r roles.Role, argv []string) bool {
	return r.Kind == roles.Lane && len(argv) >= 2 && ownBinary(argv) && argv[1] == lanefs.Arg
}

// ownExe is thermite's own binary as spawn.Start's child execs it.
const ownExe = "/proc/self/exe"

// ownBinary says whether argv runs thermite itself (a lane's file helper,
// the self-test's probes), which spawn.Start's child finds as ownExe.
func ownBinary(argv []string) bool { return len(argv) > 0 && argv[0] == ownExe }

// planLandlockABI is the ABI a rule set is built for on a kernel with
// kernelABI: the policy's (landlock.PolicyABI), or the kernel's where it
// has less, for the start got past the kernel policy only where the
// operator accepted what it lacks (a rule set then keeps what the kernel
// has, and there is none without Landlock). The GPU fence alone is built
// for landlock.FenceABI, which the start demands whatever was accepted.
func planLandlockABI(kernelABI int, fenceOnly bool) int {
	if fenceOnly {
		return landlock.FenceABI
	}
	return min(landlock.PolicyABI, kernelABI)
}

// writableFor is where a role's command may write: its HOME, its TMPDIR
// and every folder handed to its user, sorted. Places that do not exist
// are left out when the rule set is built (a rule needs its path).
func writableFor(cfg *config.Config, r roles.Role, home string, handed []string) []string {
	set := map[string]bool{roleHome(cfg, r): true, roleTmp(cfg, r): true, home: true}
	for _, p := range handed {
		set[p] = true
	}
	var out []string
	for p := range set {
		if p != "" {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

// planCgroup is a role's cgroup: memory (no swap) and pids limits over
// everything its user runs, and its CPU weight where the tree has the cpu
// controller (cpu); nil where no writable tree exists.
func planCgroup(cfg *config.Config, r roles.Role, tree, cpu bool, weakened map[string]bool) *CgroupPlan {
	if !tree || weakened[weaken.FenceOnly] || weakened[weaken.NoLandlock] {
		return nil
	}
	p := &CgroupPlan{Name: r.Name, Limits: cgroup.Limits{MemoryBytes: cfg.Cgroup.MemoryMB << 20, Pids: cfg.Cgroup.Pids}}
	if cpu {
		p.Limits.CPUWeight = planCPUWeight(cfg.Lanes, r.Kind, weakened)
	}
	return p
}

// CPUWeight is the CPU weight of a role's cgroup on a rig of lanes lanes,
// on cgroup v2's scale (cpu.weight; v1's cpu.shares are cgroup.SharesOf
// it). Every role's group and the controller daemon's are siblings under
// the broker's parent group, and the kernel shares the CPUs among busy
// siblings by weight, however many processes and sessions each holds (a
// task in a cpu group is weighed by its group, not by its session's
// autogroup). Lanes and agents weigh alike, so that a lane's flood takes
// its own share and no other's. The rig's own work weighs, each group of
// it, as much as every lane and agent together, so that it keeps at least
// half of the rig's CPUs while all of them are busy: the controller daemon
// (which serves every lane's calls), the judge's builder and timing
// users, and the planner, the model check and the supervisor, whose work
// every lane waits on or the operator runs.
func CPUWeight(lanes int, k roles.Kind) int64 {
	lane := laneCPUWeight(lanes)
	if k == roles.Lane || k == roles.Agent {
		return lane
	}
	return lane * int64(2*lanes)
}

// laneCPUWeight is a lane's weight, and an agent's: the kernel's default,
// or less where the rig's weight (all lanes' and agents' together) would
// pass the kernel's bound.
func laneCPUWeight(lanes int) int64 {
	return max(cgroup.WeightMin, min(cgroup.WeightDefault, cgroup.WeightMax/int64(2*max(lanes, 1))))
}

// planCPUWeight is the weight a role's group gets: CPUWeight, or in a
// test build weakened with flat-cpu-weights the lanes' weight for every
// role, as if the rig's own work were one more lane.
func planCPUWeight(lanes int, k roles.Kind, weakened map[string]bool) int64 {
	if weakened[weaken.FlatCPUWeights] {
		return CPUWeight(lanes, roles.Lane)
	}
	return CPUWeight(lanes, k)
}

// timedRunHold decides how a timed run holds its judge CPUs: in the
// kernel (a cpuset), or by affinity alone where no writable cpuset exists
// and the operator accepted that (host.accept_lost = ["judge-cpuset"]);
// otherwise the timed run is refused.
func timedRunHold(cfg *config.Config, now *Snapshot) (advisory bool, err error) {
	if advisoryWeakened(now.Weakened) {
		return true, nil
	}
	return hostpolicy.TimedRunDecision(now.Kernel, cfg.Host.AcceptLost)
}

// advisoryWeakened is true only in test builds: without role cgroups, or
// the breakage test's, where judge CPUs are held by request alone.
func advisoryWeakened(w map[string]bool) bool {
	return w[weaken.AdvisoryCPUs] || w[weaken.FenceOnly] || w[weaken.NoLandlock]
}

// controllerGroup is the controller daemon's cgroup, beside the roles'
// groups: no role's name holds a dot, so none can be called the same.
const controllerGroup = "controller.daemon"

// systemPrograms are the folders whose programs the controller (a kit's
// check: sh, awk, python) may run and whose libraries it loads.
var systemPrograms = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt"}

// systemReadable are the folders it reads besides: /etc for resolv.conf,
// hosts and certificates, /proc and /sys for the Go runtime and fetch's
// view of the host's addresses.
var systemReadable = []string{"/etc", "/proc", "/sys"}

// PlanController decides the controller daemon's command, and the
// self-test's probe of it gets the very same plan: its HOME as working
// folder, the environment of a role command without a request's, its
// Landlock rule set (controllerSpec), its seccomp filter
// (seccomp.ControllerOptions) and its own cgroup (controllerCgroup).
// resolved are the folders of the resolver files that are symlinks out
// of /etc, which the broker looks up (their rules need the real folder).
// Of now it reads the cgroup tree, the kernel and the weakened switches.
func PlanController(cfg *config.Config, table *roles.Table, argv []string, exe string, resolved []string, now *Snapshot) (*Plan, error) {
	ctl := table.Controller()
	home := roleHome(cfg, ctl)
	env, err := planEnv(cfg, ctl, home, nil, nil)
	if err != nil {
		return nil, err
	}
	p := &Plan{Role: ctl, Argv: argv, Env: env, Cwd: home, Home: home, UID: ctl.UID, GID: ctl.GID, Groups: ctl.Groups, OwnBinary: ownBinary(argv)}
	if now.Weakened[weaken.ControllerBare] {
		return p, nil
	}
	spec := controllerSpec(cfg, ctl, exe, resolved)
	o := seccomp.ControllerOptions()
	p.Controller, p.Seccomp = &spec, &o
	p.LandlockABI = planLandlockABI(now.Kernel.ABI, false)
	if now.Cgroups {
		p.Cgroup = controllerCgroup(cfg, now.CPUWeights, now.Weakened)
	}
	return p, nil
}

// controllerSpec is where the controller may read, run programs and
// write: the system's programs and configuration, its own binary, the kits
// (a kit's check may be a program of the kit), and as its own folders
// the store, the research folder, scratch's trials, runs and builds, its
// HOME and TMPDIR, and the image's outbox where there is one. In its
// private folder it makes its socket, and writes its ledger and nothing
// else: it reads the kits the operator's commands import there, and moves
// the projects they import out. Likewise it only makes the API's socket in
// that socket's folder.
func controllerSpec(cfg *config.Config, ctl roles.Role, exe string, resolved []string) landlock.ControllerSpec {
	s := cfg.ScratchDir()
	spec := landlock.ControllerSpec{
		Read:   append([]string(nil), systemReadable...),
		Exec:   append(append([]string(nil), systemPrograms...), filepath.Join(cfg.ControllerDir(), "kits")),
		Binary: exe,
		Writable: []string{
			cfg.StoreDir(), cfg.ResearchDir(),
			filepath.Join(s, "trials"), filepath.Join(s, "runs"), filepath.Join(s, "builds"),
			roleHome(cfg, ctl), roleTmp(cfg, ctl),
			// A trial's import is moved from here into its workspace:
			// Landlock lets a rename through only with REFER on both
			// sides and no right gained at the destination.
			filepath.Join(cfg.ControllerDir(), "projects"),
		},
		Sockets: []string{cfg.ControllerDir(), cfg.APIDir(), filepath.Dir(cfg.APISocket())},
		Files:   []string{ledgerPath(cfg)},
	}
	// The one-container image's exchange folders (docs/container.md): the
	// controller reads the inbox and fills the outbox.
	if cfg.Image.Inbox != "" {
		spec.Read = append(spec.Read, cfg.Image.Inbox)
	}
	if cfg.Image.Outbox != "" {
		spec.Writable = append(spec.Writable, cfg.Image.Outbox)
	}
	spec.Read = append(spec.Read, resolved...)
	sort.Strings(spec.Sockets)
	return spec
}

// controllerCgroup is the controller daemon's cgroup, beside the roles'
// groups, with cgroup.controller_memory_mb and cgroup.controller_pids, and
// the rig's CPU weight where the tree has the cpu controller (cpu).
func controllerCgroup(cfg *config.Config, cpu bool, weakened map[string]bool) *CgroupPlan {
	p := &CgroupPlan{Name: controllerGroup, Limits: cgroup.Limits{MemoryBytes: cfg.Cgroup.ControllerMemoryMB << 20, Pids: cfg.Cgroup.ControllerPids}}
	if cpu {
		p.Limits.CPUWeight = planCPUWeight(cfg.Lanes, roles.Controller, weakened)
	}
	return p
}

func ledgerPath(cfg *config.Config) string { return filepath.Join(cfg.ControllerDir(), "ledger.db") }

// policySwitches are every switch the policy reads.
var policySwitches = []string{
	seccomp.WeakenSysVIPC, seccomp.WeakenSetIDOpenat2, seccomp.WeakenAPITCP, seccomp.WeakenAIO, seccomp.WeakenStopSignals,
	seccomp.WeakenPOSIXQueues, weaken.APITCP, weaken.AdvisoryCPUs, weaken.ControllerBare, weaken.NoLandlock, weaken.FenceOnly,
	weaken.EgressOpen, weaken.FlatCPUWeights,
}

// weakenedNow are the switches this build was started with: none outside
// a thermite_weaken build.
func weakenedNow() map[string]bool {
	if !weaken.Enabled {
		return nil
	}
	w := map[string]bool{}
	for _, name := range policySwitches {
		if weaken.Has(name) {
			w[name] = true
		}
	}
	return w
}
