// Package broker is the root side of thermite: it prepares the rig, serves
// a small closed RPC to the controller, runs commands as role users, stops
// their processes, and supervises the controller. It never runs anything
// as root.
package broker

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/caps"
	"thermite/internal/config"
	"thermite/internal/cpuset"
	"thermite/internal/hostpolicy"
	"thermite/internal/landlock"
	"thermite/internal/procs"
	"thermite/internal/rpc"
	"thermite/internal/weaken"
	"thermite/roles"
)

// Arg is the hidden subcommand the broker re-execs itself as, once its
// capabilities are reduced.
const Arg = "__broker"

// Broker is the running broker. It keeps what ties its rooms together;
// each room's state is a sub-object beside that room's code: the holds
// (holds.go), the stop path (stop.go), the disk measure (measure.go), the
// cgroups (cgroups.go), the controller's supervision (controller.go), the
// self-test (selftest.go), the closed places (state.go).
type Broker struct {
	cfg     config.Config
	table   *roles.Table
	log     *slog.Logger
	exe     string
	reaper  *reaper
	devnull *os.File
	secrets map[string]string

	// cpus are the CPUs this broker may use and the judge's among them.
	cpus cpuLayout
	// kernel is what the kernel and the cgroup tree give (internal/hostpolicy).
	kernel hostpolicy.Host
	// procHideErr is why `thermite serve` could not mount the broker's own
	// /proc with hidepid (HideProcesses), "" when it did.
	procHideErr string

	gpu gpuState
	// ruleSets are every role command's built Landlock rule sets; a
	// command holds its own until spawn.Start's child has exec'd.
	ruleSets  landlock.Cache
	listeners listenerSet
	cgroups   cgroupState
	ctl       ctlState
	life      lifeState
	closed    closedState

	// mu guards handed, notes, and each sub-object's fields that say
	// they are under b.mu.
	mu     sync.Mutex
	handed map[int]map[string]bool // folders handed to each role's uid
	notes  []string

	measure measureState
	holds   holdSet
	stops   stopState
	self    selftestState
	// starts orders the broker's starts, one at a time (startgate.go).
	starts startGate
}

// listenerSet is what the broker listens on for others.
type listenerSet struct {
	// api is the harness API's TCP listener (for a supervisor outside the
	// roles; lanes and agents use the unix socket), made here so its port
	// is known for the self-test, and handed to every controller.
	api     *net.TCPListener
	apiPort int
	// egress are the network namespaces of the roles that may get egress,
	// by role name (netns.go); none without agent.egress.
	egress map[string]*egressNet
}

// lifeState is where the broker is in its life: starting, serving,
// stopping.
type lifeState struct {
	stopping atomic.Bool
	stopCh   chan struct{}
	// stopFD is an eventfd that becomes readable, for good, when stopCh
	// closes: what a command's wait (awaitEnd) polls beside its pidfd.
	stopFD   int
	phase    string // rpc.Phase…, under b.mu
	phaseWhy string
	started  time.Time
}

// New prepares a broker for cfg; Serve runs it.
func New(cfg config.Config, log *slog.Logger) (*Broker, error) {
	table, err := roles.FromConfig(cfg)
	if err != nil {
		return nil, err
	}
	stopFD, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("broker: eventfd: %w", err)
	}
	return &Broker{
		cfg: cfg, table: table, log: log,
		exe:     ownExe,
		life:    lifeState{stopCh: make(chan struct{}), stopFD: stopFD},
		stops:   stopState{userLocks: map[int]*sync.Mutex{}, stopLocks: map[int]*sync.Mutex{}},
		measure: measureState{ownExec: map[int]bool{}, runGen: map[int]uint64{}, usage: map[int]keptUsage{}, starting: map[int]bool{}},
		handed:  map[int]map[string]bool{},
		holds:   newHoldSet(),
	}, nil
}

// Serve runs the broker's start-up, in order, each step failing closed,
// then serves until SIGTERM or SIGINT. A refused start undoes what it did:
// the closed places are opened again and the socket is removed.
func (b *Broker) Serve() (err error) {
	b.life.started = time.Now()
	b.setPhase(rpc.PhaseStarting, "")
	unix.Umask(0o077)
	notify := newNotifier(b.log)
	defer func() {
		if err != nil {
			b.setPhase(rpc.PhaseRefused, err.Error())
			notify.send("STATUS=refused: " + oneLine(err.Error()))
			b.reopenTmp()
		}
	}()
	if err := b.runStartSteps(preparationSteps); err != nil {
		return err
	}
	b.initCgroups()
	defer b.closeCgroups()
	if err := b.runStartSteps(kernelSteps); err != nil {
		return err
	}
	l, err := b.listen()
	if err != nil {
		return err
	}
	defer os.Remove(b.cfg.BrokerSocket())
	// The places close last, once nothing else can refuse the start but
	// the self-test, whose refusal opens them again.
	if err := b.closeTmp(); err != nil {
		l.Close()
		return err
	}
	go b.serve(l)
	b.log.Info("broker serving", "socket", b.cfg.BrokerSocket(), "pid", os.Getpid(), "roles", len(b.table.Roles))

	b.setPhase(rpc.PhaseSelftest, "")
	notify.send("STATUS=isolation self-test")
	if err := b.startupSelftest(); err != nil {
		b.shutdown(l)
		return err
	}

	b.superviseUntilSignal(l, notify)
	return nil
}

// runStartSteps runs steps in order; the first refusal ends the start.
func (b *Broker) runStartSteps(steps []func(*Broker) error) error {
	for _, step := range steps {
		if err := step(b); err != nil {
			return err
		}
	}
	return nil
}

// preparationSteps are the start-up's steps before the cgroups: the
// broker's own capabilities and process, the host's users, CPUs and
// folders, leftovers stopped, the state and the secrets read.
var preparationSteps = []func(*Broker) error{
	(*Broker).checkOwnCaps,
	(*Broker).becomeSubreaper,
	(*Broker).openDevNull,
	(*Broker).readCPUs,
	(*Broker).checkUsers,
	func(b *Broker) error { return checkAncestors(b.cfg.StateDir) },
	// Leftovers go first, so nothing of a role writes into scratch while
	// it is cleared.
	func(b *Broker) error {
		if err := b.stopAllRoles(); err != nil {
			return fmt.Errorf("broker: stop leftovers: %w", err)
		}
		return nil
	},
	(*Broker).prepareState,
	func(b *Broker) error { b.probeQuota(); return nil },
	// A broker that died with the places closed left their modes here.
	(*Broker).restoreClosedTmp,
	(*Broker).installControlKey,
	(*Broker).loadSecrets,
	(*Broker).initFence,
}

// kernelSteps are the start-up's steps once the cgroups are set up: the
// kernel's policy decided, the API's sockets, the agents' networks.
var kernelSteps = []func(*Broker) error{
	(*Broker).decideKernelPolicy,
	(*Broker).listenAPI,
	(*Broker).makeEgressNets,
}

// checkOwnCaps refuses a broker without the capabilities its work takes
// and clears the ones nothing it forks should carry.
func (b *Broker) checkOwnCaps() error {
	egress := len(b.cfg.Agent.Egress) > 0
	// caps.Measure is the broker's where serve could keep it; without it
	// the start goes on and says what the disk measure cannot see
	// (probeQuota).
	measure := caps.PermittedOf([]int{caps.Measure}) >= 0
	if err := caps.Verify(caps.BrokerFor(egress, measure)); err != nil {
		if egress && caps.Verify(caps.BrokerFor(false, measure)) == nil {
			return fmt.Errorf("agent.egress: the broker lacks CAP_SYS_ADMIN and CAP_NET_ADMIN, which starting agents in network namespaces of their own takes (give the broker's container SYS_ADMIN and NET_ADMIN, or leave agent.egress empty: agents then get no egress)")
		}
		return fmt.Errorf("broker: %w", err)
	}
	// Inheritable served the broker's own exec; nothing it forks carries it.
	// (A test build that hands roles an ambient capability needs it kept.)
	if !(weaken.Enabled && weaken.Has(weaken.CapAmb)) {
		if err := caps.ClearInheritable(); err != nil {
			return fmt.Errorf("broker: %w", err)
		}
	}
	if !caps.BoundingCleared() {
		b.note("the capability bounding set holds the broker's own (its six, and CAP_CHECKPOINT_RESTORE where given): this container gives no CAP_SETPCAP to clear it, so role commands keep it too (unusable under no_new_privs with a non-zero uid)")
	}
	return nil
}

// becomeSubreaper makes orphans of role commands the broker's children,
// so the reaper can reap them and kill(-1) loops see them go.
func (b *Broker) becomeSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("broker: child subreaper: %w", err)
	}
	b.reaper = newReaper(func(pid int) {
		b.log.Warn("a role process stopped under the broker's trace (PTRACE_TRACEME got past the filter); killed", "pid", pid)
	})
	return nil
}

// openDevNull opens the /dev/null that role commands and the controller
// get for the stdio they are not given.
func (b *Broker) openDevNull() (err error) {
	if b.devnull, err = os.OpenFile("/dev/null", os.O_RDWR, 0); err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	return nil
}

// readCPUs reads the CPUs this broker may use and refuses judge_cpus
// outside them.
func (b *Broker) readCPUs() (err error) {
	if b.cpus.online, err = cpuset.Online(); err != nil {
		return fmt.Errorf("broker: cpus: %w", err)
	}
	if b.cpus.judge, err = b.cfg.JudgeCPUSet(); err != nil {
		return fmt.Errorf("judge_cpus: %w", err)
	}
	if !b.cpus.online.Contains(b.cpus.judge) {
		return fmt.Errorf("judge_cpus: %s is not among the CPUs this broker may use (%s)", b.cpus.judge, b.cpus.online)
	}
	return nil
}

// loadSecrets reads the secrets folder.
func (b *Broker) loadSecrets() (err error) {
	if b.secrets, err = readSecrets(b.cfg.SecretsDir); err != nil {
		return err
	}
	b.log.Info("secrets read", "folder", b.cfg.SecretsDir, "count", len(b.secrets))
	return nil
}

// superviseUntilSignal runs the controller until SIGTERM or SIGINT, then
// stops it and every role and closes l.
func (b *Broker) superviseUntilSignal(l *net.UnixListener, notify *notifier) {
	b.setPhase(rpc.PhaseController, "")
	ctlDone := make(chan struct{})
	go func() {
		b.superviseController()
		close(ctlDone)
	}()
	go b.announceReady(notify)
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, unix.SIGTERM, unix.SIGINT)
	s := <-sig
	b.log.Info("stopping", "signal", s.String())
	b.setPhase(rpc.PhaseStopping, "signal "+s.String())
	notify.send("STOPPING=1")
	b.life.stopping.Store(true)
	close(b.life.stopCh)
	unix.Write(b.life.stopFD, []byte{1, 0, 0, 0, 0, 0, 0, 0})
	<-ctlDone
	b.shutdown(l)
	b.log.Info("stopped")
}

func (b *Broker) shutdown(l *net.UnixListener) {
	b.life.stopping.Store(true)
	l.Close()
	if err := b.stopAllRoles(); err != nil {
		b.log.Error("stop roles", "err", err)
	}
	os.Remove(b.cfg.BrokerSocket())
	b.reopenTmp()
}

// setPhase records where the start-up is; status reports it and dispatch
// serves role commands only once it is past the self-test.
func (b *Broker) setPhase(p, why string) {
	b.mu.Lock()
	b.life.phase, b.life.phaseWhy = p, why
	b.mu.Unlock()
}

// servingRoles says whether role commands may run now: never before the
// start-up self-test has held, so nothing it does touches them, and never
// while stopping.
func (b *Broker) servingRoles() error {
	b.mu.Lock()
	p, why := b.life.phase, b.life.phaseWhy
	b.mu.Unlock()
	switch p {
	case rpc.PhaseStarting, rpc.PhaseSelftest:
		return fmt.Errorf("broker: the rig is starting: the start-up self-test is running; role commands wait for it (thermite status --wait)")
	case rpc.PhaseRefused:
		return fmt.Errorf("broker: the rig refused to start: %s", why)
	case rpc.PhaseStopping:
		return fmt.Errorf("broker: the rig is stopping")
	}
	return nil
}

// announceReady waits for the first controller to answer, then says the rig
// is ready in the log and to systemd.
func (b *Broker) announceReady(n *notifier) {
	for {
		select {
		case <-b.life.stopCh:
			return
		case <-time.After(25 * time.Millisecond):
		}
		if pingController(b.cfg.ControllerSocket()) != nil {
			continue
		}
		b.mu.Lock()
		sentence := ""
		if b.self.result != nil {
			sentence = b.self.result.Sentence
		}
		b.mu.Unlock()
		b.setPhase(rpc.PhaseReady, "")
		b.log.Info("rig ready", "selftest", sentence)
		n.send("READY=1\nSTATUS=ready: " + oneLine(sentence))
		return
	}
}

// oneLine keeps a status line to one short line.
func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// listenAPI makes the harness API's TCP listener on loopback: the broker
// holds it, so the port (even one the kernel picked) is known for the
// self-test's probes, and hands it to every controller it starts. No role
// of the rig reaches it: api roles get no TCP socket.
func (b *Broker) listenAPI() error {
	if b.cfg.API.TCP == "" {
		return nil
	}
	addr, err := net.ResolveTCPAddr("tcp", b.cfg.API.TCP)
	if err != nil {
		return fmt.Errorf("api.tcp: %w", err)
	}
	l, err := net.ListenTCP("tcp", addr)
	if err != nil {
		return fmt.Errorf("api.tcp %s: %w", b.cfg.API.TCP, err)
	}
	b.listeners.api = l
	b.listeners.apiPort = l.Addr().(*net.TCPAddr).Port
	return nil
}

// checkUsers refuses to start when the role users are not what the table
// says in /etc/passwd: `thermite roles ensure` makes them.
func (b *Broker) checkUsers() error {
	data, err := os.ReadFile("/etc/passwd")
	if err != nil {
		return fmt.Errorf("roles: %w", err)
	}
	have := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		e := strings.Split(line, ":")
		if len(e) >= 3 {
			have[e[0]] = e[2]
		}
	}
	for _, r := range b.table.Roles {
		uid, ok := have[r.User]
		if !ok {
			return fmt.Errorf("roles: user %s (uid %d) is not in /etc/passwd: run `thermite roles ensure`", r.User, r.UID)
		}
		if uid != strconv.Itoa(r.UID) {
			return fmt.Errorf("roles: user %s has uid %s in /etc/passwd, but the role table gives it %d", r.User, uid, r.UID)
		}
	}
	return nil
}

// note records something an operator should know, once, in the log and
// in `thermite status`.
func (b *Broker) note(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, n := range b.notes {
		if n == s {
			return
		}
	}
	b.notes = append(b.notes, s)
	b.log.Warn(s)
}

func (b *Broker) status() *rpc.Status {
	b.mu.Lock()
	st := &rpc.Status{
		Phase:     b.life.phase,
		PhaseWhy:  b.life.phaseWhy,
		BrokerPID: os.Getpid(),
		StartedAt: b.life.started.UTC().Format(time.RFC3339),
		StateDir:  b.cfg.StateDir,
		Socket:    b.cfg.BrokerSocket(),
	}
	b.mu.Unlock()
	st.LandlockABI = landlockABI()
	st.Cgroup = b.cgroupStatus()
	st.ProcView = b.procView()
	st.CPUWeights = b.cpuWeightsStatus()
	st.Without = b.Without()
	counts, _ := procs.CountByUID("/proc", b.uidSet())
	for _, r := range b.table.Roles {
		st.Roles = append(st.Roles, rpc.RoleStatus{Name: r.Name, User: r.User, UID: r.UID, Processes: len(counts[r.UID])})
	}
	b.mu.Lock()
	st.ControllerPID = b.ctl.pid
	st.ControllerRuns = b.ctl.starts
	st.Starts = b.starts.snapshot()
	if b.self.result != nil {
		// The verdict without its rows: `selftest isolation --json` has them.
		sum := *b.self.result
		sum.Probes = nil
		st.Selftest = &sum
	}
	st.Notes = append([]string(nil), b.notes...)
	b.mu.Unlock()
	if st.ControllerPID != 0 {
		st.ControllerUp = pingController(b.cfg.ControllerSocket()) == nil
	}
	if st.Phase == rpc.PhaseReady && !st.ControllerUp {
		st.Phase = rpc.PhaseControllerDown
		st.PhaseWhy = "the controller does not answer on " + b.cfg.ControllerSocket()
		if st.ControllerPID == 0 {
			st.PhaseWhy = "the controller is not running; the broker starts it again"
		}
	}
	st.GPU = b.gpuStatus()
	st.DiskCheck = b.DiskCheckMethod()
	return st
}
