package broker

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"thermite/fence"
	"thermite/internal/cgroup"
	"thermite/internal/config"
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

// These tests decide commands with PlanRun alone: no root, no broker, no
// files. The rig: state in /srv/rig, two lanes, two dedicated cards with
// their timing users run (card 0, judge CPUs 4-5) and run-2 (card 1, 6-7),
// CPUs 0-7 online.

const (
	scratch = "/srv/rig/scratch"
	devRoot = "/srv/dev"
)

func rig(t *testing.T) (*config.Config, *roles.Table) {
	t.Helper()
	cfg := config.Default()
	cfg.StateDir = "/srv/rig"
	cfg.Lanes = 2
	cfg.TimingUsers = 2
	cfg.JudgeCPUs = "4-7"
	cfg.GPU.Layout = "dedicated"
	cfg.GPU.DevRoot = devRoot
	cfg.Limits = config.Limits{Processes: 512, OpenFiles: 1024, AddressSpaceMB: 4096, FileSizeMB: 1024, CPUSeconds: 600, WallTimeout: config.Duration{Duration: 10 * time.Minute}}
	table, err := roles.FromConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &cfg, table
}

func role(t *testing.T, table *roles.Table, name string) roles.Role {
	t.Helper()
	r, ok := table.Role(name)
	if !ok {
		t.Fatalf("no role %s", name)
	}
	return r
}

// held is the rig with nothing held, a trial T1 whose workspace, lane
// home and agent folder are lane-1's and agent-1's, and a trial T2 of
// lane-2's.
func held(t *testing.T, table *roles.Table) *Snapshot {
	t.Helper()
	d := &fence.Devices{
		Cards: []fence.Card{
			{Index: 0, Minor: 0, UUID: "GPU-0", Path: devRoot + "/nvidia0"},
			{Index: 1, Minor: 1, UUID: "GPU-1", Path: devRoot + "/nvidia1"},
		},
		Control: []string{devRoot + "/nvidiactl", devRoot + "/nvidia-uvm"},
	}
	l := fence.Plan("dedicated", d, 2)
	if l.Refused != "" {
		t.Fatal(l.Refused)
	}
	return &Snapshot{
		Online:    cpuset.Set{0, 1, 2, 3, 4, 5, 6, 7},
		JudgeCPUs: cpuset.Set{4, 5, 6, 7},
		HeldCards: map[int]bool{},
		Layout:    l,
		Handed: map[int][]string{
			role(t, table, "lane-1").UID:  {scratch + "/trials/T1/workspace", scratch + "/trials/T1/lane"},
			role(t, table, "agent-1").UID: {scratch + "/trials/T1/agent"},
			role(t, table, "lane-2").UID:  {scratch + "/trials/T2/workspace", scratch + "/trials/T2/lane"},
		},
		Cgroups: true, CPUWeights: true,
	}
}

// Each case is an attack a request makes; the policy refuses it, naming
// the field at fault in one line.
func TestPlanRefusesAttacks(t *testing.T) {
	cfg, table := rig(t)
	lane := func(edit func(*rpc.RunRequest)) *rpc.RunRequest {
		r := &rpc.RunRequest{Role: "lane-1", Argv: []string{"/bin/true"}}
		if edit != nil {
			edit(r)
		}
		return r
	}
	as := func(roleName string, edit func(*rpc.RunRequest)) *rpc.RunRequest {
		r := lane(edit)
		r.Role = roleName
		return r
	}
	cases := []struct {
		name  string
		req   *rpc.RunRequest
		snap  func(*Snapshot)
		field string
		want  string
	}{
		{"RoleNotInTheTable", as("root", nil), nil, "role", `role "root" is not in the role table`},
		{"EmptyArgv", lane(func(r *rpc.RunRequest) { r.Argv = nil }), nil, "argv", "argv: empty"},
		{"EmptyProgramName", lane(func(r *rpc.RunRequest) { r.Argv = []string{"", "x"} }), nil, "argv", "argv: empty"},
		{"ArgvWithNULCutsAnArgument", lane(func(r *rpc.RunRequest) { r.Argv = []string{"/bin/echo", "a\x00b"} }), nil, "argv", "argv: argument 1 holds a NUL byte"},
		{"EnvNameWithSpace", lane(func(r *rpc.RunRequest) { r.Env = []string{"NOT VALID"} }), nil, "env", `env: "NOT VALID" is not NAME=value`},
		{"EnvNameEmptyBeforeEquals", lane(func(r *rpc.RunRequest) { r.Env = []string{"=HOME=/etc"} }), nil, "env", `env: "=HOME=/etc" is not NAME=value`},
		{"EnvWithoutEquals", lane(func(r *rpc.RunRequest) { r.Env = []string{"HOME"} }), nil, "env", `env: "HOME" is not NAME=value`},
		{"EnvNameWithNUL", lane(func(r *rpc.RunRequest) { r.Env = []string{"A\x00HOME=/etc"} }), nil, "env", "is not NAME=value"},
		{"EnvValueWithNUL", lane(func(r *rpc.RunRequest) { r.Env = []string{"LD=a\x00HOME=/etc"} }), nil, "env", "env: LD holds a NUL byte"},
		{"EnvNameStartsWithDigit", lane(func(r *rpc.RunRequest) { r.Env = []string{"1X=y"} }), nil, "env", "is not NAME=value"},
		{"RaisesNPROC", lane(func(r *rpc.RunRequest) { r.Limits.Processes = 100000 }), nil, "limits.processes", "limits.processes: 100000 is above the rig's limit of 512"},
		{"RaisesOpenFiles", lane(func(r *rpc.RunRequest) { r.Limits.OpenFiles = 1 << 20 }), nil, "limits.open_files", "limits.open_files: 1048576 is above the rig's limit of 1024"},
		{"RaisesAddressSpace", lane(func(r *rpc.RunRequest) { r.Limits.AddressSpaceMB = 8192 }), nil, "limits.address_space_mb", "limits.address_space_mb: 8192 is above the rig's limit of 4096"},
		{"RaisesFileSize", lane(func(r *rpc.RunRequest) { r.Limits.FileSizeMB = 2048 }), nil, "limits.file_size_mb", "limits.file_size_mb: 2048 is above the rig's limit of 1024"},
		{"RaisesCPUSeconds", lane(func(r *rpc.RunRequest) { r.Limits.CPUSeconds = 601 }), nil, "limits.cpu_seconds", "limits.cpu_seconds: 601 is above the rig's limit of 600"},
		{"RaisesTimeout", lane(func(r *rpc.RunRequest) { r.Limits.TimeoutMS = 600001 }), nil, "limits.timeout_ms", "limits.timeout_ms: 600001 is above the rig's limit of 600000"},
		{"NegativeProcesses", lane(func(r *rpc.RunRequest) { r.Limits.Processes = -1 }), nil, "limits.processes", "limits.processes: -1 is negative"},
		{"NegativeOpenFiles", lane(func(r *rpc.RunRequest) { r.Limits.OpenFiles = -5 }), nil, "limits.open_files", "limits.open_files: -5 is negative"},
		{"NegativeAddressSpace", lane(func(r *rpc.RunRequest) { r.Limits.AddressSpaceMB = -1 }), nil, "limits.address_space_mb", "is negative"},
		{"NegativeCPUSeconds", lane(func(r *rpc.RunRequest) { r.Limits.CPUSeconds = -1 }), nil, "limits.cpu_seconds", "is negative"},
		{"NegativeTimeout", lane(func(r *rpc.RunRequest) { r.Limits.TimeoutMS = -1 }), nil, "limits.timeout_ms", "is negative"},
		{"NoTimeoutFromTheBuilder", as("builder", func(r *rpc.RunRequest) { r.NoTimeout = true }), nil, "no_timeout", "no_timeout: only a lane's or an agent's helper may run without a timeout, not builder"},
		{"NoTimeoutFromATimingUser", as("run", func(r *rpc.RunRequest) { r.NoTimeout = true }), nil, "no_timeout", "not run"},
		{"NoTimeoutFromThePlanner", as("planner", func(r *rpc.RunRequest) { r.NoTimeout = true }), nil, "no_timeout", "not planner"},
		{"LaneMovesOntoHeldJudgeCPU", lane(func(r *rpc.RunRequest) { r.CPUs = "4" }), func(s *Snapshot) { s.HeldCPUs = cpuset.Set{4, 5} }, "cpus", "cpus: CPUs 4-5 are held by a timed run; lane-1 may use 0-3,6-7 now"},
		{"BuilderMovesOntoHeldJudgeCPU", as("builder", func(r *rpc.RunRequest) { r.CPUs = "0-7" }), func(s *Snapshot) { s.HeldCPUs = cpuset.Set{6, 7} }, "cpus", "held by a timed run"},
		{"LaneAsksCPUTheBrokerHasNot", lane(func(r *rpc.RunRequest) { r.CPUs = "63" }), nil, "cpus", "cpus: lane-1 may not use CPUs 63 (it may use 0-7)"},
		{"LaneAsksNoCPU", lane(func(r *rpc.RunRequest) { r.CPUs = " " }), nil, "cpus", "cpus:"},
		{"LaneAsksGarbageCPUs", lane(func(r *rpc.RunRequest) { r.CPUs = "all" }), nil, "cpus", "cpus:"},
		{"EveryCPUHeld", lane(nil), func(s *Snapshot) { s.HeldCPUs = s.Online }, "cpus", "cpus: no CPU is free for lane-1"},
		{"TimingUserOutsideItsCardsShare", as("run", func(r *rpc.RunRequest) { r.CPUs = "6" }), nil, "cpus", "cpus: run may not use CPUs 6 (it may use 4-5)"},
		{"TimingUserOnANonJudgeCPU", as("run-2", func(r *rpc.RunRequest) { r.CPUs = "0,6" }), nil, "cpus", "cpus: run-2 may not use CPUs 0 (it may use 6-7)"},
		{"TimingUserWithoutAShare", as("run-2", nil), func(s *Snapshot) { s.JudgeCPUs = cpuset.Set{7} }, "cpus", "card 1 has no judge CPU of its own"},
		{"TimedRunWithoutACpusetNotAccepted", as("run", nil), func(s *Snapshot) { s.Kernel.CPUSet = "no cpuset hierarchy" }, "cpus", `judge CPUs 4-5: judge CPUs cannot be held in the kernel: no cpuset hierarchy`},
		{"BuilderAsksACard", as("builder", func(r *rpc.RunRequest) { r.GPUs = []int{0} }), nil, "gpus", "gpus: builder may not open GPUs"},
		{"AgentAsksACard", as("agent-1", func(r *rpc.RunRequest) { r.GPUs = []int{1} }), nil, "gpus", "gpus: agent-1 may not open GPUs"},
		{"TimingUserAsksAnotherCard", as("run", func(r *rpc.RunRequest) { r.GPUs = []int{1} }), nil, "gpus", "gpus: run may not open card 1 (its timing user is run-2)"},
		{"LaneAsksACardThatIsNot", lane(func(r *rpc.RunRequest) { r.GPUs = []int{7} }), nil, "gpus", "gpus: card 7 does not exist"},
		{"LaneAsksAHeldCard", lane(func(r *rpc.RunRequest) { r.GPUs = []int{1, 0} }), func(s *Snapshot) { s.HeldCards = map[int]bool{0: true} }, "gpus", "gpus: card 0 is held by a timed run"},
		{"LaneAsksACardOnARefusedLayout", lane(func(r *rpc.RunRequest) { r.GPUs = []int{0} }), func(s *Snapshot) { s.Layout = &fence.Layout{Refused: "card 0 has no UUID"} }, "gpus", "gpus: GPU work is refused on this rig: card 0 has no UUID"},
		{"LaneAsksACardBeforeDiscovery", lane(func(r *rpc.RunRequest) { r.GPUs = []int{0} }), func(s *Snapshot) { s.Layout = nil }, "gpus", "gpus: card 0 does not exist"},
		{"CwdClimbsOutOfScratch", lane(func(r *rpc.RunRequest) { r.Cwd = "../../../etc" }), nil, "cwd", "cwd: ../../../etc: leaves " + scratch},
		{"CwdClimbsIntoAnotherLane", lane(func(r *rpc.RunRequest) { r.Cwd = scratch + "/home/lane-1/../lane-2" }), nil, "cwd", "leaves " + scratch},
		{"CwdAbsoluteElsewhere", lane(func(r *rpc.RunRequest) { r.Cwd = "/etc" }), nil, "cwd", "cwd: /etc: not inside " + scratch},
		{"CwdBesideScratch", lane(func(r *rpc.RunRequest) { r.Cwd = scratch + "-old/x" }), nil, "cwd", "not inside " + scratch},
		{"CwdInAnotherLanesHome", lane(func(r *rpc.RunRequest) { r.Cwd = scratch + "/home/lane-2/src" }), nil, "cwd", "cwd: " + scratch + "/home/lane-2/src is lane-2's HOME, not lane-1's"},
		{"CwdInAnotherLanesTmp", lane(func(r *rpc.RunRequest) { r.Cwd = "tmp/lane-2" }), nil, "cwd", "is lane-2's TMPDIR, not lane-1's"},
		{"CwdInAnotherLanesWorkspace", lane(func(r *rpc.RunRequest) { r.Cwd = scratch + "/trials/T2/workspace/src" }), nil, "cwd", "is a folder handed to lane-2, not lane-1's"},
		{"CwdInTheControllersHome", as("agent-1", func(r *rpc.RunRequest) { r.Cwd = scratch + "/home/thermite" }), nil, "cwd", "is thermite's HOME, not agent-1's"},
		{"AgentCwdInItsLanesWorkspace", as("agent-1", func(r *rpc.RunRequest) { r.Cwd = scratch + "/trials/T1/workspace" }), nil, "cwd", "is a folder handed to lane-1, not agent-1's"},
		{"HomeOutsideTrials", as("agent-1", func(r *rpc.RunRequest) { r.Home = "/etc" }), nil, "home", "home: /etc: not inside " + scratch + "/trials"},
		{"HomeInAnotherRolesHome", as("agent-1", func(r *rpc.RunRequest) { r.Home = scratch + "/home/lane-1" }), nil, "home", "not inside " + scratch + "/trials"},
		{"HomeIsTrialsItself", as("agent-1", func(r *rpc.RunRequest) { r.Home = scratch + "/trials" }), nil, "home", "not a folder inside"},
		{"HomeClimbsOutOfTrials", as("agent-1", func(r *rpc.RunRequest) { r.Home = scratch + "/trials/../home/lane-1" }), nil, "home", "leaves " + scratch + "/trials"},
		{"HomeInAnotherLanesFolder", lane(func(r *rpc.RunRequest) { r.Home = scratch + "/trials/T2/lane" }), nil, "home", "home: " + scratch + "/trials/T2/lane is a folder handed to lane-2, not lane-1's"},
		{"AgentHomeInItsLanesWorkspace", as("agent-1", func(r *rpc.RunRequest) { r.Home = scratch + "/trials/T1/workspace" }), nil, "home", "is a folder handed to lane-1, not agent-1's"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			now := held(t, table)
			if c.snap != nil {
				c.snap(now)
			}
			p, err := PlanRun(cfg, table, c.req, now)
			if err == nil {
				t.Fatalf("planned: %+v", p)
			}
			var ref *Refusal
			if !errors.As(err, &ref) {
				t.Fatalf("%v: not a refusal (%T)", err, err)
			}
			if ref.Field != c.field {
				t.Errorf("field %q, want %q (%s)", ref.Field, c.field, err)
			}
			if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("%q: want one line with %q", err, c.want)
			}
			if c.field != "role" && !strings.Contains(err.Error(), c.field) {
				t.Errorf("%q does not name its field %s", err, c.field)
			}
		})
	}
}

// The plan of an ordinary lane command, field by field.
func TestPlanLaneCommand(t *testing.T) {
	cfg, table := rig(t)
	now := held(t, table)
	now.HeldCPUs = cpuset.Set{4, 5}
	req := &rpc.RunRequest{Role: "lane-1", Argv: []string{"make", "-j2"}, Env: []string{"FOO=bar", "FOO=again"}, Cwd: scratch + "/trials/T1/workspace"}
	p, err := PlanRun(cfg, table, req, now)
	if err != nil {
		t.Fatal(err)
	}
	l1 := role(t, table, "lane-1")
	home := scratch + "/home/lane-1"
	want := &Plan{
		Role: l1, Argv: req.Argv,
		Env: []string{"FOO=bar", "PATH=" + DefaultPath, "HOME=" + home, "TMPDIR=" + scratch + "/tmp/lane-1",
			"USER=lane-1", "LOGNAME=lane-1", "CUDA_VISIBLE_DEVICES=", "NVIDIA_VISIBLE_DEVICES="},
		Cwd: scratch + "/trials/T1/workspace", Home: home, UID: l1.UID, GID: l1.GID, Groups: nil,
		Rlimits: []spawn.Rlimit{
			{Resource: unix.RLIMIT_CORE}, {Resource: unix.RLIMIT_NOFILE, Cur: 1024, Max: 1024},
			{Resource: unix.RLIMIT_AS, Cur: 4096 << 20, Max: 4096 << 20}, {Resource: unix.RLIMIT_FSIZE, Cur: 1024 << 20, Max: 1024 << 20},
			{Resource: unix.RLIMIT_CPU, Cur: 600, Max: 601}, {Resource: unix.RLIMIT_NPROC, Cur: 512, Max: 512},
		},
		Timeout: 10 * time.Minute, CPUs: cpuset.Set{0, 1, 2, 3, 6, 7},
		Cgroup: &CgroupPlan{Name: "lane-1", Limits: cgroup.Limits{MemoryBytes: 4096 << 20, Pids: 1024, CPUWeight: 100}},
		Landlock: &landlock.RoleSpec{
			DenyGPU:  []string{devRoot + "/nvidia0", devRoot + "/nvidia1", devRoot + "/nvidiactl", devRoot + "/nvidia-uvm"},
			Writable: []string{home, scratch + "/tmp/lane-1", scratch + "/trials/T1/lane", scratch + "/trials/T1/workspace"},
			DevRoot:  devRoot, Network: "api",
		},
		Seccomp: &seccomp.Options{Network: "api", NoWatches: true},
		Network: "api",
	}
	samePlan(t, p, want)
}

// A request that sets HOME, TMPDIR, USER, LOGNAME or the GPU variables is
// not refused: the broker's values stand, once each, and the request's
// are dropped (getenv takes the first of two).
func TestRequestCannotSetFixedVariables(t *testing.T) {
	cfg, table := rig(t)
	req := &rpc.RunRequest{Role: "lane-2", Argv: []string{"env"}, GPUs: []int{1}, Env: []string{
		"HOME=/root", "TMPDIR=/tmp", "USER=root", "LOGNAME=root", "CUDA_VISIBLE_DEVICES=GPU-0", "NVIDIA_VISIBLE_DEVICES=all", "PATH=/opt/bin",
	}}
	p, err := PlanRun(cfg, table, req, held(t, table))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"PATH=/opt/bin", "HOME=" + scratch + "/home/lane-2", "TMPDIR=" + scratch + "/tmp/lane-2",
		"USER=lane-2", "LOGNAME=lane-2", "CUDA_VISIBLE_DEVICES=GPU-1", "NVIDIA_VISIBLE_DEVICES=GPU-1"}
	if !reflect.DeepEqual(p.Env, want) {
		t.Errorf("env %q, want %q", p.Env, want)
	}
}

// A lane's development run on a card: that card's node and the control
// nodes, its GPU groups for this run, the other card denied.
func TestPlanLaneDevelopmentRunOnACard(t *testing.T) {
	cfg, table := rig(t)
	p, err := PlanRun(cfg, table, &rpc.RunRequest{Role: "lane-1", Argv: []string{"nvidia-smi"}, GPUs: []int{1, 1}}, held(t, table))
	if err != nil {
		t.Fatal(err)
	}
	gpu, _ := groupGIDIn(table, "gpu")
	gpu1, _ := groupGIDIn(table, "gpu-1")
	if !reflect.DeepEqual(p.Cards, []int{1}) || !reflect.DeepEqual(p.Groups, []int{gpu, gpu1}) || p.Hold != nil {
		t.Errorf("cards %v groups %v (want [1] [%d %d]) hold %+v", p.Cards, p.Groups, gpu, gpu1, p.Hold)
	}
	if want := []string{devRoot + "/nvidia1", devRoot + "/nvidiactl", devRoot + "/nvidia-uvm"}; !reflect.DeepEqual(p.Landlock.GPU, want) {
		t.Errorf("GPU %v, want %v", p.Landlock.GPU, want)
	}
	if want := []string{devRoot + "/nvidia0"}; !reflect.DeepEqual(p.Landlock.DenyGPU, want) {
		t.Errorf("DenyGPU %v, want %v", p.Landlock.DenyGPU, want)
	}
}

// A timed run: its card's share of the judge CPUs, its card, its groups,
// and a hold of both, in the kernel or (the loss accepted) by affinity.
func TestPlanTimedRun(t *testing.T) {
	cfg, table := rig(t)
	req := &rpc.RunRequest{Role: "run-2", Argv: []string{"./bench"}, GPUs: []int{1}, Cwd: "runs/R1", Limits: rpc.Limits{CPUSeconds: 30, TimeoutMS: 60000}}
	now := held(t, table)
	now.HeldCPUs = cpuset.Set{4, 5} // run's timed run on the other card
	p, err := PlanRun(cfg, table, req, now)
	if err != nil {
		t.Fatal(err)
	}
	run2 := role(t, table, "run-2")
	want := &Hold{CPUs: cpuset.Set{6, 7}, Cards: []int{1}}
	if !reflect.DeepEqual(p.Hold, want) || !reflect.DeepEqual(p.CPUs, want.CPUs) {
		t.Errorf("hold %+v cpus %v, want %+v", p.Hold, p.CPUs, want)
	}
	if !reflect.DeepEqual(p.Groups, run2.Groups) || p.Network != "none" || p.Cwd != scratch+"/runs/R1" || p.Timeout != time.Minute {
		t.Errorf("groups %v (want %v) network %s cwd %s timeout %s", p.Groups, run2.Groups, p.Network, p.Cwd, p.Timeout)
	}
	if lim := rlimitOf(p.Rlimits, unix.RLIMIT_CPU); lim != 30 {
		t.Errorf("RLIMIT_CPU %d, want 30", lim)
	}
	now.Kernel = hostpolicy.Host{CPUSet: "no cpuset hierarchy"}
	acc := *cfg
	acc.Host.AcceptLost = []string{hostpolicy.JudgeCPUSet}
	if p, err = PlanRun(&acc, table, req, now); err != nil || !p.Hold.Advisory {
		t.Errorf("cpuset lost and accepted: %v %+v", err, p)
	}
}

// An agent's helper in its trial's folder, without a timeout: the folder
// is its HOME (its owner is checked where it is opened).
func TestPlanAgentHelperWithoutTimeout(t *testing.T) {
	cfg, table := rig(t)
	dir := scratch + "/trials/T1/agent"
	p, err := PlanRun(cfg, table, &rpc.RunRequest{Role: "agent-1", Argv: []string{"pi"}, Home: dir, Cwd: dir, NoTimeout: true}, held(t, table))
	if err != nil {
		t.Fatal(err)
	}
	if p.Home != dir || !p.HomeOwned || p.Cwd != dir || !p.NoTimeout || p.Timeout != NoTimeout {
		t.Errorf("home %s owned %v cwd %s timeout %s", p.Home, p.HomeOwned, p.Cwd, p.Timeout)
	}
	if want := []string{scratch + "/home/agent-1", scratch + "/tmp/agent-1", dir}; !reflect.DeepEqual(p.Landlock.Writable, want) {
		t.Errorf("writable %v, want %v", p.Landlock.Writable, want)
	}
	if p.Env[1] != "HOME="+dir {
		t.Errorf("env %q", p.Env)
	}
}

// Only the lane's file helper keeps openat2; the same argv as another
// role, or another program as a lane, does not.
func TestPlanFileHelperOnlyForALane(t *testing.T) {
	cfg, table := rig(t)
	argv := []string{"/proc/self/exe", lanefs.Arg}
	for _, c := range []struct {
		role string
		argv []string
		want bool
	}{{"lane-1", argv, true}, {"agent-1", argv, false}, {"builder", argv, false}, {"lane-1", []string{"/proc/self/exe", "__probe"}, false}} {
		p, err := PlanRun(cfg, table, &rpc.RunRequest{Role: c.role, Argv: c.argv}, held(t, table))
		if err != nil {
			t.Fatal(err)
		}
		if p.Seccomp.FileHelper != c.want {
			t.Errorf("%s %v: file helper %v, want %v", c.role, c.argv, p.Seccomp.FileHelper, c.want)
		}
	}
}

// The configured network of a kind and perf_event_open reach the filter
// and the rule set; no cgroup tree plans no group.
func TestPlanNetworkPerfAndNoCgroups(t *testing.T) {
	cfg, table := rig(t)
	cfg.Network = map[string]netpolicy.Network{"builder": netpolicy.Open}
	cfg.Perf = []string{"timing"}
	now := held(t, table)
	now.Cgroups = false
	b, err := PlanRun(cfg, table, &rpc.RunRequest{Role: "builder", Argv: []string{"make"}}, now)
	if err != nil {
		t.Fatal(err)
	}
	if b.Network != "open" || b.Landlock.Network != "open" || b.Seccomp.Network != "open" || b.Seccomp.AllowPerf || b.Cgroup != nil {
		t.Errorf("builder: network %s/%s/%s perf %v cgroup %+v", b.Network, b.Landlock.Network, b.Seccomp.Network, b.Seccomp.AllowPerf, b.Cgroup)
	}
	r, err := PlanRun(cfg, table, &rpc.RunRequest{Role: "run", Argv: []string{"perf"}}, now)
	if err != nil {
		t.Fatal(err)
	}
	if r.Network != "none" || !r.Seccomp.AllowPerf {
		t.Errorf("run: network %s perf %v", r.Network, r.Seccomp.AllowPerf)
	}
	cfg.Network = map[string]netpolicy.Network{"lane": "wide"}
	if _, err := PlanRun(cfg, table, &rpc.RunRequest{Role: "lane-1", Argv: []string{"x"}}, now); err == nil || !strings.Contains(err.Error(), "network.lane") {
		t.Errorf("bad network policy: %v", err)
	}
}

// A lane lowering its limits gets exactly those.
func TestPlanLoweredLimits(t *testing.T) {
	cfg, table := rig(t)
	p, err := PlanRun(cfg, table, &rpc.RunRequest{Role: "lane-1", Argv: []string{"x"}, Limits: rpc.Limits{
		Processes: 8, OpenFiles: 64, AddressSpaceMB: 256, FileSizeMB: 1, CPUSeconds: 2, TimeoutMS: 1500,
	}}, held(t, table))
	if err != nil {
		t.Fatal(err)
	}
	want := []spawn.Rlimit{
		{Resource: unix.RLIMIT_CORE}, {Resource: unix.RLIMIT_NOFILE, Cur: 64, Max: 64},
		{Resource: unix.RLIMIT_AS, Cur: 256 << 20, Max: 256 << 20}, {Resource: unix.RLIMIT_FSIZE, Cur: 1 << 20, Max: 1 << 20},
		{Resource: unix.RLIMIT_CPU, Cur: 2, Max: 3}, {Resource: unix.RLIMIT_NPROC, Cur: 8, Max: 8},
	}
	if !reflect.DeepEqual(p.Rlimits, want) || p.Timeout != 1500*time.Millisecond {
		t.Errorf("rlimits %+v timeout %s", p.Rlimits, p.Timeout)
	}
}

// A role's cgroup CPUs in the kernel: a timing user holding CPUs exactly
// those, one without a hold its share, every other role the rest.
func TestPlanGroupCPUs(t *testing.T) {
	cfg, table := rig(t)
	online, judge := cpuset.Set{0, 1, 2, 3, 4, 5, 6, 7}, cpuset.Set{4, 5, 6, 7}
	held := cpuset.Set{6, 7, 4}
	for _, c := range []struct {
		role string
		own  cpuset.Set
		want string
	}{{"run", cpuset.Set{5, 4}, "4-5"}, {"run-2", nil, "6-7"}, {"lane-1", nil, "0-3,5"}, {"builder", nil, "0-3,5"}} {
		if got := planGroupCPUs(cfg, role(t, table, c.role), online, judge, held, c.own).String(); got != c.want {
			t.Errorf("%s: %s, want %s", c.role, got, c.want)
		}
	}
}

// samePlan fails with each field that differs.
func samePlan(t *testing.T, got, want *Plan) {
	t.Helper()
	g, w := reflect.ValueOf(got).Elem(), reflect.ValueOf(want).Elem()
	for i := 0; i < g.NumField(); i++ {
		gf, wf := g.Field(i).Interface(), w.Field(i).Interface()
		if !reflect.DeepEqual(gf, wf) {
			if g.Field(i).Kind() == reflect.Pointer && !g.Field(i).IsNil() && !w.Field(i).IsNil() {
				gf, wf = g.Field(i).Elem().Interface(), w.Field(i).Elem().Interface()
			}
			t.Errorf("%s: %#v, want %#v", g.Type().Field(i).Name, gf, wf)
		}
	}
}

// The controller daemon's plan: its HOME, a role's environment without a
// request's, its own filter and cgroup, and a rule set that writes only
// its own folders, none of a role's.
func TestPlanController(t *testing.T) {
	cfg, table := rig(t)
	argv := []string{"/proc/self/exe", ControllerArg}
	p, err := PlanController(cfg, table, argv, "/proc/self/exe", []string{"/run/systemd/resolve"}, &Snapshot{Cgroups: true, CPUWeights: true, Kernel: hostpolicy.Host{ABI: 7}})
	if err != nil {
		t.Fatal(err)
	}
	ctl := table.Controller()
	home := scratch + "/home/thermite"
	wantEnv := []string{"PATH=" + DefaultPath, "HOME=" + home, "TMPDIR=" + scratch + "/tmp/thermite", "USER=thermite", "LOGNAME=thermite"}
	if p.Role.UID != ctl.UID || p.Cwd != home || !reflect.DeepEqual(p.Env, wantEnv) || !reflect.DeepEqual(p.Argv, argv) {
		t.Errorf("uid %d cwd %s env %q argv %q", p.Role.UID, p.Cwd, p.Env, p.Argv)
	}
	if p.Seccomp == nil || !p.Seccomp.Controller || p.Landlock != nil || p.Hold != nil {
		t.Errorf("seccomp %+v landlock %+v hold %+v", p.Seccomp, p.Landlock, p.Hold)
	}
	// Two lanes and two agents weigh 100 each: the controller as much as
	// the four together.
	if want := (&CgroupPlan{Name: controllerGroup, Limits: cgroup.Limits{MemoryBytes: 2048 << 20, Pids: 1024, CPUWeight: 400}}); !reflect.DeepEqual(p.Cgroup, want) {
		t.Errorf("cgroup %+v, want %+v", p.Cgroup, want)
	}
	if p, _ := PlanController(cfg, table, argv, "/proc/self/exe", nil, &Snapshot{Cgroups: true}); p.Cgroup == nil || p.Cgroup.Limits.CPUWeight != 0 {
		t.Errorf("no cpu controller: cgroup %+v, want no weight", p.Cgroup)
	}
	s := p.Controller
	if s == nil {
		t.Fatal("no rule set spec")
	}
	for _, w := range s.Writable {
		for _, r := range []string{scratch + "/home/lane-1", scratch + "/tmp/lane-1", "/etc", scratch} {
			if w == r {
				t.Errorf("writable %s", w)
			}
		}
	}
	if want := []string{"/srv/rig/store", "/srv/rig/research", scratch + "/trials", scratch + "/runs", scratch + "/builds", home, scratch + "/tmp/thermite", "/srv/rig/controller/projects", cfg.Image.Outbox}; !reflect.DeepEqual(s.Writable, want) {
		t.Errorf("writable %v, want %v", s.Writable, want)
	}
	if s.Read[len(s.Read)-1] != "/run/systemd/resolve" || !reflect.DeepEqual(s.Files, []string{"/srv/rig/controller/ledger.db"}) {
		t.Errorf("read %v files %v", s.Read, s.Files)
	}
	if p, _ := PlanController(cfg, table, argv, "/proc/self/exe", nil, &Snapshot{}); p.Cgroup != nil {
		t.Errorf("no cgroup tree: cgroup %+v", p.Cgroup)
	}
}

// A name cannot say whether it is a symlink: the plan takes a cwd inside
// the role's own HOME as it is, and carryOut opens it beneath scratch with
// RESOLVE_NO_SYMLINKS, where the kernel refuses a symlink a lane planted
// (TestBrokerAsOperator asserts that refusal end to end). A relative cwd
// is taken from scratch.
func TestPlanLeavesSymlinksToTheKernel(t *testing.T) {
	cfg, table := rig(t)
	for cwd, want := range map[string]string{
		scratch + "/home/lane-1/escape": scratch + "/home/lane-1/escape",
		"home/lane-1/src":               scratch + "/home/lane-1/src",
		scratch:                         scratch,
	} {
		p, err := PlanRun(cfg, table, &rpc.RunRequest{Role: "lane-1", Argv: []string{"pwd"}, Cwd: cwd}, held(t, table))
		if err != nil || p.Cwd != want {
			t.Errorf("cwd %s: %v %+v, want %s", cwd, err, p, want)
		}
	}
}

// The broker's snapshot copies what timed runs hold and the folders handed
// to each role, so a plan never shares the broker's maps.
func TestSnapshotCopiesWhatIsHeld(t *testing.T) {
	b := &Broker{
		cpus:   cpuLayout{online: cpuset.Set{0, 1, 2, 3}, judge: cpuset.Set{2, 3}},
		holds:  holdSet{cpus: map[string]cpuset.Set{"hold-2": {3}, "hold-1": {2}}, cards: map[string][]int{"hold-1": {0}, "hold-2": nil}},
		handed: map[int]map[string]bool{20101: {scratch + "/trials/T1/workspace": true}},
	}
	s := b.snapshot()
	if !reflect.DeepEqual(s.HeldCPUs, cpuset.Set{2, 3}) || !reflect.DeepEqual(s.HeldCards, map[int]bool{0: true}) || s.Cgroups {
		t.Errorf("held CPUs %v cards %v cgroups %v", s.HeldCPUs, s.HeldCards, s.Cgroups)
	}
	if !reflect.DeepEqual(s.Handed, map[int][]string{20101: {scratch + "/trials/T1/workspace"}}) {
		t.Errorf("handed %v", s.Handed)
	}
	s.Handed[20101][0] = "/elsewhere"
	if !b.handed[20101][scratch+"/trials/T1/workspace"] {
		t.Error("the snapshot shares the broker's handed folders")
	}
}

// Where agent.egress lists providers, every agent command and a lane
// harness's asked-for run plan egress (TCP to the proxy's port alone, in
// the role's namespace); a lane's other commands keep api, and asking for
// egress where the rig gives none is refused, never run on the host's
// network.
func TestPlanEgressOnlyWhereTheRigGivesIt(t *testing.T) {
	cfg, table := rig(t)
	cfg.Agent.Egress = []string{"api.example.com:443"}
	cfg.Agent.EgressPort = 3128
	for _, c := range []struct {
		role   string
		asked  bool
		egress bool
	}{{"agent-1", false, true}, {"lane-1", true, true}, {"lane-1", false, false}} {
		p, err := PlanRun(cfg, table, &rpc.RunRequest{Role: c.role, Argv: []string{"true"}, Egress: c.asked}, held(t, table))
		if err != nil {
			t.Fatalf("%s asked %v: %v", c.role, c.asked, err)
		}
		wantNet, wantPort := netpolicy.API, 0
		if c.egress {
			wantNet, wantPort = netpolicy.Egress, 3128
		}
		if p.Egress != c.egress || p.Network != wantNet || p.Seccomp.Network != wantNet || p.Landlock.Network != wantNet || p.Landlock.EgressPort != wantPort {
			t.Errorf("%s asked %v: egress %v network %s/%s/%s port %d", c.role, c.asked, p.Egress, p.Network, p.Seccomp.Network, p.Landlock.Network, p.Landlock.EgressPort)
		}
	}
	cfg.Agent.Egress = nil
	_, err := PlanRun(cfg, table, &rpc.RunRequest{Role: "lane-1", Argv: []string{"true"}, Egress: true}, held(t, table))
	var ref *Refusal
	if !errors.As(err, &ref) || ref.Field != "egress" || !strings.HasPrefix(err.Error(), "egress: lane-1 gets none") {
		t.Errorf("egress asked where the rig gives none: %v", err)
	}
	if p, err := PlanRun(cfg, table, &rpc.RunRequest{Role: "agent-1", Argv: []string{"true"}}, held(t, table)); err != nil || p.Egress || p.Network != netpolicy.API {
		t.Errorf("agent without agent.egress: %+v %v", p, err)
	}
}

// Each case is an attack on what the carry-out does with a plan: the plan
// decides it (its credentials, the rule set's ABI, whether the command is
// thermite's own, whether the user is stopped after it), and the carry-out
// only reads it.
func TestPlanDecidesWhatTheCarryOutDoes(t *testing.T) {
	cfg, table := rig(t)
	type want struct {
		uid, gid, abi     int
		own, stopsAfter   bool
		fenceOnly, noRule bool
	}
	as := func(name string) want {
		r := role(t, table, name)
		return want{uid: r.UID, gid: r.GID, abi: landlock.PolicyABI, stopsAfter: r.StopsAfterEachCommand()}
	}
	with := func(w want, edit func(*want)) want { edit(&w); return w }
	cases := []struct {
		name string
		req  *rpc.RunRequest
		snap func(*Snapshot)
		want want
	}{
		{"LaneRunsAsItsOwnUser", &rpc.RunRequest{Role: "lane-1", Argv: []string{"/bin/id"}}, nil, as("lane-1")},
		{"AgentRunsAsItsOwnUserAndIsStoppedAfter", &rpc.RunRequest{Role: "agent-1", Argv: []string{"/bin/id"}}, nil, with(as("agent-1"), func(w *want) { w.stopsAfter = true })},
		{"BuilderIsStoppedAfter", &rpc.RunRequest{Role: "builder", Argv: []string{"make"}}, nil, with(as("builder"), func(w *want) { w.stopsAfter = true })},
		{"TimedRunIsStoppedAfter", &rpc.RunRequest{Role: "run", Argv: []string{"./bench"}, Cwd: "runs/R1"}, nil, with(as("run"), func(w *want) { w.stopsAfter = true })},
		{"LaneIsNotStoppedAfterEachCommand", &rpc.RunRequest{Role: "lane-2", Argv: []string{"sleep", "1"}}, nil, with(as("lane-2"), func(w *want) { w.stopsAfter = false })},
		{"ThermiteItselfPassesAsOwn", &rpc.RunRequest{Role: "lane-1", Argv: []string{"/proc/self/exe", lanefs.Arg}}, nil, with(as("lane-1"), func(w *want) { w.own = true })},
		// The disk measure passes over thermite's own commands: a lane's
		// program named by another spelling of the path is measured.
		{"DottedSelfExeIsNotOwn", &rpc.RunRequest{Role: "lane-1", Argv: []string{"/proc/self/./exe"}}, nil, as("lane-1")},
		{"DoubleSlashSelfExeIsNotOwn", &rpc.RunRequest{Role: "lane-1", Argv: []string{"/proc//self/exe"}}, nil, as("lane-1")},
		{"SelfExeAsAnArgumentIsNotOwn", &rpc.RunRequest{Role: "lane-1", Argv: []string{"/bin/sh", "/proc/self/exe"}}, nil, as("lane-1")},
		{"OlderKernelAcceptedGetsItsABI", &rpc.RunRequest{Role: "lane-1", Argv: []string{"/bin/id"}}, func(s *Snapshot) { s.Kernel.ABI = 4 }, with(as("lane-1"), func(w *want) { w.abi = 4 })},
		{"NewerKernelGetsThePolicyABI", &rpc.RunRequest{Role: "lane-1", Argv: []string{"/bin/id"}}, func(s *Snapshot) { s.Kernel.ABI = landlock.PolicyABI + 3 }, as("lane-1")},
		{"NoLandlockAcceptedBuildsNone", &rpc.RunRequest{Role: "lane-1", Argv: []string{"/bin/id"}}, func(s *Snapshot) { s.Kernel.ABI = 0 }, with(as("lane-1"), func(w *want) { w.abi = 0 })},
		{"FenceOnlyIsBuiltForTheFenceABI", &rpc.RunRequest{Role: "lane-1", Argv: []string{"/bin/id"}}, func(s *Snapshot) { s.Weakened = map[string]bool{weaken.FenceOnly: true} }, with(as("lane-1"), func(w *want) { w.abi, w.fenceOnly = landlock.FenceABI, true })},
		{"NoRuleSetHasNoABI", &rpc.RunRequest{Role: "lane-1", Argv: []string{"/bin/id"}}, func(s *Snapshot) { s.Weakened = map[string]bool{weaken.NoLandlock: true} }, with(as("lane-1"), func(w *want) { w.abi, w.noRule = 0, true })},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			now := held(t, table)
			now.Kernel.ABI = landlock.PolicyABI
			if c.snap != nil {
				c.snap(now)
			}
			p, err := PlanRun(cfg, table, c.req, now)
			if err != nil {
				t.Fatal(err)
			}
			got := want{uid: p.UID, gid: p.GID, abi: p.LandlockABI, own: p.OwnBinary, stopsAfter: p.StopsAfter, noRule: p.Landlock == nil}
			if p.Landlock != nil {
				got.fenceOnly = p.Landlock.FenceOnly
			}
			if got != c.want {
				t.Errorf("plan %+v, want %+v", got, c.want)
			}
		})
	}
	ctl := table.Controller()
	for _, k := range []struct{ kernel, want int }{{landlock.PolicyABI + 1, landlock.PolicyABI}, {4, 4}, {0, 0}} {
		p, err := PlanController(cfg, table, []string{"/proc/self/exe", ControllerArg}, "/proc/self/exe", nil, &Snapshot{Kernel: hostpolicy.Host{ABI: k.kernel}})
		if err != nil {
			t.Fatal(err)
		}
		if p.LandlockABI != k.want || p.UID != ctl.UID || p.GID != ctl.GID || !p.OwnBinary || p.StopsAfter {
			t.Errorf("controller on ABI %d: abi %d uid %d gid %d own %v stops after %v, want abi %d uid %d gid %d, own, not stopped after", k.kernel, p.LandlockABI, p.UID, p.GID, p.OwnBinary, p.StopsAfter, k.want, ctl.UID, ctl.GID)
		}
	}
}

// Lanes flooding the CPU take no more than their share: on a rig of any
// number of lanes, every lane and agent weighs the same (one lane's
// processes, however many and in however many sessions, take one lane's
// share), and each group of the rig's own work weighs at least as much as
// every lane and agent together, so that with all of them spinning the
// controller (serving the lanes' calls) and the judge's builder and timing
// users still get half of what the rig gets. Every weight is within the
// kernel's bounds on both cgroup versions. The plan gives exactly these
// weights, and none where the tree has no cpu controller.
func TestLanesFloodingTakeNoMoreThanTheirShareOfTheCPU(t *testing.T) {
	rigKinds := []roles.Kind{roles.Controller, roles.Builder, roles.Timing, roles.Planner, roles.ModelCheck, roles.Supervisor}
	for _, lanes := range []int{1, 2, 16, 25, 50, 51, 99} {
		cfg := config.Default()
		cfg.Lanes, cfg.TimingUsers = lanes, 2
		table, err := roles.FromConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		laneW := CPUWeight(lanes, roles.Lane)
		var lanesTogether int64
		for _, r := range table.Roles {
			p := planCgroup(&cfg, r, true, true, nil)
			w := p.Limits.CPUWeight
			if w < cgroup.WeightMin || w > cgroup.WeightMax || cgroup.SharesOf(w) < 2 || cgroup.SharesOf(w) > 262144 {
				t.Errorf("%d lanes: %s weighs %d (%d shares), out of the kernel's bounds", lanes, r.Name, w, cgroup.SharesOf(w))
			}
			if w != CPUWeight(lanes, r.Kind) {
				t.Errorf("%d lanes: %s is planned %d, CPUWeight says %d", lanes, r.Name, w, CPUWeight(lanes, r.Kind))
			}
			if r.Kind == roles.Lane || r.Kind == roles.Agent {
				if w != laneW {
					t.Errorf("%d lanes: %s weighs %d, another lane %d: one lane's flood would take more than its share", lanes, r.Name, w, laneW)
				}
				lanesTogether += w
			}
		}
		if lanesTogether != laneW*int64(2*lanes) {
			t.Fatalf("%d lanes: the table's lanes and agents weigh %d together, want %d", lanes, lanesTogether, laneW*int64(2*lanes))
		}
		for _, k := range rigKinds {
			if w := CPUWeight(lanes, k); w < lanesTogether {
				t.Errorf("%d lanes: %s weighs %d, less than the lanes' and agents' %d together: their flood takes its CPU", lanes, k, w, lanesTogether)
			}
		}
		if w := controllerCgroup(&cfg, true, nil).Limits.CPUWeight; w < lanesTogether {
			t.Errorf("%d lanes: the controller daemon's group weighs %d, less than the lanes' and agents' %d", lanes, w, lanesTogether)
		}
		if p := planCgroup(&cfg, table.Roles[0], true, false, nil); p.Limits.CPUWeight != 0 {
			t.Errorf("%d lanes: a tree without the cpu controller is planned weight %d", lanes, p.Limits.CPUWeight)
		}
	}
	// The weakened build's flat weights give the rig's own work one
	// lane's weight: the breakage the self-test's row must catch.
	cfg, _ := rig(t)
	if w := controllerCgroup(cfg, true, map[string]bool{weaken.FlatCPUWeights: true}).Limits.CPUWeight; w != CPUWeight(cfg.Lanes, roles.Lane) {
		t.Errorf("flat-cpu-weights: the controller weighs %d, want a lane's %d", w, CPUWeight(cfg.Lanes, roles.Lane))
	}
}

// TestBrokerKeepsAtMost25Fields: Broker ties the rooms together and keeps
// no room's state itself (issue 28): what belongs together lives in a
// sub-object of its own (holdSet, stopState, measureState, cpuLayout...).
func TestBrokerKeepsAtMost25Fields(t *testing.T) {
	if n := reflect.TypeOf(Broker{}).NumField(); n > 25 {
		t.Fatalf("Broker has %d fields, over 25: put the new state in the sub-object of its room", n)
	}
}
