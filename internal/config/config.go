// Package config holds the rig's configuration: an optional TOML file whose
// every key has a default, so a rig runs with no file at all.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"thermite/internal/cpuset"
	"thermite/internal/hostpolicy"
	"thermite/internal/netpolicy"
	"thermite/internal/statedir"
)

// DefaultPath is read when no --config is given and the file exists.
const DefaultPath = statedir.DefaultConfig

// Duration is a time.Duration written as "30s" or "10m" in the file.
type Duration struct{ time.Duration }

// UnmarshalText parses a Go duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("not a duration (like \"30s\"): %q", b)
	}
	d.Duration = v
	return nil
}

// MarshalText writes the duration the way the file takes it.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// Limits are the resource limits a role's command gets unless its request
// asks for lower ones. Zero means unlimited where the key says so.
type Limits struct {
	Processes      int      `toml:"processes" json:"processes"`
	OpenFiles      int      `toml:"open_files" json:"open_files"`
	AddressSpaceMB int64    `toml:"address_space_mb" json:"address_space_mb"`
	FileSizeMB     int64    `toml:"file_size_mb" json:"file_size_mb"`
	CPUSeconds     int      `toml:"cpu_seconds" json:"cpu_seconds"`
	WallTimeout    Duration `toml:"wall_timeout" json:"wall_timeout"`
}

// GPU is the GPU layout and its device tree.
type GPU struct {
	Layout      string   `toml:"layout" json:"layout"`
	DevRoot     string   `toml:"dev_root" json:"dev_root"`
	ProcRoot    string   `toml:"proc_root" json:"proc_root"`
	FixInterval Duration `toml:"fix_interval" json:"fix_interval"`
	// FenceMinABI is the Landlock ABI the fence insists on; tests raise it
	// above the kernel's to prove the rig refuses GPU work then.
	FenceMinABI int `toml:"fence_min_abi" json:"fence_min_abi"`
}

// API is the harness API that worker agents' tools call.
type API struct {
	// Socket is the operator's socket of the API, root's alone ("" is
	// state_dir/api/api.sock). Each lane and agent reaches the API on a
	// socket of its own, state_dir/api/<role>/api.sock (RoleAPISocket).
	Socket string `toml:"socket" json:"socket"`
	// TCP is the loopback address it also listens on ("" for none).
	TCP              string   `toml:"tcp" json:"tcp"`
	MaxConnsPerToken int      `toml:"max_conns_per_token" json:"max_conns_per_token"`
	MaxStepBytes     int64    `toml:"max_step_bytes" json:"max_step_bytes"`
	MaxTrialRecorded int64    `toml:"max_trial_recorded" json:"max_trial_recorded"`
	MaxBodyBytes     int64    `toml:"max_body_bytes" json:"max_body_bytes"`
	ExecOutputCap    int64    `toml:"exec_output_cap" json:"exec_output_cap"`
	FetchMaxBytes    int64    `toml:"fetch_max_bytes" json:"fetch_max_bytes"`
	FetchTimeout     Duration `toml:"fetch_timeout" json:"fetch_timeout"`
	// The budgets the API enforces before it reads much, so that one peer
	// cannot take the controller's descriptors or memory from the others.
	// MaxConns bounds the API's open connections, all peers together: at
	// least MaxConnsPerPeer for each of APIPeers, so that no lanes holding
	// their shares together leave another lane none.
	MaxConns int `toml:"max_conns" json:"max_conns"`
	// MaxConnsPerPeer bounds one peer's: one uid on the unix socket, one
	// remote address on TCP.
	MaxConnsPerPeer int `toml:"max_conns_per_peer" json:"max_conns_per_peer"`
	// IdleTimeout closes a kept-alive connection that sends nothing.
	IdleTimeout Duration `toml:"idle_timeout" json:"idle_timeout"`
	// HeaderTimeout bounds reading a request's headers, from its first
	// byte (or the connection's accept); BodyTimeout bounds its body.
	HeaderTimeout Duration `toml:"header_timeout" json:"header_timeout"`
	BodyTimeout   Duration `toml:"body_timeout" json:"body_timeout"`
	// MaxInflightBytes bounds the request bodies being read or held at
	// once, all tokens together; MaxInflightBytesPerToken one token's.
	MaxInflightBytes         int64 `toml:"max_inflight_bytes" json:"max_inflight_bytes"`
	MaxInflightBytesPerToken int64 `toml:"max_inflight_bytes_per_token" json:"max_inflight_bytes_per_token"`
	// MaxRunsPerLane bounds the commands one lane runs through the API's
	// exec at once (its lane's and its agent's calls together): past it
	// the call is refused with 429, so that a lane's exec storm queues
	// only its own commands at the broker.
	MaxRunsPerLane int `toml:"max_runs_per_lane" json:"max_runs_per_lane"`
	// AcceptRate bounds how fast each listener a lane or an agent owns
	// (its API socket, its egress proxy) is accepted on: AcceptBurst at
	// once after a pause, then AcceptRate a second. Past it a connection
	// waits in that listener's own backlog, and past the backlog the
	// role's own connect fails, so a connection flood costs the
	// controller nothing beyond the rate. The operator's socket and TCP
	// are not limited.
	AcceptRate  int `toml:"accept_rate" json:"accept_rate"`
	AcceptBurst int `toml:"accept_burst" json:"accept_burst"`
	// RequestRate bounds each lane's and each agent's requests, on its
	// own API socket and its egress proxy together: RequestBurst at once,
	// then RequestRate a second. Past it a request is answered 429 before
	// its token is looked up or its body read, and its connection closed.
	RequestRate  int `toml:"request_rate" json:"request_rate"`
	RequestBurst int `toml:"request_burst" json:"request_burst"`
}

// Cgroup is the per-role cgroup every command of a role runs in.
type Cgroup struct {
	// Enabled false runs commands without cgroups (rlimits only); the
	// broker says so in its status and its self-test.
	Enabled  bool  `toml:"enabled" json:"enabled"`
	MemoryMB int64 `toml:"memory_mb" json:"memory_mb"` // a role's processes together, no swap
	Pids     int64 `toml:"pids" json:"pids"`           // a role's tasks together
	// ControllerMemoryMB and ControllerPids bound the controller daemon's
	// own group (it and a kit's check): a flood it parses cannot take the
	// host's memory or tasks.
	ControllerMemoryMB int64 `toml:"controller_memory_mb" json:"controller_memory_mb"`
	ControllerPids     int64 `toml:"controller_pids" json:"controller_pids"`
}

// Trial bounds a trial's disk.
type Trial struct {
	DiskCapMB int64    `toml:"disk_cap_mb" json:"disk_cap_mb"`
	DiskCheck Duration `toml:"disk_check" json:"disk_check"`
	// RetainEnded is how long an ended trial's folder (its workspace and
	// agent folder, root's alone once it ends) is kept before it is
	// removed in the background; 0 removes it as soon as the trial ends.
	// The ledger and the published research area are kept regardless.
	RetainEnded Duration `toml:"retain_ended" json:"retain_ended"`
	// FetchArchiveMB bounds what a trial's fetches archive in the run's
	// research folder (bodies and their metadata): the controller writes
	// them, so no folder of the lane's counts them.
	FetchArchiveMB int64 `toml:"fetch_archive_mb" json:"fetch_archive_mb"`
}

// Agent bounds a trial's worker agent (`thermite trial agent`): a run of
// hours, its output streamed to the operator, apart from the limits of a
// lane's commands.
type Agent struct {
	// WallTimeout is the longest an agent's run may last (a request may
	// ask for less); it is the default too.
	WallTimeout Duration `toml:"wall_timeout" json:"wall_timeout"`
	// OutputCapMB caps the output streamed back (0: none).
	OutputCapMB int64 `toml:"output_cap_mb" json:"output_cap_mb"`
	// Egress are the host:port pairs (a model provider's) that the
	// controller's egress proxy connects a trial's agent to; none by
	// default. A host that is a name must resolve to a public address; an
	// IP literal is taken as the operator's own choice.
	Egress []string `toml:"egress" json:"egress"`
	// EgressPort is the egress proxy's port on 127.0.0.1 inside each
	// agent's network namespace (HTTPS_PROXY=http://127.0.0.1:PORT), used
	// only where Egress lists providers.
	EgressPort int `toml:"egress_port" json:"egress_port"`
	// PiExtension is thermite's extension for Pi (agents/pi/thermite.ts,
	// which `make agents` installs root-owned 0644): agent-N's Pi loads it
	// and its tools act through the harness API as the lane. A Pi run of
	// the pi harness is refused while it is missing, not root's, or
	// writable by others.
	PiExtension string `toml:"pi_extension" json:"pi_extension"`
}

// DefaultPiExtension is where `make agents` installs thermite's extension
// for Pi (THERMITE_AGENTS/pi-extension/thermite.ts).
const DefaultPiExtension = "/opt/thermite/agents/pi-extension/thermite.ts"

// Judge bounds the disk the judge's commands hold.
type Judge struct {
	// BuildDiskMB bounds a build: its folder, builder's HOME and TMPDIR,
	// and the unlinked files builder's processes keep open.
	BuildDiskMB int64 `toml:"build_disk_mb" json:"build_disk_mb"`
	// RunOutMB bounds a timed run: its out/, the timing user's HOME and
	// TMPDIR, and the unlinked files its processes keep open.
	RunOutMB int64 `toml:"run_out_mb" json:"run_out_mb"`
	// DiskCheck is how often both are measured while the command runs; it
	// is measured once more when the command ends.
	DiskCheck Duration `toml:"disk_check" json:"disk_check"`
}

// Image describes the container the rig runs in: the one-container image
// (RunPod) keeps the supervisor beside the roles.
type Image struct {
	// OneContainer turns on the self-test's image rows: no set-id file
	// anywhere in the image, control's key in place.
	OneContainer  bool   `toml:"one_container" json:"one_container"`
	SupervisorDir string `toml:"supervisor_dir" json:"supervisor_dir"` // the supervisor's own folder (its token)
	Inbox         string `toml:"inbox" json:"inbox"`                   // the supervisor fills it; the controller's group reads
	Outbox        string `toml:"outbox" json:"outbox"`                 // the harness fills it; the supervisor's group reads
	// ScanRoot is where the set-id scan starts (its file system only).
	ScanRoot string `toml:"scan_root" json:"scan_root"`
}

// Host is where the rig check (`thermite check`) reads the host's settings:
// the real /proc and /sys, or stand-in trees in tests.
type Host struct {
	ProcRoot string `toml:"proc_root" json:"proc_root"`
	SysRoot  string `toml:"sys_root" json:"sys_root"`
	// SetIDDirs are the folders searched (two levels deep) for set-id
	// files that roles could run.
	SetIDDirs []string `toml:"setid_dirs" json:"setid_dirs"`
	// AcceptLost names the protections this host lacks that the rig may
	// run without (internal/hostpolicy); each is named in the status and
	// the self-test's verdict. Empty: a host that lacks one is refused.
	AcceptLost []string `toml:"accept_lost" json:"accept_lost"`
}

// Config is the whole effective configuration.
type Config struct {
	StateDir        string   `toml:"state_dir" json:"state_dir"`
	SecretsDir      string   `toml:"secrets_dir" json:"secrets_dir"`
	RolePrefix      string   `toml:"role_prefix" json:"role_prefix"`
	UIDBase         int      `toml:"uid_base" json:"uid_base"`
	Lanes           int      `toml:"lanes" json:"lanes"`
	TimingUsers     int      `toml:"timing_users" json:"timing_users"`
	ClosedTmp       []string `toml:"closed_tmp" json:"closed_tmp"`
	JudgeCPUs       string   `toml:"judge_cpus" json:"judge_cpus"`
	StartupSelftest string   `toml:"startup_selftest" json:"startup_selftest"`
	Limits          Limits   `toml:"limits" json:"limits"`
	GPU             GPU      `toml:"gpu" json:"gpu"`
	API             API      `toml:"api" json:"api"`
	// Network overrides a kind of role's network policy (none, api, open).
	Network map[string]netpolicy.Network `toml:"network" json:"network"`
	// Perf lists the kinds of role that may use perf_event_open.
	Perf   []string `toml:"perf" json:"perf"`
	Cgroup Cgroup   `toml:"cgroup" json:"cgroup"`
	Trial  Trial    `toml:"trial" json:"trial"`
	Agent  Agent    `toml:"agent" json:"agent"`
	Judge  Judge    `toml:"judge" json:"judge"`
	Image  Image    `toml:"image" json:"image"`
	Host   Host     `toml:"host" json:"host"`
	// StripEnvPrefixes names the host's variables (RunPod's among them)
	// that `thermite serve` removes from its environment before anything
	// else starts.
	StripEnvPrefixes []string `toml:"strip_env_prefixes" json:"strip_env_prefixes"`

	// Source is the file the configuration came from, or "" for defaults.
	Source string `toml:"-" json:"source"`
}

// Default returns the configuration a rig gets with no file.
func Default() Config {
	return Config{
		StateDir:        statedir.Default,
		SecretsDir:      "/etc/thermite/secrets",
		RolePrefix:      "",
		UIDBase:         20000,
		Lanes:           16,
		TimingUsers:     1,
		ClosedTmp:       []string{"/tmp", "/var/tmp", "/dev/shm"},
		JudgeCPUs:       "auto",
		StartupSelftest: "refuse",
		Limits: Limits{
			Processes:   512,
			OpenFiles:   1024,
			WallTimeout: Duration{10 * time.Minute},
		},
		GPU: GPU{
			Layout:      "none",
			DevRoot:     "/dev",
			ProcRoot:    "/proc",
			FixInterval: Duration{30 * time.Second},
			FenceMinABI: 5,
		},
		Host: Host{
			ProcRoot:  "/proc",
			SysRoot:   "/sys",
			SetIDDirs: []string{"/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/lib", "/usr/libexec", "/usr/local/bin", "/usr/local/sbin"},
		},
		Network: map[string]netpolicy.Network{},
		Perf:    []string{},
		Cgroup:  Cgroup{Enabled: true, MemoryMB: 4096, Pids: 1024, ControllerMemoryMB: 2048, ControllerPids: 1024},
		Trial:   Trial{DiskCapMB: 5120, DiskCheck: Duration{2 * time.Second}, RetainEnded: Duration{24 * time.Hour}, FetchArchiveMB: 256},
		Agent:   Agent{WallTimeout: Duration{12 * time.Hour}, EgressPort: 3128, PiExtension: DefaultPiExtension},
		Judge:   Judge{BuildDiskMB: 8192, RunOutMB: 2048, DiskCheck: Duration{500 * time.Millisecond}},
		Image: Image{
			SupervisorDir: "/var/lib/thermite-supervisor",
			Inbox:         "/var/lib/thermite-inbox",
			Outbox:        "/var/lib/thermite-outbox",
			ScanRoot:      "/",
		},
		StripEnvPrefixes: []string{"RUNPOD_"},
		API: API{
			TCP:              "127.0.0.1:7700",
			MaxConnsPerToken: 256,
			MaxStepBytes:     64 << 10,
			MaxTrialRecorded: 20 << 20,
			MaxBodyBytes:     16 << 20,
			ExecOutputCap:    1 << 20,
			FetchMaxBytes:    5 << 20,
			FetchTimeout:     Duration{20 * time.Second},

			MaxConns:                 8192,
			MaxConnsPerPeer:          64,
			IdleTimeout:              Duration{30 * time.Second},
			HeaderTimeout:            Duration{5 * time.Second},
			BodyTimeout:              Duration{30 * time.Second},
			MaxInflightBytes:         256 << 20,
			MaxInflightBytesPerToken: 32 << 20,
			MaxRunsPerLane:           8,
			AcceptRate:               100,
			AcceptBurst:              200,
			RequestRate:              100,
			RequestBurst:             200,
		},
	}
}

// Load reads the file at path, or DefaultPath when path is "" and that file
// exists, over the defaults, and checks every value.
func Load(path string) (Config, error) {
	c := Default()
	explicit := path != ""
	if !explicit {
		if _, err := os.Stat(DefaultPath); err == nil {
			path = DefaultPath
		}
	}
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			if !explicit && errors.Is(err, os.ErrNotExist) {
				return c, c.Validate()
			}
			return c, fmt.Errorf("config: %w", err)
		}
		md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&c)
		if err != nil {
			return c, fmt.Errorf("config %s: %w", path, err)
		}
		if und := md.Undecoded(); len(und) > 0 {
			return c, fmt.Errorf("config %s: unknown key %q", path, und[0].String())
		}
		c.Source = path
	}
	if err := c.Validate(); err != nil {
		if c.Source != "" {
			return c, fmt.Errorf("config %s: %w", c.Source, err)
		}
		return c, fmt.Errorf("config: %w", err)
	}
	return c, nil
}

// validPrefix is a user-name prefix: lower-case letters, digits, _ and -,
// at most 16, not starting with a digit or -.
func validPrefix(p string) bool {
	if len(p) > 16 {
		return false
	}
	for i, c := range p {
		switch {
		case c == '_', c >= 'a' && c <= 'z':
		case (c >= '0' && c <= '9' || c == '-') && i > 0:
		default:
			return false
		}
	}
	return true
}

// cleanAbs is a path the rig can hand the kernel as it is: absolute,
// clean, and without a NUL byte (which no system call takes).
func cleanAbs(p string) bool {
	return filepath.IsAbs(p) && filepath.Clean(p) == p && !strings.ContainsRune(p, 0)
}

// APIPeers is how many peers the API's connection budget serves, each up
// to api.max_conns_per_peer: every lane's and agent's own socket (one uid
// each), with agent.egress every lane's and agent's egress proxy too, and
// root on the operator's socket and on TCP.
func APIPeers(lanes int, egress bool) int {
	n := 2*lanes + 2
	if egress {
		n += 2 * lanes
	}
	return n
}

// MaxLanes bounds lanes and timing users: each kind has 99 uids in the layout.
const MaxLanes = 99

// Validate checks every value and names the key at fault: each section's
// check in turn, the first fault found returned.
func (c *Config) Validate() error {
	for _, check := range sectionChecks {
		if err := check(c); err != nil {
			return err
		}
	}
	return nil
}

// sectionChecks are Validate's checks, one a section of the file.
var sectionChecks = []func(*Config) error{
	(*Config).validateRoots,
	(*Config).validateRoles,
	(*Config).validateClosedTmp,
	(*Config).validateStartup,
	(*Config).validateAgent,
	(*Config).validateLimits,
	(*Config).validateGPU,
	(*Config).validateAPI,
	(*Config).validateNetwork,
	(*Config).validateHost,
	(*Config).validateCgroup,
	(*Config).validateTrial,
	(*Config).validateJudge,
	(*Config).validateImage,
}

// validateRoots checks the top-level folders and the host roots: clean
// absolute paths, state_dir not /.
func (c *Config) validateRoots() error {
	for key, p := range map[string]string{"state_dir": c.StateDir, "secrets_dir": c.SecretsDir, "gpu.dev_root": c.GPU.DevRoot, "gpu.proc_root": c.GPU.ProcRoot, "host.proc_root": c.Host.ProcRoot, "host.sys_root": c.Host.SysRoot} {
		if !cleanAbs(p) {
			return fmt.Errorf("%s: %q is not a clean absolute path", key, p)
		}
	}
	if c.StateDir == "/" {
		return fmt.Errorf("state_dir: must not be /")
	}
	return nil
}

// validateRoles checks role_prefix, uid_base, lanes and timing_users: the
// role users' names and uids.
func (c *Config) validateRoles() error {
	if !validPrefix(c.RolePrefix) {
		return fmt.Errorf("role_prefix: %q is not a user-name prefix (lower-case letters, digits, _ and -, at most 16)", c.RolePrefix)
	}
	if c.UIDBase < 1000 || c.UIDBase > 4_000_000_000 {
		return fmt.Errorf("uid_base: %d is out of range 1000..4000000000", c.UIDBase)
	}
	if c.Lanes < 1 || c.Lanes > MaxLanes {
		return fmt.Errorf("lanes: %d is out of range 1..%d", c.Lanes, MaxLanes)
	}
	if c.TimingUsers < 1 || c.TimingUsers > 90 {
		return fmt.Errorf("timing_users: %d is out of range 1..90", c.TimingUsers)
	}
	return nil
}

// validateClosedTmp checks closed_tmp: distinct clean paths, none holding
// state_dir.
func (c *Config) validateClosedTmp() error {
	seen := map[string]bool{}
	for _, p := range c.ClosedTmp {
		if !cleanAbs(p) || p == "/" {
			return fmt.Errorf("closed_tmp: %q is not a clean absolute path other than /", p)
		}
		if seen[p] {
			return fmt.Errorf("closed_tmp: %q is listed twice", p)
		}
		seen[p] = true
		if strings.HasPrefix(c.StateDir+"/", p+"/") {
			return fmt.Errorf("closed_tmp: %q holds state_dir %q, which roles must reach", p, c.StateDir)
		}
	}
	return nil
}

// validateStartup checks judge_cpus and startup_selftest.
func (c *Config) validateStartup() error {
	if _, err := c.JudgeCPUSet(); err != nil {
		return fmt.Errorf("judge_cpus: %w", err)
	}
	switch c.StartupSelftest {
	case "refuse", "warn":
	default:
		return fmt.Errorf("startup_selftest: %q is not one of refuse, warn", c.StartupSelftest)
	}
	return nil
}

// validateAgent checks the [agent] section and its egress list.
func (c *Config) validateAgent() error {
	switch {
	case c.Agent.WallTimeout.Duration <= 0:
		return fmt.Errorf("agent.wall_timeout: %s must be more than 0", c.Agent.WallTimeout)
	case c.Agent.OutputCapMB < 0:
		return fmt.Errorf("agent.output_cap_mb: %d must be 0 (no cap) or more", c.Agent.OutputCapMB)
	case c.Agent.EgressPort < 1 || c.Agent.EgressPort > 65535:
		return fmt.Errorf("agent.egress_port: %d is not a TCP port (1 to 65535)", c.Agent.EgressPort)
	case !filepath.IsAbs(c.Agent.PiExtension):
		return fmt.Errorf("agent.pi_extension: %q is not an absolute path", c.Agent.PiExtension)
	}
	egress := map[string]bool{}
	for _, hp := range c.Agent.Egress {
		host, port, err := net.SplitHostPort(hp)
		n, perr := strconv.Atoi(port)
		if err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
			return fmt.Errorf("agent.egress: %q is not host:port (such as \"api.anthropic.com:443\")", hp)
		}
		if egress[strings.ToLower(hp)] {
			return fmt.Errorf("agent.egress: %q is listed twice", hp)
		}
		egress[strings.ToLower(hp)] = true
	}
	return nil
}

// validateLimits checks the [limits] section: every command's rlimits and
// wall time.
func (c *Config) validateLimits() error {
	l := c.Limits
	switch {
	case l.Processes < 1:
		return fmt.Errorf("limits.processes: %d must be at least 1", l.Processes)
	case l.OpenFiles < 4:
		return fmt.Errorf("limits.open_files: %d must be at least 4", l.OpenFiles)
	case l.AddressSpaceMB < 0:
		return fmt.Errorf("limits.address_space_mb: %d must be 0 (unlimited) or more", l.AddressSpaceMB)
	case l.FileSizeMB < 0:
		return fmt.Errorf("limits.file_size_mb: %d must be 0 (unlimited) or more", l.FileSizeMB)
	case l.CPUSeconds < 0:
		return fmt.Errorf("limits.cpu_seconds: %d must be 0 (unlimited) or more", l.CPUSeconds)
	case l.WallTimeout.Duration <= 0:
		return fmt.Errorf("limits.wall_timeout: %s must be more than 0", l.WallTimeout)
	}
	return nil
}

// validateGPU checks the [gpu] section: layout, fix interval and the
// fence's Landlock ABI.
func (c *Config) validateGPU() error {
	switch c.GPU.Layout {
	case "none", "shared", "dedicated":
	default:
		return fmt.Errorf("gpu.layout: %q is not one of none, shared, dedicated", c.GPU.Layout)
	}
	if c.GPU.FixInterval.Duration < time.Second {
		return fmt.Errorf("gpu.fix_interval: %s must be at least 1s", c.GPU.FixInterval)
	}
	if c.GPU.FenceMinABI < 5 {
		return fmt.Errorf("gpu.fence_min_abi: %d is below 5, the first ABI with IOCTL_DEV", c.GPU.FenceMinABI)
	}
	return nil
}

// validateAPI checks the [api] section: socket, TCP address and the
// harness API's bounds.
func (c *Config) validateAPI() error {
	a := c.API
	switch {
	case a.Socket != "" && !cleanAbs(a.Socket):
		return fmt.Errorf("api.socket: %q is not a clean absolute path", a.Socket)
	case a.MaxConnsPerToken < 1:
		return fmt.Errorf("api.max_conns_per_token: %d must be at least 1", a.MaxConnsPerToken)
	case a.MaxStepBytes < 1 || a.MaxTrialRecorded < a.MaxStepBytes:
		return fmt.Errorf("api.max_step_bytes: %d must be at least 1 and at most api.max_trial_recorded (%d)", a.MaxStepBytes, a.MaxTrialRecorded)
	case a.MaxBodyBytes < 1024:
		return fmt.Errorf("api.max_body_bytes: %d must be at least 1024", a.MaxBodyBytes)
	case a.ExecOutputCap < 1:
		return fmt.Errorf("api.exec_output_cap: %d must be at least 1", a.ExecOutputCap)
	case a.FetchMaxBytes < 1:
		return fmt.Errorf("api.fetch_max_bytes: %d must be at least 1", a.FetchMaxBytes)
	case a.FetchTimeout.Duration <= 0:
		return fmt.Errorf("api.fetch_timeout: %s must be more than 0", a.FetchTimeout)
	case a.MaxConns < 1:
		return fmt.Errorf("api.max_conns: %d must be at least 1", a.MaxConns)
	case a.MaxConnsPerPeer < 1 || a.MaxConnsPerPeer > a.MaxConns:
		return fmt.Errorf("api.max_conns_per_peer: %d must be at least 1 and at most api.max_conns (%d)", a.MaxConnsPerPeer, a.MaxConns)
	case a.IdleTimeout.Duration <= 0:
		return fmt.Errorf("api.idle_timeout: %s must be more than 0", a.IdleTimeout)
	case a.HeaderTimeout.Duration <= 0:
		return fmt.Errorf("api.header_timeout: %s must be more than 0", a.HeaderTimeout)
	case a.BodyTimeout.Duration <= 0:
		return fmt.Errorf("api.body_timeout: %s must be more than 0", a.BodyTimeout)
	case a.MaxInflightBytesPerToken < a.MaxBodyBytes:
		return fmt.Errorf("api.max_inflight_bytes_per_token: %d must be at least api.max_body_bytes (%d), or the largest body could never be read", a.MaxInflightBytesPerToken, a.MaxBodyBytes)
	case a.MaxInflightBytes < a.MaxInflightBytesPerToken:
		return fmt.Errorf("api.max_inflight_bytes: %d must be at least api.max_inflight_bytes_per_token (%d)", a.MaxInflightBytes, a.MaxInflightBytesPerToken)
	case a.MaxRunsPerLane < 1 || a.MaxRunsPerLane > a.MaxConnsPerToken:
		return fmt.Errorf("api.max_runs_per_lane: %d must be at least 1 and at most api.max_conns_per_token (%d)", a.MaxRunsPerLane, a.MaxConnsPerToken)
	case a.AcceptRate < 1:
		return fmt.Errorf("api.accept_rate: %d must be at least 1 (connections a second)", a.AcceptRate)
	case a.AcceptBurst < 1:
		return fmt.Errorf("api.accept_burst: %d must be at least 1", a.AcceptBurst)
	case a.RequestRate < 1:
		return fmt.Errorf("api.request_rate: %d must be at least 1 (requests a second)", a.RequestRate)
	case a.RequestBurst < 1:
		return fmt.Errorf("api.request_burst: %d must be at least 1", a.RequestBurst)
	}
	if peers := APIPeers(c.Lanes, len(c.Agent.Egress) > 0); a.MaxConns < peers*a.MaxConnsPerPeer {
		return fmt.Errorf("api.max_conns: %d is less than api.max_conns_per_peer (%d) for each of the API's %d peers (%d lanes' and agents' sockets%s, root's socket and TCP): lanes holding their shares would leave another lane none; raise api.max_conns to %d or lower api.max_conns_per_peer", a.MaxConns, a.MaxConnsPerPeer, peers, c.Lanes, map[bool]string{true: " and egress proxies", false: ""}[len(c.Agent.Egress) > 0], peers*a.MaxConnsPerPeer)
	}
	if a.TCP != "" {
		host, port, err := net.SplitHostPort(a.TCP)
		ip, perr := netip.ParseAddr(host)
		if err != nil || perr != nil || !ip.IsLoopback() || port == "" {
			return fmt.Errorf("api.tcp: %q is not a loopback address:port", a.TCP)
		}
	}
	return nil
}

// validateNetwork checks [network] and perf: each names a kind of role.
func (c *Config) validateNetwork() error {
	kinds := map[string]bool{"controller": true, "builder": true, "timing": true, "planner": true, "model-check": true, "lane": true, "agent": true, "supervisor": true}
	for k, v := range c.Network {
		if !kinds[k] {
			return fmt.Errorf("network.%s: no such kind of role (controller, builder, timing, planner, model-check, lane, agent, supervisor)", k)
		}
		if err := v.Check("network." + k); err != nil {
			return err
		}
	}
	for _, k := range c.Perf {
		if !kinds[k] {
			return fmt.Errorf("perf: %q is no kind of role", k)
		}
	}
	return nil
}

// validateHost checks [host]: the host protections the operator accepts
// losing.
func (c *Config) validateHost() error {
	return hostpolicy.Validate(c.Host.AcceptLost)
}

// validateCgroup checks the [cgroup] section.
func (c *Config) validateCgroup() error {
	if c.Cgroup.MemoryMB < 0 || c.Cgroup.Pids < 0 {
		return fmt.Errorf("cgroup.memory_mb and cgroup.pids: must be 0 (no limit) or more")
	}
	if c.Cgroup.ControllerMemoryMB < 64 {
		return fmt.Errorf("cgroup.controller_memory_mb: %d must be at least 64 (the controller's own memory, no swap)", c.Cgroup.ControllerMemoryMB)
	}
	if c.Cgroup.ControllerPids < 64 {
		return fmt.Errorf("cgroup.controller_pids: %d must be at least 64 (the controller's threads and a kit's check)", c.Cgroup.ControllerPids)
	}
	return nil
}

// validateTrial checks the [trial] section.
func (c *Config) validateTrial() error {
	if c.Trial.DiskCapMB < 1 {
		return fmt.Errorf("trial.disk_cap_mb: %d must be at least 1", c.Trial.DiskCapMB)
	}
	if c.Trial.DiskCheck.Duration < 100*time.Millisecond {
		return fmt.Errorf("trial.disk_check: %s must be at least 100ms", c.Trial.DiskCheck)
	}
	if c.Trial.RetainEnded.Duration < 0 {
		return fmt.Errorf("trial.retain_ended: %s must be 0 (remove at once) or more", c.Trial.RetainEnded)
	}
	if c.Trial.FetchArchiveMB < 1 {
		return fmt.Errorf("trial.fetch_archive_mb: %d must be at least 1", c.Trial.FetchArchiveMB)
	}
	return nil
}

// validateJudge checks the [judge] section.
func (c *Config) validateJudge() error {
	if c.Judge.BuildDiskMB < 1 {
		return fmt.Errorf("judge.build_disk_mb: %d must be at least 1", c.Judge.BuildDiskMB)
	}
	if c.Judge.RunOutMB < 1 {
		return fmt.Errorf("judge.run_out_mb: %d must be at least 1", c.Judge.RunOutMB)
	}
	if c.Judge.DiskCheck.Duration < 100*time.Millisecond {
		return fmt.Errorf("judge.disk_check: %s must be at least 100ms", c.Judge.DiskCheck)
	}
	return nil
}

// validateImage checks the [image] section and strip_env_prefixes, which
// the one-container image needs.
func (c *Config) validateImage() error {
	for key, p := range map[string]string{"image.supervisor_dir": c.Image.SupervisorDir, "image.inbox": c.Image.Inbox, "image.outbox": c.Image.Outbox} {
		if p != "" && !cleanAbs(p) {
			return fmt.Errorf("%s: %q is not a clean absolute path", key, p)
		}
	}
	runpod := false
	for _, p := range c.StripEnvPrefixes {
		if p == "" || strings.ContainsAny(p, "= ") {
			return fmt.Errorf("strip_env_prefixes: %q is not a variable-name prefix", p)
		}
		if p == "RUNPOD_" {
			runpod = true
		}
	}
	if c.Image.OneContainer && !runpod {
		return fmt.Errorf("strip_env_prefixes: the one-container image must strip RUNPOD_ (image.one_container is true)")
	}
	return nil
}

// JudgeCPUSet is the CPUs reserved for timed runs. "auto" is the highest
// CPUs this process may run on, one per timing user, always leaving at
// least one CPU to the other roles (so on a machine with too few CPUs the
// last cards have none, and their timed runs are refused, saying so).
func (c *Config) JudgeCPUSet() (cpuset.Set, error) {
	if c.JudgeCPUs == "auto" {
		online, err := cpuset.Online()
		if err != nil {
			return nil, err
		}
		if len(online) == 0 {
			return nil, fmt.Errorf("no CPU is online")
		}
		n := max(1, min(max(1, c.TimingUsers), len(online)-1))
		return append(cpuset.Set(nil), online[len(online)-n:]...), nil
	}
	s, err := cpuset.Parse(c.JudgeCPUs)
	if err != nil {
		return nil, err
	}
	if len(s) == 0 {
		return nil, fmt.Errorf("%q names no CPU", c.JudgeCPUs)
	}
	return s, nil
}

// JudgeCPUsOf is the judge CPUs of one timing user, by its card (0 for
// run, n-1 for run-n): judge_cpus split into timing_users equal parts in
// order, so timed runs on different cards never share a CPU. Where there
// are fewer judge CPUs than timing users, the first cards get one each
// and the others none: their timed runs are refused, naming the layout.
func (c *Config) JudgeCPUsOf(card int) (cpuset.Set, error) {
	judge, err := c.JudgeCPUSet()
	if err != nil {
		return nil, fmt.Errorf("judge_cpus: %w", err)
	}
	if card < 0 {
		card = 0
	}
	per := max(1, len(judge)/max(1, c.TimingUsers))
	lo := card * per
	if lo+per > len(judge) {
		return nil, fmt.Errorf("judge_cpus %s gives %d CPUs for timing_users = %d: card %d has no judge CPU of its own (each card's timed runs need their own); give judge_cpus at least %d CPUs or lower timing_users", judge, len(judge), c.TimingUsers, card, c.TimingUsers)
	}
	return judge[lo : lo+per], nil
}

// Paths under the state dir, one place for every consumer.

func (c *Config) BrokerDir() string     { return filepath.Join(c.StateDir, "broker") }
func (c *Config) BrokerSocket() string  { return statedir.BrokerSocket(c.StateDir) }
func (c *Config) ControllerDir() string { return filepath.Join(c.StateDir, "controller") }
func (c *Config) ControllerSocket() string {
	return filepath.Join(c.StateDir, "controller", "controller.sock")
}
func (c *Config) StoreDir() string { return filepath.Join(c.StateDir, "store") }
func (c *Config) APIDir() string   { return filepath.Join(c.StateDir, "api") }

// APISocket is the harness API's operator socket: root's alone.
func (c *Config) APISocket() string {
	if c.API.Socket != "" {
		return c.API.Socket
	}
	return filepath.Join(c.StateDir, "api", "api.sock")
}

// RoleAPIDir is the folder of one lane's or agent's own API socket: the
// controller's, its group the role's, 0710, so that only that role (and
// the controller) may pass through it to the socket.
func (c *Config) RoleAPIDir(role string) string { return filepath.Join(c.APIDir(), role) }

// RoleAPISocket is one lane's or agent's own socket of the harness API:
// its own listener, backlog and connection budget, served only to that
// role's uid and its lane's trials' tokens.
func (c *Config) RoleAPISocket(role string) string {
	return filepath.Join(c.RoleAPIDir(role), "api.sock")
}
func (c *Config) ScratchDir() string  { return filepath.Join(c.StateDir, "scratch") }
func (c *Config) ResearchDir() string { return filepath.Join(c.StateDir, "research") }

// Encode writes the configuration as TOML, the form `thermite config` prints.
func (c *Config) Encode() (string, error) {
	var b bytes.Buffer
	if c.Source != "" {
		fmt.Fprintf(&b, "# from %s\n", c.Source)
	} else {
		b.WriteString("# defaults: no config file\n")
	}
	if err := toml.NewEncoder(&b).Encode(c); err != nil {
		return "", err
	}
	return b.String(), nil
}

// ControlKey is where the broker installs control's key: root's, readable
// by the controller's group.
func (c *Config) ControlKey() string { return filepath.Join(c.StateDir, "control", "key") }
