package broker

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/cgroup"
	"thermite/internal/cpuset"
	"thermite/internal/procs"
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
	role     roles.Role
	argv     []string
	env      []string
	cwd      *os.File // O_PATH folder, opened beneath scratch
	stdio    [3]*os.File
	cpus     cpuset.Set
	rlimits  []spawn.Rlimit
	landlock *os.File // the role's rule set, or nil
	// unland lets go of landlock once the shim has it (or never will).
	unland  func()
	groups  []int
	seccomp *seccomp.Options // the role's system-call filter, or nil
	cgroup  *cgroup.Group    // the role's cgroup, or nil where none is writable
	// inherit are descriptors the command keeps, from spawn.FDInherit on
	// (the controller's bootstrap and API listener).
	inherit []*os.File
	unhold  func() // a timed run's release of its CPUs and cards
	// cardStops says which processes of other roles were stopped because
	// they had a card this timed run holds open.
	cardStops []string
}

// child is a started command.
type child struct {
	pid     int
	pidfd   int
	started time.Time
	exited  <-chan exit
	execErr string // why the shim could not exec, if it could not
	// execAt is the moment the shim called execve, in this process's
	// clock, and shimUser and shimSys the shim's own CPU time until then;
	// zero where the shim wrote no stamp.
	execAt            time.Time
	shimUser, shimSys int64
}

// execSpec is the shim's spec for a prepared command.
func (b *Broker) execSpec(c *command) *spawn.Spec {
	return &spawn.Spec{Mode: spawn.ModeExec, Argv: c.argv, Env: c.env, CPUs: c.cpus, Rlimits: c.rlimits, Seccomp: c.seccomp}
}

// startShim forks `/proc/self/exe __spawn` as the role's user with its
// credentials, a new session and a pidfd, hands it the spec on a pipe and
// waits until it has exec'd the command or said why it could not.
func (b *Broker) startShim(c *command, spec *spawn.Spec) (*child, error) {
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
	files := []uintptr{
		c.stdio[0].Fd(), c.stdio[1].Fd(), c.stdio[2].Fd(),
		specR.Fd(), repW.Fd(),
	}
	if c.cwd != nil {
		files = append(files, c.cwd.Fd())
	} else {
		files = append(files, b.devnull.Fd())
	}
	if c.landlock != nil {
		files = append(files, c.landlock.Fd())
		spec.Landlock = true
	}
	if len(c.inherit) > 0 {
		if c.landlock == nil {
			files = append(files, b.devnull.Fd()) // FDLandlock's place
		}
		for i, f := range c.inherit {
			files = append(files, f.Fd())
			spec.Inherit = append(spec.Inherit, spawn.FDInherit+i)
		}
	}
	groups := make([]uint32, len(c.groups))
	for i, g := range c.groups {
		groups[i] = uint32(g)
	}
	pidfd := -1
	attr := &syscall.ProcAttr{
		Env:   []string{}, // the shim's own environment is empty: the command's comes in the spec
		Files: files,
		Sys: &syscall.SysProcAttr{
			Credential: &syscall.Credential{Uid: uint32(c.role.UID), Gid: uint32(c.role.GID), Groups: groups},
			Setsid:     true,
			PidFD:      &pidfd,
		},
	}
	cgFD := -1
	if c.cgroup != nil && spec.Mode == spawn.ModeExec {
		// cgroup v2: the child is born in its group (clone3 CLONE_INTO_CGROUP).
		if fd, err := c.cgroup.FD(); err == nil {
			cgFD = fd
			attr.Sys.UseCgroupFD = true
			attr.Sys.CgroupFD = fd
		}
	}
	if weaken.Enabled && spec.Mode == spawn.ModeExec {
		if weaken.Has("cap-amb") {
			attr.Sys.AmbientCaps = []uintptr{unix.CAP_CHOWN}
		}
		spec.KeepFDs = weaken.Has("leak-fd")
		spec.KeepCaps = weaken.Has("cap-amb")
		spec.SlowStart = weaken.Has(weaken.SlowShim)
	}
	started := time.Now()
	pid, exited, err := b.reaper.fork(func() (int, error) {
		return syscall.ForkExec(b.exe, []string{"thermite", spawn.Arg}, attr)
	})
	repW.Close()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", c.role.Name, err)
	}
	ch := &child{pid: pid, pidfd: pidfd, started: started, exited: exited}
	if spec.Mode != spawn.ModeHeld {
		// Anything of the role may change what it holds: no disk measure
		// of it taken before is reused.
		b.bumpRole(c.role.UID)
	}
	b.mu.Lock()
	b.starting[pid] = true
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.starting, pid)
		b.mu.Unlock()
	}()
	if c.cgroup != nil && spec.Mode == spawn.ModeExec && cgFD < 0 {
		// cgroup v1: the shim waits for its spec, so it is placed in its
		// group before the command exists, never moved in after it ran.
		if err := c.cgroup.Add(pid); err != nil {
			unix.Kill(pid, unix.SIGKILL)
			<-exited
			ch.close()
			return nil, fmt.Errorf("start %s: %w", c.role.Name, err)
		}
	}
	data, _ := json.Marshal(spec)
	if _, err := specW.Write(data); err != nil {
		unix.Kill(pid, unix.SIGKILL)
		<-exited
		ch.close()
		return nil, fmt.Errorf("start %s: spec: %w", c.role.Name, err)
	}
	specW.Close()
	// The report pipe closes when the command is exec'd (close-on-exec), or
	// carries the shim's reason when it could not be.
	msg, _ := io.ReadAll(io.LimitReader(repR, 4096))
	ch.execErr = ch.readStamp(string(msg))
	return ch, nil
}

// readStamp takes the shim's stamp from its report and returns the rest.
// The stamp's CLOCK_MONOTONIC time becomes a time.Time of this process by
// the distance from now, so scheduling delays here do not move it.
func (c *child) readStamp(msg string) string {
	mono, user, sys, rest, ok := spawn.ParseStamp(msg)
	if !ok {
		return msg
	}
	var ts unix.Timespec
	now := time.Now()
	if unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) == nil && ts.Nano() >= mono {
		c.execAt = now.Add(-time.Duration(ts.Nano() - mono))
		c.shimUser, c.shimSys = user, sys
	}
	return rest
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

// validEnvName is a shell-safe variable name. (Not a regexp: package-level
// regexps compile at start-up, and the shim starts for every command.)
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

// EnvFor is the whole environment of a role's command: what the request
// gives, then HOME, TMPDIR, USER and LOGNAME for the role, which no request
// can change, and PATH unless the request sets it. Nothing of the broker's
// own environment is passed on.
func (b *Broker) EnvFor(r roles.Role, home string, requested []string) ([]string, error) {
	fixed := map[string]string{
		"HOME":    home,
		"TMPDIR":  b.tmpOf(r),
		"USER":    r.User,
		"LOGNAME": r.User,
	}
	var env []string
	hasPath := false
	seen := map[string]bool{}
	for _, kv := range requested {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || !validEnvName(k) {
			return nil, fmt.Errorf("env: %q is not NAME=value", kv)
		}
		if strings.ContainsRune(kv, 0) {
			return nil, fmt.Errorf("env: %s holds a NUL byte", k)
		}
		if _, isFixed := fixed[k]; isFixed || seen[k] {
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
	for _, k := range []string{"HOME", "TMPDIR", "USER", "LOGNAME"} {
		env = append(env, k+"="+fixed[k])
	}
	return env, nil
}

// LimitsFor turns a request's limits into rlimits: the rig's defaults,
// lowered where the request asks. A request can never raise a default.
// RLIMIT_CORE is always 0, so no command leaves a core with its memory.
func (b *Broker) LimitsFor(req rpc.Limits) (rl []spawn.Rlimit, timeout time.Duration, err error) {
	d := b.cfg.Limits
	lower := func(name string, req, def int64) (int64, error) {
		switch {
		case req < 0:
			return 0, fmt.Errorf("limits.%s: %d is negative", name, req)
		case req == 0:
			return def, nil
		case def > 0 && req > def:
			return 0, fmt.Errorf("limits.%s: %d is above the rig's limit of %d", name, req, def)
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

// CPUsFor decides which CPUs a role's command runs on. A timing user runs
// only on its card's share of the judge's CPUs; every other role runs anywhere the broker may,
// except on judge CPUs a timed run holds at that moment.
func (b *Broker) CPUsFor(r roles.Role, requested string) (cpuset.Set, error) {
	var allowed cpuset.Set
	if r.Kind == roles.Timing {
		share, err := b.cfg.JudgeCPUsOf(r.Index - 1)
		if err != nil {
			return nil, fmt.Errorf("cpus: %s: %w", r.Name, err)
		}
		allowed = share
	} else {
		allowed = b.online.Minus(b.heldCPUs())
	}
	if len(allowed) == 0 {
		return nil, fmt.Errorf("cpus: no CPU is free for %s (judge CPUs %s are held by a timed run)", r.Name, b.judgeCPUs)
	}
	if held := b.heldCPUs(); r.Kind != roles.Timing && requested != "" {
		if want, err := cpuset.Parse(requested); err == nil && want.Intersects(held) {
			return nil, fmt.Errorf("cpus: CPUs %s are held by a timed run; %s may use %s now", held, r.Name, allowed)
		}
	}
	if requested == "" {
		return allowed, nil
	}
	want, err := cpuset.Parse(requested)
	if err != nil {
		return nil, fmt.Errorf("cpus: %w", err)
	}
	if len(want) == 0 {
		return nil, fmt.Errorf("cpus: %q names no CPU", requested)
	}
	if !allowed.Contains(want) {
		return nil, fmt.Errorf("cpus: %s may not use CPUs %s (it may use %s)", r.Name, want.Minus(allowed), allowed)
	}
	return want, nil
}

// heldCards is the cards a timed run holds now.
func (b *Broker) heldCards() map[int]bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[int]bool{}
	for _, cs := range b.cardHolds {
		for _, c := range cs {
			out[c] = true
		}
	}
	return out
}

// heldCPUs is the judge CPUs a timed run holds now.
func (b *Broker) heldCPUs() cpuset.Set {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out cpuset.Set
	for _, s := range b.cpuHolds {
		out = append(out, s...)
	}
	return out
}

// runCommand starts a command, waits for it under its timeout (or until
// cancel closes), and fills in how it ended.
func (b *Broker) runCommand(c *command, timeout time.Duration, cancel <-chan struct{}) (*rpc.RunResult, error) {
	oomBefore := oomKills(c.cgroup)
	ch, err := b.startShim(c, b.execSpec(c))
	if err != nil {
		return nil, err
	}
	defer ch.close()
	if len(c.argv) > 0 && c.argv[0] == "/proc/self/exe" {
		b.mu.Lock()
		b.ownExec[ch.pid] = true
		b.mu.Unlock()
		defer func() {
			b.mu.Lock()
			delete(b.ownExec, ch.pid)
			b.mu.Unlock()
		}()
	}
	res := &rpc.RunResult{PID: ch.pid, CPUs: c.cpus.String(), CardStops: c.cardStops}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var e exit
	why := ""
	select {
	case e = <-ch.exited:
	case <-timer.C:
		why = rpc.StoppedTimeout
	case <-cancel:
		why = rpc.StoppedCanceled
	}
	if why != "" {
		// The pid is only sure to be ours while it is not reaped: look once
		// more before the process group is signalled.
		select {
		case e = <-ch.exited:
		default:
			ch.kill()
			e = <-ch.exited
		}
	}
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
// and the CPU time of the command alone, without the shim's start (its Go
// runtime, the spec, the filter) before the execve. Where the shim wrote
// no stamp (it could not exec), from the fork, all of it.
func clock(ch *child, e exit) (wall, user, sys int64) {
	from := ch.started
	if !ch.execAt.IsZero() {
		from = ch.execAt
	}
	user = max(0, e.ru.Utime.Nano()-ch.shimUser)
	sys = max(0, e.ru.Stime.Nano()-ch.shimSys)
	return max(0, e.at.Sub(from).Nanoseconds()), user, sys
}

// execError is a command the shim could not start.
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

// heldHelper runs the shim in held mode as the role's user: it sums what
// the user's processes keep in unlinked files (procs.HeldUnlinked). As the
// user, it reads its own processes' descriptor tables without a
// capability the broker does not keep (CAP_SYS_PTRACE). It holds the stop
// lock, so the broker's own stop never kills it; a helper killed anyway
// was killed by the user's processes, which hides what they hold.
func (b *Broker) heldHelper(r roles.Role, skipDev uint64) (procs.Held, error) {
	lk := b.stopLock(r.UID)
	lk.Lock()
	defer lk.Unlock()
	c := &command{role: r, stdio: [3]*os.File{b.devnull, b.devnull, b.devnull}}
	spec := &spawn.Spec{Mode: spawn.ModeHeld, SkipDev: skipDev}
	// Off the CPUs a timed run holds, so the measure never disturbs it.
	if free := b.online.Minus(b.heldCPUs()); len(free) > 0 {
		spec.CPUs = free
	}
	b.mu.Lock()
	for _, m := range []map[int]bool{b.ownExec, b.starting} {
		for pid := range m {
			spec.SkipPIDs = append(spec.SkipPIDs, pid)
		}
	}
	b.mu.Unlock()
	ch, err := b.startShim(c, spec)
	if err != nil {
		return procs.Held{}, fmt.Errorf("unlinked files of %s: %w", r.Name, err)
	}
	e := <-ch.exited
	ch.close()
	var h procs.Held
	if _, serr := fmt.Sscanf(ch.execErr, "ok %d %d", &h.Bytes, &h.Files); serr == nil && e.ws.Exited() && e.ws.ExitStatus() == 0 {
		return h, nil
	}
	if e.ws.Signaled() {
		return h, fmt.Errorf("unlinked files of %s: the measure %s: %w", r.Name, describe(e.ws), procs.ErrHidden)
	}
	return h, fmt.Errorf("unlinked files of %s: %s", r.Name, ch.execErr)
}

// stopHelper runs the shim in stop mode as the role's user: kill(-1,
// SIGKILL) until no process of that user is left, then every SysV IPC
// object the user owns or made is removed. It returns how many
// processes the helper saw when it began.
func (b *Broker) stopHelper(r roles.Role) (int, error) {
	// One helper per user at a time: two would kill each other.
	lk := b.stopLock(r.UID)
	lk.Lock()
	defer lk.Unlock()
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		c := &command{role: r, stdio: [3]*os.File{b.devnull, b.devnull, b.devnull}}
		spec := &spawn.Spec{Mode: spawn.ModeStop, StopTimeoutMS: 10_000}
		if weaken.Enabled {
			spec.KeepIPC = weaken.Has(seccomp.WeakenSysVIPC)
		}
		ch, err := b.startShim(c, spec)
		if err != nil {
			return 0, err
		}
		e := <-ch.exited
		ch.close()
		var n int
		if _, serr := fmt.Sscanf(ch.execErr, "ok %d", &n); serr == nil && e.ws.Exited() && e.ws.ExitStatus() == 0 {
			return n, nil
		}
		// Another process of the user may have killed the helper first;
		// it is dead by now or dies in the next round.
		lastErr = fmt.Errorf("stop %s: helper %s: %s", r.Name, describe(e.ws), ch.execErr)
	}
	return 0, lastErr
}
