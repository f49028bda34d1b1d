package broker

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/cgroup"
	"thermite/internal/cpuset"
	"thermite/internal/rpc"
	"thermite/internal/seccomp"
	"thermite/internal/spawn"
	"thermite/internal/weaken"
	"thermite/roles"
)

// DefaultPath is PATH for a role's command unless its request sets one.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// command is a role command the broker is about to start.
type command struct {
	role roles.Role
	// uid and gid are the credentials it runs with (Plan.UID, Plan.GID).
	uid, gid int
	argv     []string
	env      []string
	cwd      *os.File // O_PATH folder, opened beneath scratch
	stdio    [3]*os.File
	cpus     cpuset.Set
	rlimits  []spawn.Rlimit
	landlock *os.File // the role's rule set, or nil
	// unland lets go of landlock once the command has it (or never will).
	unland  func()
	groups  []int
	seccomp *seccomp.Options // the role's system-call filter, or nil
	cgroup  *cgroup.Group    // the role's cgroup, or nil where none is writable
	// netns is a network namespace the command joins, or nil: its own
	// namespace of the one it was started from.
	netns *os.File
	// slots are the descriptors the command keeps beyond its stdio, by
	// name (the controller's bootstrap, API and egress listeners).
	slots  []spawn.Slot
	unhold func() // a timed run's release of its CPUs and cards
	// ownBinary: thermite itself (Plan.OwnBinary), which the disk measure
	// passes over while it runs.
	ownBinary bool
	// stopsAfter: the role's user is stopped after it (Plan.StopsAfter).
	stopsAfter bool
	// received is when the broker took the command's Run (zero for its
	// own commands): its start's wait is counted from it.
	received time.Time
	// cardStops says which processes of other roles were stopped because
	// they had a card this timed run holds open.
	cardStops []string
}

// child is a started command, or a Go helper.
type child struct {
	pid     int
	pidfd   int
	started time.Time
	exited  <-chan exit
	execErr string // why the command could not be exec'd, if it could not
	// execAt is the moment the child called execve, in this process's
	// clock, and startUser and startSys the child's own CPU time until
	// then; zero where it wrote no stamp.
	execAt              time.Time
	startUser, startSys int64
	// answer is what the Go helper (stop mode) reported.
	answer string
	// startWait is how long it waited from its Run's receipt to its
	// start, startsAhead how many starts of other roles went first.
	startWait   time.Duration
	startsAhead int
}

// filters holds every seccomp filter the broker has assembled, one per
// option set: a filter depends on its options alone.
var filters seccomp.Cache

// startCommand starts a prepared command: spawn.Start's raw child takes on
// its credentials and confinement and execs it, and this returns when it
// has, or has failed at a stage (execErr says which, and the child has
// exited 127). The reaper knows the child before it can be reaped.
func (b *Broker) startCommand(c *command) (*child, error) {
	sc, err := b.spawnCommand(c)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", c.role.Name, err)
	}
	defer closeAll(sc.CgroupProcs)
	var sch *spawn.Child
	var startErr error
	// Its turn among the roles' starts (startGate): the judge's first,
	// then each role in turn.
	ahead := b.starts.acquire(c.role)
	started := time.Now()
	wait := startWait(c.received)
	pid, exited, err := b.reaper.fork(func() (int, error) {
		sch, startErr = spawn.Start(sc)
		if sch == nil {
			return 0, startErr
		}
		return sch.PID, nil
	})
	b.starts.release()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", c.role.Name, err)
	}
	// Anything of the role may change what it holds: no disk measure of
	// it taken before is reused.
	b.bumpRole(c.role.UID)
	ch := &child{pid: pid, pidfd: sch.PIDFD, started: started, exited: exited, startWait: wait, startsAhead: ahead}
	if startErr != nil {
		ch.execErr = startErr.Error()
	}
	if sch.Stamped {
		ch.readStamp(sch.Stamp)
	}
	return ch, nil
}

// spawnCommand is c as spawn.Start takes it: its filter from the cache,
// its cgroup as a v2 directory (born in it) or v1 cgroup.procs files (the
// child writes itself in before its exec), both held by the group; the
// caller closes CgroupProcs, duplicates of the group's.
func (b *Broker) spawnCommand(c *command) (*spawn.Command, error) {
	sc := &spawn.Command{
		Argv: c.argv, Env: c.env,
		Stdin: c.stdio[0], Stdout: c.stdio[1], Stderr: c.stdio[2],
		Slots:    c.slots,
		Dir:      c.cwd,
		Landlock: c.landlock,
		NetNS:    c.netns,
		UID:      c.uid, GID: c.gid, Groups: c.groups,
		Rlimits: c.rlimits,
		CPUs:    c.cpus,
	}
	if c.seccomp != nil {
		f, err := filters.Get(*c.seccomp)
		if err != nil {
			return nil, err
		}
		sc.Seccomp = f
	}
	if c.cgroup != nil {
		fd, err := c.cgroup.FD()
		switch {
		case err == nil:
			sc.UseCgroupDir, sc.CgroupDir = true, fd
		case errors.Is(err, cgroup.ErrNoFD):
			// The group keeps its cgroup.procs files open: the child
			// writes itself into each.
			if sc.CgroupProcs, err = c.cgroup.ProcsFiles(); err != nil {
				return nil, fmt.Errorf("cgroup: %w", err)
			}
		default:
			return nil, err
		}
	}
	if weaken.Enabled {
		if weaken.Has(weaken.LeakFD) && c.cwd != nil {
			// The test build's leak: the working folder's descriptor,
			// above stderr and the command's slots.
			fd := 3
			for _, sl := range c.slots {
				fd = max(fd, sl.FD+1)
			}
			sc.Slots = append(append([]spawn.Slot(nil), c.slots...), spawn.Slot{Name: "leaked-cwd", FD: fd, File: c.cwd})
		}
		if weaken.Has(weaken.CapAmb) {
			sc.Weakened.AmbientCaps = []int{unix.CAP_CHOWN}
		}
		// The clock's test build slows the timed runs' starts only: the
		// child is a vfork child, and the broker's starts wait on it.
		sc.Weakened.SlowStart = weaken.Has(weaken.SlowStart) && c.role.Kind == roles.Timing
		sc.Weakened.Unguarded = weaken.Has(weaken.UnguardedStart)
	}
	return sc, nil
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// helperGiveUp is how long the Go helper may take before it is killed:
// above the stop mode's own bounds (10 s to end the user's processes, 10 s
// to remove its IPC objects).
const helperGiveUp = time.Minute

// startHelper starts `/proc/self/exe __spawn` as the role's user through
// spawn.Start (its credentials, a new session, a pidfd), hands it the spec
// on a pipe and returns when it has answered (stop mode runs Go code as
// the role, which the raw child cannot).
func (b *Broker) startHelper(c *command, spec *spawn.Spec) (*child, error) {
	specR, specW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer specR.Close()
	defer specW.Close()
	repR, repW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer repR.Close()
	// The raw child, as for every command: nothing but its slots
	// survives the exec, and no stdlib fork runs as the role (its child,
	// between setuid and execve, had no timer of its own to undo a stop).
	sc := &spawn.Command{
		Argv:  []string{b.exe, spawn.Arg},
		Env:   []string{}, // the helper's own environment is empty
		Stdin: c.stdio[0], Stdout: c.stdio[1], Stderr: c.stdio[2],
		Slots: []spawn.Slot{{Name: "spec", FD: spawn.FDSpec, File: specR}, {Name: "report", FD: spawn.FDReport, File: repW}},
		UID:   c.uid, GID: c.gid, Groups: c.groups,
		// A stop strikes first from the raw child: a process of the
		// user that kills every newcomer in a loop would otherwise kill
		// the helper before its runtime reaches its own kill(-1).
		KillUserFirst: spec.Mode == spawn.ModeStop,
	}
	var sch *spawn.Child
	var startErr error
	// A stop of the judge's roles goes with the judge's starts.
	b.starts.acquire(c.role)
	started := time.Now()
	pid, exited, err := b.reaper.fork(func() (int, error) {
		sch, startErr = spawn.Start(sc)
		if sch == nil {
			return 0, startErr
		}
		return sch.PID, nil
	})
	b.starts.release()
	if err == nil && startErr != nil {
		// The child failed a stage and exited 127: reaped, then refused.
		repW.Close()
		<-exited
		unix.Close(sch.PIDFD)
		return nil, fmt.Errorf("start %s: %w", c.role.Name, startErr)
	}
	pidfd := -1
	if sch != nil {
		pidfd = sch.PIDFD
	}
	repW.Close()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", c.role.Name, err)
	}
	// The helper runs as the role's user, whose processes may stop it
	// (kill(-1, SIGSTOP) where Landlock cannot scope signals): it is sent
	// SIGCONT until it answers, and killed after helperGiveUp, so that
	// no role holds its own disk check or stop, and this call, for good.
	stopWatch := spawn.KeepGoing(pidfd, helperGiveUp)
	ch := &child{pid: pid, pidfd: pidfd, started: started, exited: exited}
	b.bumpRole(c.role.UID)
	b.mu.Lock()
	b.measure.starting[pid] = true
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.measure.starting, pid)
		b.mu.Unlock()
	}()
	data, _ := json.Marshal(spec)
	if _, err := specW.Write(data); err != nil {
		unix.Kill(pid, unix.SIGKILL)
		<-exited
		stopWatch()
		ch.close()
		return nil, fmt.Errorf("start %s: spec: %w", c.role.Name, err)
	}
	specW.Close()
	msg, _ := io.ReadAll(io.LimitReader(repR, 4096))
	// The report ends when the helper exits (nothing else holds its write
	// end): read to its end, so the watcher holds on until then, and lets
	// go before the caller reaps the helper and closes the pidfd.
	io.Copy(io.Discard, repR)
	stopWatch()
	ch.answer = string(msg)
	return ch, nil
}

// readStamp takes the child's stamp: its CLOCK_MONOTONIC time becomes a
// time.Time of this process by the distance from now, so scheduling delays
// here do not move it.
func (c *child) readStamp(s spawn.Stamp) {
	if at, ok := s.StartedAt(); ok {
		c.execAt = at
		c.startUser, c.startSys = s.UserNS, s.SysNS
	}
}

// release closes what a prepared command holds.
func (c *command) release() {
	if c.cwd != nil {
		c.cwd.Close()
	}
	if c.unland != nil {
		c.unland()
		c.unland = nil
	}
	if c.unhold != nil {
		c.unhold()
		c.unhold = nil
	}
}

func (c *child) close() {
	if c.pidfd >= 0 {
		unix.Close(c.pidfd)
		c.pidfd = -1
	}
}

// kill sends SIGKILL to the command and its process group, through the
// pidfd so a recycled pid is never hit.
func (c *child) kill() {
	if c.pidfd >= 0 {
		unix.PidfdSendSignal(c.pidfd, unix.SIGKILL, nil, 0)
	}
	unix.Kill(-c.pid, unix.SIGKILL)
}

// runCommand starts a command, waits for it under its timeout (or until
// its caller, where there is one, sends a frame or goes away, or the
// broker begins to stop), and fills in how it ended. The wait is one
// epoll_wait on this goroutine's thread (awaitEnd), and the child is
// reaped through its pidfd (reapEnded) unless the reaper was first.
func (b *Broker) runCommand(c *command, timeout time.Duration, caller *rpc.Conn) (*rpc.RunResult, error) {
	oomBefore := oomKills(c.cgroup)
	ch, err := b.startCommand(c)
	if err != nil {
		return nil, err
	}
	defer ch.close()
	if c.ownBinary {
		b.mu.Lock()
		b.measure.ownExec[ch.pid] = true
		b.mu.Unlock()
		defer func() {
			b.mu.Lock()
			delete(b.measure.ownExec, ch.pid)
			b.mu.Unlock()
		}()
	}
	res := &rpc.RunResult{PID: ch.pid, CPUs: c.cpus.String(), CardStops: c.cardStops, StartWaitNS: ch.startWait.Nanoseconds(), StartsAhead: ch.startsAhead}
	why := ""
	ev, err := b.awaitEnd(ch, caller, timeout)
	switch {
	case err != nil:
		// The wait itself failed: the command is not left running.
		b.log.Error("waiting for a command", "role", c.role.Name, "pid", ch.pid, "err", err)
		why = rpc.StoppedCanceled
	case ev == endTimeout:
		why = rpc.StoppedTimeout
	case ev == endCaller, ev == endStopping:
		why = rpc.StoppedCanceled
	}
	if why != "" {
		// Not reaped yet, so the pid and its group are still the
		// command's; the pidfd is sure in any case.
		ch.kill()
	}
	e := b.reapEnded(ch)
	res.WallNS, res.UserNS, res.SysNS = clock(ch, e)
	res.MaxRSSKB = e.ru.Maxrss
	res.ExitCode = -1
	switch {
	case e.ws.Exited():
		res.ExitCode = e.ws.ExitStatus()
		res.Stopped = rpc.StoppedExited
	case e.ws.Signaled():
		res.Signal = int(e.ws.Signal())
		res.Stopped = rpc.StoppedSignaled
		cpuLimit := rlimitOf(c.rlimits, unix.RLIMIT_CPU)
		switch {
		case e.ws.Signal() == unix.SIGXCPU,
			e.ws.Signal() == unix.SIGKILL && cpuLimit > 0 && uint64((res.UserNS+res.SysNS)/1e9) >= cpuLimit:
			res.Stopped = rpc.StoppedLimitCPU
		case e.ws.Signal() == unix.SIGXFSZ:
			res.Stopped = rpc.StoppedLimitFSZ
		}
	}
	if why == "" && oomBefore >= 0 && oomKills(c.cgroup) > oomBefore {
		// The kernel's OOM killer ended it, or one of its processes,
		// inside its role's cgroup.
		res.Stopped = rpc.StoppedLimitMem
	}
	if e.traced {
		res.Stopped = rpc.StoppedTraced
	}
	if why != "" {
		res.Stopped = why
	}
	if ch.execErr != "" {
		return res, &execError{msg: ch.execErr}
	}
	return res, nil
}

// clock is what a command took: wall time from its execve to its exit,
// and the CPU time of the command alone, without its start (credentials,
// limits, the filter) before the execve. Where the child wrote no stamp
// (it could not exec), from the clone, all of it.
func clock(ch *child, e exit) (wall, user, sys int64) {
	from := ch.started
	if !ch.execAt.IsZero() {
		from = ch.execAt
	}
	user = max(0, e.ru.Utime.Nano()-ch.startUser)
	sys = max(0, e.ru.Stime.Nano()-ch.startSys)
	return max(0, e.at.Sub(from).Nanoseconds()), user, sys
}

// execError is a command its child could not exec.
type execError struct{ msg string }

func (e *execError) Error() string { return e.msg }

func rlimitOf(rl []spawn.Rlimit, r int) uint64 {
	for _, l := range rl {
		if l.Resource == r {
			return l.Cur
		}
	}
	return 0
}
