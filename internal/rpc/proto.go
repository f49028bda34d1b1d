// Package rpc is the broker's closed protocol: a fixed, versioned set of
// typed requests, one frame per SOCK_SEQPACKET message (JSON, or for a Run
// and its answer a fixed binary layout, runframe.go), with stdio passed as
// file descriptors beside the frame. The broker serves it; the
// controller and the operator's commands call it.
package rpc

import "encoding/json"

// Version is the protocol version. A frame with another is refused.
const Version = 1

// MaxFrame is the largest frame either side accepts, in bytes.
const MaxFrame = 64 << 10

// MaxAnswer bounds an answer sent in parts.
const MaxAnswer = 16 << 20

// MaxFDs is the most descriptors one frame may carry.
const MaxFDs = 4

// The operations. The set is closed: anything else is refused.
const (
	OpPing        = "ping"
	OpRun         = "run"
	OpStopUser    = "stop_user"
	OpHandFolder  = "hand_folder"
	OpClearSetID  = "clear_setid"
	OpStatus      = "status"
	OpSelftest    = "selftest"
	OpDiskUsage   = "disk_usage"
	OpRunFolder   = "run_folder"
	OpRetire      = "retire_folder"
	OpTrialFolder = "trial_folder"
)

// Request is one call. Exactly the field named by Op is set.
type Request struct {
	V           int                 `json:"v"`
	Op          string              `json:"op"`
	Run         *RunRequest         `json:"run,omitempty"`
	StopUser    *StopUserRequest    `json:"stop_user,omitempty"`
	HandFolder  *HandFolderRequest  `json:"hand_folder,omitempty"`
	ClearSetID  *ClearSetIDRequest  `json:"clear_setid,omitempty"`
	Selftest    *SelftestRequest    `json:"selftest,omitempty"`
	DiskUsage   *DiskUsageRequest   `json:"disk_usage,omitempty"`
	RunFolder   *RunFolderRequest   `json:"run_folder,omitempty"`
	Retire      *RetireRequest      `json:"retire_folder,omitempty"`
	TrialFolder *TrialFolderRequest `json:"trial_folder,omitempty"`
}

// DiskUsageRequest measures what a role's user holds in scratch and in the
// folders handed to it.
type DiskUsageRequest struct {
	Role string `json:"role"`
	// HelperIdle is the controller's word that the role's file helper
	// changed nothing since the last measure of the role. The broker may
	// then answer with that measure, when also no command of the role has
	// started since and none but the broker's own helpers runs: nothing
	// could have changed what the role holds.
	HelperIdle bool `json:"helper_idle,omitempty"`
}

// DiskUsage is the bytes (allocated blocks) and entries it found.
type DiskUsage struct {
	Bytes   int64 `json:"bytes"`
	Entries int64 `json:"entries"`
	// Unlinked is the part of Bytes in files no name links any more that
	// the role's processes keep open or mapped, in UnlinkedFiles files.
	Unlinked      int64 `json:"unlinked,omitempty"`
	UnlinkedFiles int   `json:"unlinked_files,omitempty"`
	// Reused says the answer is the last measure's: nothing of the role
	// ran or changed since.
	Reused bool `json:"reused,omitempty"`
	// Quota says the file system's user quota measured it (no walk):
	// Unlinked then holds only what lies on other file systems.
	Quota bool `json:"quota,omitempty"`
}

// Response answers one Request. Error is one line naming what was wrong.
type Response struct {
	V     int    `json:"v"`
	Error string `json:"error,omitempty"`
	// Part and More carry an answer larger than one frame: its JSON, cut
	// into parts, each in a frame of its own, More set on all but the last.
	Part       []byte            `json:"part,omitempty"`
	More       bool              `json:"more,omitempty"`
	Run        *RunResult        `json:"run,omitempty"`
	StopUser   *StopUserResult   `json:"stop_user,omitempty"`
	HandFolder *HandFolderResult `json:"hand_folder,omitempty"`
	ClearSetID *SetIDReport      `json:"clear_setid,omitempty"`
	Status     *Status           `json:"status,omitempty"`
	Selftest   *SelftestResult   `json:"selftest,omitempty"`
	DiskUsage  *DiskUsage        `json:"disk_usage,omitempty"`
	Retire     *RetireResult     `json:"retire_folder,omitempty"`
}

// Limits bound one command. Zero takes the rig's default; a request can
// only lower a default, never raise it.
type Limits struct {
	Processes      int   `json:"processes,omitempty"`
	OpenFiles      int   `json:"open_files,omitempty"`
	AddressSpaceMB int64 `json:"address_space_mb,omitempty"`
	FileSizeMB     int64 `json:"file_size_mb,omitempty"`
	CPUSeconds     int   `json:"cpu_seconds,omitempty"`
	TimeoutMS      int64 `json:"timeout_ms,omitempty"`
}

// RunRequest runs one command as a role. Its stdin, stdout and stderr come
// as the frame's three descriptors, or /dev/null when it carries none.
type RunRequest struct {
	Role   string   `json:"role"`
	Argv   []string `json:"argv"`
	Env    []string `json:"env,omitempty"`
	Cwd    string   `json:"cwd,omitempty"` // inside scratch; "" is the role's home
	Limits Limits   `json:"limits"`
	CPUs   string   `json:"cpus,omitempty"` // a CPU list; "" is the role's default
	GPUs   []int    `json:"gpus,omitempty"` // card indexes the command may open
	// Home replaces the role's HOME: a folder in scratch/trials that the
	// role's user owns (an agent runs with its trial's folder as HOME).
	Home string `json:"home,omitempty"`
	// NoTimeout lifts the wall timeout for a lane's or an agent's
	// long-lived helper, which lives until its trial ends.
	NoTimeout bool `json:"no_timeout,omitempty"`
	// Egress asks for the role's egress mode (roles.EgressFor): a lane's
	// run of an agent program by the lane harness. An agent's commands
	// have it whenever the rig lists providers, asked or not.
	Egress bool `json:"egress,omitempty"`
}

// Why a command stopped.
const (
	StoppedExited   = "exited"
	StoppedSignaled = "signaled"
	StoppedTimeout  = "timeout"
	StoppedLimitCPU = "limit:cpu"
	StoppedLimitFSZ = "limit:file_size"
	StoppedLimitMem = "limit:memory" // the role's cgroup memory limit
	StoppedCanceled = "canceled"     // the caller went away or the broker is stopping
	StoppedTraced   = "traced"       // it made the broker its tracer and stopped: killed
)

// RunResult is how a command ended.
type RunResult struct {
	PID       int    `json:"pid"`
	ExitCode  int    `json:"exit_code"` // -1 when a signal ended it
	Signal    int    `json:"signal,omitempty"`
	Stopped   string `json:"stopped"`
	WallNS    int64  `json:"wall_ns"`
	UserNS    int64  `json:"user_ns"`
	SysNS     int64  `json:"sys_ns"`
	MaxRSSKB  int64  `json:"max_rss_kb"`
	CPUs      string `json:"cpus"`
	Leftovers int    `json:"leftovers_stopped"` // processes of the role stopped after it
	// CardStops: a timed run's processes of other roles stopped at its
	// hold's start because they had its card open, one line each.
	CardStops []string `json:"card_stops,omitempty"`
	// SetID is the sweep of set-id bits after a lane's command.
	SetID *SetIDReport `json:"setid,omitempty"`
	// StartWaitNS is how long the command waited from the broker's
	// receipt of its Run to its start (planning, holds, its role's turn);
	// StartsAhead how many starts of other roles went first meanwhile.
	StartWaitNS int64 `json:"start_wait_ns,omitempty"`
	StartsAhead int   `json:"starts_ahead,omitempty"`
}

// StopUserRequest stops everything a role's user runs.
type StopUserRequest struct {
	Role string `json:"role"`
}

// StopUserResult says how many processes it ended.
type StopUserResult struct {
	Stopped int `json:"stopped"`
}

// HandFolderRequest gives a folder, recursively, to a role. ReadOnly also
// takes every write bit away, as when a lane's research area is published.
type HandFolderRequest struct {
	Path     string `json:"path"`
	Role     string `json:"role"`
	Mode     uint32 `json:"mode,omitempty"` // the top folder's mode; 0 keeps it
	ReadOnly bool   `json:"read_only,omitempty"`
	// Publish makes everything readable by all too (files 0444 or 0555,
	// folders 0555): a lane's research area when its trial ends.
	Publish bool `json:"publish,omitempty"`
	// TopOnly gives only the folder itself, not what it holds: for a
	// trial's workspace whose tree the operator's import already made the
	// lane's. Only beneath scratch/trials, and only a folder the
	// controller or the role owns.
	TopOnly bool `json:"top_only,omitempty"`
	// GroupTop hands what the folder holds to the role and keeps its top
	// the controller's, for the role's group (0770): the role writes in it
	// but cannot open it to other roles. Only for a lane's own research
	// area, handed writable.
	GroupTop bool `json:"group_top,omitempty"`
}

// HandFolderResult counts what changed hands and what was skipped, and
// names what a publish removed: FIFOs, sockets and device nodes.
type HandFolderResult struct {
	Changed int      `json:"changed"`
	Skipped []string `json:"skipped,omitempty"`
	Removed []string `json:"removed,omitempty"`
}

// TrialFolderRequest closes a trial's folder (a folder directly in
// scratch/trials, the controller's) to every role but the trial's lane and
// that lane's agent: the broker gives it an ACL naming those two, with
// search only, and nothing for its group or others.
type TrialFolderRequest struct {
	Path string `json:"path"`
	Lane string `json:"lane"` // the lane's role name, lane-N
}

// RunFolderRequest opens a timed run's folder (a folder directly in
// scratch/runs, the controller's) to one timing user and no one else: the
// broker makes its group the timing user's own group and its mode 0750.
type RunFolderRequest struct {
	Path string `json:"path"`
	Role string `json:"role"`
}

// RetireRequest takes an ended trial's folder (a folder directly in
// scratch/trials) from every role: it becomes root's, 0700, in one step
// rather than a walk, and with Remove it and all it holds are removed.
type RetireRequest struct {
	Path   string `json:"path"`
	Remove bool   `json:"remove,omitempty"`
}

// RetireResult counts the entries removed.
type RetireResult struct {
	Removed int64 `json:"removed"`
}

// ClearSetIDRequest sweeps a lane's folders for set-id bits.
type ClearSetIDRequest struct {
	Role string `json:"role"`
}

// SetIDReport is what a sweep cleared and what it would not touch.
type SetIDReport struct {
	Cleared []string `json:"cleared,omitempty"`
	Skipped []string `json:"skipped,omitempty"`
	Scanned int      `json:"scanned"`
}

// SelftestRequest runs the isolation self-test.
type SelftestRequest struct {
	Force bool `json:"force,omitempty"`
}

// Probe is one row of the self-test's answer.
type Probe struct {
	Role    string `json:"role"`
	Attempt string `json:"attempt"`
	Expect  string `json:"expect"`
	Got     string `json:"got"`
	OK      bool   `json:"ok"`
}

// SelftestResult is the verdict and every probe behind it.
type SelftestResult struct {
	Holds      bool    `json:"holds"`
	Sentence   string  `json:"sentence"`
	Roles      int     `json:"roles"`
	Probes     []Probe `json:"probes"`
	At         string  `json:"at"`
	WallMS     int64   `json:"wall_ms"`
	LandlockV  int     `json:"landlock_abi"`
	Refused    string  `json:"refused,omitempty"` // why it did not run
	Background bool    `json:"startup,omitempty"`
	// Controller says what the self-test did to a running controller.
	Controller string `json:"controller,omitempty"`
	// CPUWeights is the broker's word on the roles' CPU weights, as the
	// status has it: "on: ..." or "off: <why>".
	CPUWeights string `json:"cpu_weights,omitempty"`
}

// The rig's phases, as `thermite status` reports them. Only PhaseReady
// serves role commands.
const (
	PhaseStarting       = "starting"        // the broker prepares the rig
	PhaseSelftest       = "self-test"       // the start-up self-test is running
	PhaseController     = "controller-wait" // the self-test held; the controller starts
	PhaseReady          = "ready"           // the controller answers
	PhaseControllerDown = "controller-down" // it ran, and does not answer now
	PhaseRefused        = "refused"         // the start was refused; the broker exits
	PhaseStopping       = "stopping"        // SIGTERM: everything is being stopped
)

// Status is the broker's view of the rig.
type Status struct {
	Phase          string `json:"phase"`
	PhaseWhy       string `json:"phase_why,omitempty"`
	BrokerPID      int    `json:"broker_pid"`
	StartedAt      string `json:"started_at"`
	ControllerPID  int    `json:"controller_pid"`
	ControllerUp   bool   `json:"controller_answers"`
	ControllerRuns int    `json:"controller_starts"`
	StateDir       string `json:"state_dir"`
	Socket         string `json:"socket"`
	LandlockABI    int    `json:"landlock_abi"`
	Cgroup         string `json:"cgroup"`
	// ProcView is /proc as every role sees it: the hidepid option in
	// force, or "none: why" (the kernel policy's proc-hidepid).
	ProcView string `json:"proc_view,omitempty"`
	// CPUWeights says whether the roles' CPU weights hold in the kernel
	// (the rig's own work above the lanes'), and what they are, or "off:
	// <why>".
	CPUWeights string          `json:"cpu_weights"`
	Roles      []RoleStatus    `json:"roles"`
	Selftest   *SelftestResult `json:"selftest,omitempty"`
	GPU        *GPUStatus      `json:"gpu,omitempty"`
	Notes      []string        `json:"notes,omitempty"`
	// Without names the protections this host lacks that the operator
	// accepted (host.accept_lost), each with why it is missing.
	Without []string `json:"without,omitempty"`
	// DiskCheck says how roles' disk use is measured: "quota (…)" where
	// scratch's file system keeps user quotas, else "incremental walk (why
	// no quota)", or "full walk (why no quota; why not incremental)".
	DiskCheck string `json:"disk_check,omitempty"`
	// Starts counts how the broker's one-at-a-time starts went.
	Starts StartStats `json:"starts"`
}

// StartStats counts the broker's starts: each role's commands start one
// at a time, the judge's first and the other roles' in turn by uid.
type StartStats struct {
	Starts uint64 `json:"starts"`
	// Waited is how many found another start under way; MostWaiting the
	// most that waited at once, WaitingNow those waiting now.
	Waited      uint64 `json:"waited"`
	MostWaiting int    `json:"most_waiting"`
	WaitingNow  int    `json:"waiting_now"`
	// JudgeStarts are the judge's (builder's and timing users'), of which
	// JudgeWaited waited and JudgeBehind saw another role's start go
	// first while they waited: 0 while the order holds.
	JudgeStarts uint64 `json:"judge_starts"`
	JudgeWaited uint64 `json:"judge_waited"`
	JudgeBehind uint64 `json:"judge_behind"`
}

// RoleStatus is one role and how many processes its user runs now.
type RoleStatus struct {
	Name      string `json:"name"`
	User      string `json:"user"`
	UID       int    `json:"uid"`
	Processes int    `json:"processes"`
}

// GPUStatus is the layout and who may open which card.
type GPUStatus struct {
	Layout      string     `json:"layout"`
	Usable      bool       `json:"usable"`
	Refused     string     `json:"refused,omitempty"`
	Cards       []GPUCard  `json:"cards"`
	Control     []string   `json:"control_nodes"`
	FenceABI    int        `json:"fence_abi"`
	PermsFixed  bool       `json:"device_permissions_fixable"`
	PermsNote   string     `json:"device_permissions_note,omitempty"`
	Discovery   string     `json:"discovery"`
	Assignments []GPUGrant `json:"grants"`
}

// GPUCard is one discovered card.
type GPUCard struct {
	Index int    `json:"index"`
	Minor int    `json:"minor"`
	UUID  string `json:"uuid"`
	Path  string `json:"path"`
	Group string `json:"group"`
}

// GPUGrant says which roles may open a card.
type GPUGrant struct {
	Card  int      `json:"card"`
	Roles []string `json:"roles"`
}

// Bootstrap is what the broker hands the controller on its inherited pipe
// (BootstrapFD): never in argv or the environment.
type Bootstrap struct {
	Config    json.RawMessage   `json:"config"`
	Secrets   map[string]string `json:"secrets"`
	BrokerPID int               `json:"broker_pid"`
	// APITCP is the address of the harness API's TCP listener, which the
	// controller inherits as descriptor APIListenerFD.
	APITCP string `json:"api_tcp,omitempty"`
	// Egress are the egress proxy's listeners, one per role that may get
	// egress, each on 127.0.0.1 in that role's network namespace; the
	// controller inherits each as descriptor FD.
	Egress []EgressListener `json:"egress,omitempty"`
}

// EgressListener is one role's egress proxy listener: whatever connects
// to it runs in that role's network namespace, so it speaks for the open
// trial of the role's lane.
type EgressListener struct {
	Role string `json:"role"`
	FD   int    `json:"fd"`
	Addr string `json:"addr"`
}

// The controller's descriptors, declared here once for both ends: the
// broker hands each as a named slot (spawn.Slot) and the controller opens
// it by the same constant. Each has its number whatever else the
// configuration gives: with no API listener, descriptor 8 is simply closed.
const (
	// BootstrapFD is the controller's descriptor for its Bootstrap.
	BootstrapFD = 7
	// APIListenerFD is the API's TCP listener (Bootstrap.APITCP).
	APIListenerFD = 8
	// EgressFirstFD is the first egress listener's; the others follow it,
	// and each EgressListener.FD says which is whose.
	EgressFirstFD = 9
)

// ControllerPing is the controller's liveness route on its socket.
const ControllerPing = "/v1/ping"
