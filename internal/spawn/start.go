package spawn

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"thermite/internal/seccomp"
	"thermite/internal/weaken"
)

// Command is everything a role's command is started with. The caller
// decides it (the broker's policy); Start carries it out between clone
// and execve, in one child, with no second runtime.
type Command struct {
	// Argv is the command; Argv[0] without a slash is looked for in the
	// PATH of Env, as a shell would (absolute entries only).
	Argv []string
	// Env is the command's whole environment.
	Env []string

	// Stdin, Stdout and Stderr become descriptors 0, 1 and 2.
	Stdin, Stdout, Stderr *os.File
	// Slots are the other descriptors the command keeps: each slot's File
	// becomes its FD and stays open across the exec. Nothing else the
	// caller holds does.
	Slots []Slot
	// Dir is the working folder (an O_PATH descriptor is enough); nil
	// keeps the caller's.
	Dir *os.File
	// Landlock is a rule set the child restricts itself with; nil, none.
	Landlock *os.File
	// NetNS is a network namespace the child joins before it drops root
	// (setns needs CAP_SYS_ADMIN); nil keeps the caller's.
	NetNS *os.File
	// CgroupProcs are cgroup v1 cgroup.procs files, one per hierarchy,
	// open for writing: the child writes "0" (itself) to each while still
	// root, so it is in its group before the command exists.
	CgroupProcs []*os.File
	// CgroupDir, when UseCgroupDir, is a cgroup v2 directory descriptor:
	// the child is born in it (clone3 CLONE_INTO_CGROUP). The caller keeps
	// it open.
	CgroupDir    int
	UseCgroupDir bool

	// UID, GID and Groups are the credentials the command runs with.
	UID, GID int
	Groups   []int
	// Rlimits are set in order, RLIMIT_NPROC last whatever its place.
	Rlimits []Rlimit
	// CPUs pins the command; empty leaves the affinity as it is.
	CPUs []int
	// Seccomp is the filter, loaded last; nil, none.
	Seccomp *seccomp.Built

	// KillUserFirst: right after its uid switch the child sends SIGKILL
	// to every other process of the user (kill(-1)), before any of them
	// can stop or kill it: the Go helper's stop mode, whose own kill(-1)
	// comes only after its runtime has started.
	KillUserFirst bool

	// Weakened switches protections off; only a thermite_weaken test
	// build honours it, for the self-test's breakage tests.
	Weakened Weakening
}

// Slot is one descriptor a command keeps across its exec, by name: File
// becomes descriptor FD in the command. The number is declared once, where
// both ends read it (rpc.BootstrapFD, FDSpec), never by position.
type Slot struct {
	// Name says what the descriptor is, in refusals.
	Name string
	FD   int
	File *os.File
}

// Weakening is what a thermite_weaken test build may leave out of a start.
type Weakening struct {
	// AmbientCaps are raised into the command's ambient set (they must be
	// in the caller's permitted and inheritable sets).
	AmbientCaps []int
	// SlowStart spends about 150 ms of CPU time and 450 ms asleep before
	// the stamp: a start a clock counting the child would see.
	SlowStart bool
	// Unguarded starts as before the start-window fix: holding
	// syscall.ForkLock, and with no keepGoing.
	Unguarded bool
}

// Child is a started command: it has exec'd, or failed at a stage and
// exited 127. The caller reaps it (wait4 on PID) and closes PIDFD.
type Child struct {
	PID   int
	PIDFD int
	// Stamp is when the child called execve and what CPU time it had
	// spent; Stamped is false where it failed before.
	Stamp   Stamp
	Stamped bool
}

// Wait reaps the child and closes its pidfd: for callers without a
// reaper of their own (tests, benchmarks).
func (c *Child) Wait() (unix.WaitStatus, unix.Rusage, error) {
	var ws unix.WaitStatus
	var ru unix.Rusage
	for {
		_, err := unix.Wait4(c.PID, &ws, 0, &ru)
		if err == unix.EINTR {
			continue
		}
		if c.PIDFD >= 0 {
			unix.Close(c.PIDFD)
			c.PIDFD = -1
		}
		return ws, ru, err
	}
}

// cloneArgs is struct clone_args, up to its cgroup field (version 2).
type cloneArgs struct {
	flags      uint64
	pidfd      uint64
	childTID   uint64
	parentTID  uint64
	exitSignal uint64
	stack      uint64
	stackSize  uint64
	tls        uint64
	setTID     uint64
	setTIDSize uint64
	cgroup     uint64
}

// rlimit64 is struct rlimit64.
type rlimit64 struct{ cur, max uint64 }

// prepared is a Command in the form the child uses: descriptor numbers,
// NUL-terminated strings, arrays the kernel reads. The child only reads it.
type prepared struct {
	argv, envv []*byte
	// paths are where the program may be, tried in order.
	paths  []*byte
	report int
	setsid bool

	cgroupProcs []int
	netns       int
	cpuMask     []uint64
	landlock    int
	cwd         int

	// from[i] is the descriptor that becomes slotTo[i]: stdin, stdout and
	// stderr first, then the command's Slots.
	from, slotTo []int
	// spare is above every descriptor named here: a slot's source that
	// another slot would overwrite is moved there first.
	spare int

	groups   []uint32
	uid, gid uintptr
	rlimits  []rlimit64
	rlimRes  []uintptr
	capHdr   unix.CapUserHeader
	capData  [2]unix.CapUserData
	seccomp  *unix.SockFprog
	clone3   *cloneArgs
	cloneFlg uintptr
	// sigmask is the parent thread's signal mask before the fork, which
	// the child restores (the runtime's BeforeFork blocks every signal).
	sigmask uint64

	// A thermite_weaken build's: capabilities to raise into the ambient
	// set (a mask of the first 32), and the slow start.
	ambient uint32
	slow    bool

	// back is set by the parent as soon as its clone returns: the child
	// has exec'd (or ended), and keepGoing's SIGCONT must not reach the
	// command, which may stop itself.
	back int32

	killUser bool
	// unguarded is a thermite_weaken build's start without the child's
	// own timers (Weakening.Unguarded).
	unguarded bool

	// contEvent and contEvery are the child's own timer: SIGCONT to
	// itself from stuckAfter on, every stuckEvery, until its execve;
	// killEvent and killAt, SIGKILL at giveUpAfter.
	contEvent, killEvent sigevent
	contEvery, killAt    unix.ItimerSpec
}

// sigevent is struct sigevent (64 bytes on 64-bit Linux) for
// timer_create: a signal to the process (SIGEV_SIGNAL, 0).
type sigevent struct {
	value  uintptr
	signo  int32
	notify int32
	_      [48]byte
}

// Start starts c: clone, then in the child (raw system calls only, see
// forkExec) as root the session, cgroup v1 placement, network namespace,
// affinity, no_new_privs and Landlock; then groups, gid and uid, dumpable
// off, no inheritable (so no ambient) capability; as the user the working
// folder, umask 022, the descriptor slots, the rlimits, the seccomp filter,
// the stamp and execve. It returns when the child has exec'd or failed; a failure is a
// *StageError, returned with the Child, which the caller still reaps.
func Start(c *Command) (*Child, error) {
	p, err := prepare(c)
	if err != nil {
		return nil, err
	}
	var pipe [2]int
	if err := unix.Pipe2(pipe[:], unix.O_CLOEXEC); err != nil {
		return nil, fmt.Errorf("spawn: report pipe: %w", err)
	}
	p.report = pipe[1]
	if max(pipe[0], pipe[1]) >= p.spare {
		p.spare = max(pipe[0], pipe[1]) + 1
	}
	pidfd := int32(-1)
	p.clone3.pidfd = uint64(uintptr(unsafe.Pointer(&pidfd)))

	// No syscall.ForkLock: the child marks every descriptor but its slots
	// close-on-exec itself, so no other goroutine's descriptor can leak
	// into it, and a start held up in the child must not hold up every
	// other start (and every os/exec) of the process.
	var stop func()
	if p.unguarded {
		stop = holdForkLock()
	} else {
		stop = keepGoing(&pidfd, &p.back, giveUpAfter)
	}
	pid, errno := forkExec(p, &pidfd)
	stop()
	unix.Close(pipe[1])
	keepAlive(c, p)
	if errno != 0 {
		unix.Close(pipe[0])
		return nil, fmt.Errorf("spawn: clone: %w", errno)
	}
	ch := &Child{PID: int(pid), PIDFD: int(pidfd)}
	ch.Stamp, ch.Stamped, err = readReport(pipe[0], func(s Stage, i int) string { return c.detail(s, i) })
	unix.Close(pipe[0])
	if err == nil && !ch.Stamped {
		err = errors.New("spawn: the child ended before its execve")
	}
	return ch, err
}

// The child runs as the role's user from its uid switch until execve,
// and this thread waits in the kernel (CLONE_VFORK) all that time. Any
// process of that user may send it SIGSTOP there (kill(-1, SIGSTOP) in a
// loop, where no Landlock signal scope keeps it out), which would hold
// this start, and this thread, for as long as it likes. keepGoing sends
// the child SIGCONT through its pidfd (written by the kernel before the
// child runs) from stuckAfter on, every stuckEvery: a stop is then undone
// at once and the child gets at least one system call further each time.
// One that is still not done after giveUpAfter (a frozen cgroup, say) is
// killed, and its start fails.
const (
	stuckAfter  = 5 * time.Millisecond
	stuckEvery  = time.Millisecond
	giveUpAfter = 30 * time.Second
)

// KeepGoing watches a process already started as a role's user (the
// broker's Go helper, which the role's processes may signal just as they
// may Start's child) as Start watches its child: SIGCONT through pidfd
// from stuckAfter on, every stuckEvery, SIGKILL from giveUp on, until the
// returned stop is called. A helper held stopped would otherwise hold its
// caller, a role's disk check or stop, for good.
func KeepGoing(pidfd int, giveUp time.Duration) (stop func()) {
	fd := int32(pidfd)
	return keepGoing(&fd, nil, giveUp)
}

// keepGoing watches one start until the returned stop is called; stop
// returns once the watcher has let go of the pidfd, which the caller may
// close (and the number be reused) right after.
// back, where not nil, says the watched child has exec'd: from then on
// nothing is sent, as the command may stop itself. (It is set when the
// parent thread runs again, which on a loaded machine may come some
// milliseconds after the exec; stopping the watch at the child's stamp
// instead would leave the last steps before the execve to the child's own
// SIGCONT timer, which a stop signal defeats: it flushes the queued
// SIGCONT, and a POSIX timer re-arms only when its signal is delivered.)
func keepGoing(pidfd, back *int32, giveUp time.Duration) (stop func()) {
	// A timer, not a goroutine: a start that is not held (nearly every
	// one) costs no goroutine and no wake-up of another thread.
	k := &keeper{pidfd: pidfd, back: back, deadline: time.Now().Add(giveUp)}
	k.mu.Lock()
	k.t = time.AfterFunc(stuckAfter, k.tick)
	k.mu.Unlock()
	return k.stop
}

// keeper is one start's watch: tick signals the child, under mu, and
// stop, under mu too, ends the watch, so no tick uses the pidfd after
// stop has returned.
type keeper struct {
	mu       sync.Mutex
	t        *time.Timer
	stopped  bool
	pidfd    *int32
	back     *int32
	deadline time.Time
}

func (k *keeper) tick() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopped {
		return
	}
	if fd := atomic.LoadInt32(k.pidfd); fd >= 0 && (k.back == nil || atomic.LoadInt32(k.back) == 0) {
		sig := unix.SIGCONT
		if time.Now().After(k.deadline) {
			sig = unix.SIGKILL
		}
		unix.PidfdSendSignal(int(fd), sig, nil, 0)
	}
	k.t.Reset(stuckEvery)
}

func (k *keeper) stop() {
	k.mu.Lock()
	k.stopped = true
	k.t.Stop()
	k.mu.Unlock()
}

// holdForkLock is a thermite_weaken build's start without keepGoing,
// holding syscall.ForkLock as starts did before: a child stopped in its
// window then holds every start, and every os/exec, of the process.
func holdForkLock() (stop func()) {
	syscall.ForkLock.Lock()
	return syscall.ForkLock.Unlock
}

// detail names what stage s worked on at index i, for an error.
func (c *Command) detail(s Stage, i int) string {
	switch s {
	case StageExec:
		if len(c.Argv) > 0 {
			return c.Argv[0]
		}
	case StageRlimit:
		r := c.ordered()
		if i >= 0 && i < len(r) {
			return rlimitName(r[i].Resource)
		}
	case StageCgroup:
		if i >= 0 && i < len(c.CgroupProcs) {
			return c.CgroupProcs[i].Name()
		}
	}
	return ""
}

// keepAlive holds what the child read until it is done with it: the
// prepared arrays and the files whose descriptor numbers it used.
func keepAlive(c *Command, p *prepared) {
	runtime.KeepAlive(c)
	runtime.KeepAlive(p)
}

// ordered is c.Rlimits with RLIMIT_NPROC last: it counts every task of
// the user, and takes effect at the next fork, so nothing before it trips.
func (c *Command) ordered() []Rlimit {
	out := make([]Rlimit, 0, len(c.Rlimits))
	var nproc []Rlimit
	for _, r := range c.Rlimits {
		if r.Resource == unix.RLIMIT_NPROC {
			nproc = append(nproc, r)
			continue
		}
		out = append(out, r)
	}
	return append(out, nproc...)
}

func rlimitName(r int) string {
	names := map[int]string{
		unix.RLIMIT_AS: "RLIMIT_AS", unix.RLIMIT_CORE: "RLIMIT_CORE", unix.RLIMIT_CPU: "RLIMIT_CPU",
		unix.RLIMIT_DATA: "RLIMIT_DATA", unix.RLIMIT_FSIZE: "RLIMIT_FSIZE", unix.RLIMIT_NOFILE: "RLIMIT_NOFILE",
		unix.RLIMIT_NPROC: "RLIMIT_NPROC", unix.RLIMIT_STACK: "RLIMIT_STACK", unix.RLIMIT_MEMLOCK: "RLIMIT_MEMLOCK",
	}
	if n, ok := names[r]; ok {
		return n
	}
	return fmt.Sprintf("rlimit %d", r)
}

// prepare turns c into what the child reads, refusing what it cannot do.
func prepare(c *Command) (*prepared, error) {
	if len(c.Argv) == 0 || c.Argv[0] == "" {
		return nil, errors.New("spawn: empty argv")
	}
	if c.Stdin == nil || c.Stdout == nil || c.Stderr == nil {
		return nil, errors.New("spawn: stdin, stdout and stderr must all be given")
	}
	if c.UID <= 0 || c.GID <= 0 {
		return nil, fmt.Errorf("spawn: uid %d gid %d: a command never runs as root", c.UID, c.GID)
	}
	p := &prepared{netns: -1, landlock: -1, cwd: -1, setsid: true}
	var err error
	if p.argv, err = syscall.SlicePtrFromStrings(c.Argv); err != nil {
		return nil, fmt.Errorf("spawn: argv: %w", err)
	}
	if p.envv, err = syscall.SlicePtrFromStrings(c.Env); err != nil {
		return nil, fmt.Errorf("spawn: env: %w", err)
	}
	for _, cand := range candidates(c.Argv[0], c.Env) {
		b, err := syscall.BytePtrFromString(cand)
		if err != nil {
			return nil, fmt.Errorf("spawn: program: %w", err)
		}
		p.paths = append(p.paths, b)
	}
	highest := 2
	use := func(f *os.File) int {
		fd := int(f.Fd())
		highest = max(highest, fd)
		return fd
	}
	for _, f := range c.CgroupProcs {
		p.cgroupProcs = append(p.cgroupProcs, use(f))
	}
	if c.NetNS != nil {
		p.netns = use(c.NetNS)
	}
	if c.Landlock != nil {
		p.landlock = use(c.Landlock)
	}
	if c.Dir != nil {
		p.cwd = use(c.Dir)
	}
	for i, f := range []*os.File{c.Stdin, c.Stdout, c.Stderr} {
		p.from = append(p.from, use(f))
		p.slotTo = append(p.slotTo, i)
	}
	if err := checkSlots(c.Slots); err != nil {
		return nil, err
	}
	for _, sl := range c.Slots {
		p.from = append(p.from, use(sl.File))
		p.slotTo = append(p.slotTo, sl.FD)
		highest = max(highest, sl.FD)
	}
	p.spare = highest + 1
	if len(c.CPUs) > 0 {
		top := 0
		for _, cpu := range c.CPUs {
			if cpu < 0 || cpu >= 1<<16 {
				return nil, fmt.Errorf("spawn: cpu %d is out of range", cpu)
			}
			top = max(top, cpu)
		}
		p.cpuMask = make([]uint64, top/64+1)
		for _, cpu := range c.CPUs {
			p.cpuMask[cpu/64] |= 1 << (cpu % 64)
		}
	}
	for _, g := range c.Groups {
		p.groups = append(p.groups, uint32(g))
	}
	p.uid, p.gid = uintptr(c.UID), uintptr(c.GID)
	p.killUser = c.KillUserFirst
	for _, r := range c.ordered() {
		p.rlimits = append(p.rlimits, rlimit64{r.Cur, r.Max})
		p.rlimRes = append(p.rlimRes, uintptr(r.Resource))
	}
	p.capHdr = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	p.contEvent = sigevent{signo: int32(unix.SIGCONT)}
	p.contEvery = unix.ItimerSpec{Value: unix.NsecToTimespec(int64(stuckAfter)), Interval: unix.NsecToTimespec(int64(stuckEvery))}
	p.killEvent = sigevent{signo: int32(unix.SIGKILL)}
	p.killAt = unix.ItimerSpec{Value: unix.NsecToTimespec(int64(giveUpAfter))}
	if c.Seccomp != nil {
		p.seccomp = c.Seccomp.Prog()
	}
	if weaken.Enabled {
		for _, cap := range c.Weakened.AmbientCaps {
			if cap < 0 || cap >= 32 {
				return nil, fmt.Errorf("spawn: ambient capability %d is out of range", cap)
			}
			p.ambient |= 1 << cap
		}
		p.slow = c.Weakened.SlowStart
		p.unguarded = c.Weakened.Unguarded
	}
	// clone3 resets the child's signal handlers itself
	// (CLONE_CLEAR_SIGHAND): the child then only restores its signal mask,
	// where the runtime's AfterForkInChild would reset every handler with
	// a system call each. clone, without that flag, is the fallback where
	// clone3 is refused (ENOSYS from a container's filter).
	p.cloneFlg = unix.CLONE_VM | unix.CLONE_VFORK | unix.CLONE_PIDFD
	p.clone3 = &cloneArgs{
		flags:      uint64(p.cloneFlg) | unix.CLONE_CLEAR_SIGHAND,
		exitSignal: uint64(unix.SIGCHLD),
	}
	if c.UseCgroupDir {
		p.clone3.flags |= unix.CLONE_INTO_CGROUP
		p.clone3.cgroup = uint64(c.CgroupDir)
	}
	return p, nil
}

// checkSlots refuses slots that would not give the command what their
// names say: a missing file, a number of stdin, stdout or stderr (or
// below), two slots on one number (the second would silently replace the
// first), or one name twice.
func checkSlots(slots []Slot) error {
	fds := map[int]string{}
	names := map[string]bool{}
	for _, sl := range slots {
		switch {
		case sl.Name == "":
			return fmt.Errorf("spawn: the slot for descriptor %d has no name", sl.FD)
		case sl.File == nil:
			return fmt.Errorf("spawn: slot %s (descriptor %d) has no file", sl.Name, sl.FD)
		case sl.FD < 3:
			return fmt.Errorf("spawn: slot %s: descriptor %d is stdin, stdout or stderr, or below", sl.Name, sl.FD)
		case fds[sl.FD] != "":
			return fmt.Errorf("spawn: slots %s and %s both want descriptor %d", fds[sl.FD], sl.Name, sl.FD)
		case names[sl.Name]:
			return fmt.Errorf("spawn: two slots are named %s", sl.Name)
		}
		fds[sl.FD] = sl.Name
		names[sl.Name] = true
	}
	return nil
}

// candidates are the paths execve is tried on, in order: name itself if
// it holds a slash, else name in each absolute PATH entry of env (a
// relative or empty entry would run whatever the working folder holds).
func candidates(name string, env []string) []string {
	if strings.Contains(name, "/") {
		return []string{name}
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	var out []string
	for _, dir := range strings.Split(path, ":") {
		if strings.HasPrefix(dir, "/") {
			out = append(out, strings.TrimRight(dir, "/")+"/"+name)
		}
	}
	return out
}

// StartedAt turns a stamp's CLOCK_MONOTONIC time into this process's
// clock by its distance from now, so a delay in reading it moves nothing.
func (s Stamp) StartedAt() (time.Time, bool) {
	var ts unix.Timespec
	now := time.Now()
	if unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) != nil || ts.Nano() < s.MonoNS {
		return time.Time{}, false
	}
	return now.Add(-time.Duration(ts.Nano() - s.MonoNS)), true
}
