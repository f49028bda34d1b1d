package broker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/confined"
	"thermite/internal/landlock"
	"thermite/internal/rpc"
	"thermite/roles"
)

// Run runs one command as a role for a caller on c, and answers how it
// ended. The caller going away cancels the command; so does a frame sent
// while it runs, which the protocol does not allow (the connection is then
// closed after the answer). Otherwise the connection carries the caller's
// next request: a client that keeps it saves a connect, an accept and the
// peer check on every Run.
func (b *Broker) Run(c *rpc.Conn, req *rpc.RunRequest, files []*os.File) (*rpc.RunResult, error) {
	if len(files) != 0 && len(files) != 3 {
		return nil, fmt.Errorf("run: %d descriptors: give stdin, stdout and stderr, or none", len(files))
	}
	received := time.Now()
	cmd, timeout, err := b.prepareRun(req, files)
	if err != nil {
		return nil, fmt.Errorf("run: %w", err)
	}
	defer cmd.release()
	cmd.received = received
	res, err := b.execute(cmd, timeout, c)
	if err == nil && res != nil && res.Stopped == rpc.StoppedCanceled && c.Peek() == rpc.PeerSent {
		// The frames are read and dropped before the close: a socket
		// closed with unread data makes the caller's read of the answer
		// fail (its ECONNRESET comes before queued data).
		for i := 0; i < 16 && c.Peek() == rpc.PeerSent; i++ {
			var extra rpc.Request
			files, _ := c.Recv(&extra)
			for _, f := range files {
				f.Close()
			}
		}
		err = errCallerSentDuringRun
	}
	return res, err
}

// errCallerSentDuringRun ends a connection whose caller sent a frame while
// its Run ran: the command was cancelled, and the frame is not served.
var errCallerSentDuringRun = errors.New("run: the caller sent a frame while the command ran; the command was cancelled")

// prepareRun decides a request (PlanRun) and carries the plan out: every
// command of a role, the self-test's probes included, is made here.
func (b *Broker) prepareRun(req *rpc.RunRequest, stdio []*os.File) (*command, time.Duration, error) {
	if len(req.GPUs) > 0 {
		// Before every run that involves GPUs: what is there now, and the
		// device files as the layout wants them.
		b.refreshGPUs()
	}
	p, err := PlanRun(&b.cfg, b.table, req, b.snapshot())
	if err != nil {
		return nil, 0, err
	}
	cmd, err := b.carryOut(p, stdio)
	if err != nil {
		return nil, 0, err
	}
	return cmd, p.Timeout, nil
}

// snapshot is what the rig holds now, for PlanRun.
func (b *Broker) snapshot() *Snapshot {
	s := &Snapshot{
		Online: b.cpus.online, JudgeCPUs: b.cpus.judge, Handed: map[int][]string{},
		Kernel: b.kernel, Cgroups: b.cgroups.tree != nil, CPUWeights: b.hasCPUWeights(), APIPort: b.listeners.apiPort, Weakened: weakenedNow(),
	}
	s.HeldCPUs = b.holds.heldCPUs()
	s.HeldCards = b.holds.heldCards()
	b.mu.Lock()
	for uid, m := range b.handed {
		for p := range m {
			s.Handed[uid] = append(s.Handed[uid], p)
		}
	}
	b.mu.Unlock()
	b.gpu.mu.Lock()
	s.Layout = b.gpu.layout
	b.gpu.mu.Unlock()
	return s
}

// carryOut makes a planned command: the requested HOME's owner checked,
// the rule set built (or taken from the cache) and held, the role's cgroup
// made, the working folder opened beneath scratch, a timed run's CPUs and
// cards held. It decides nothing; on an error nothing is left held.
func (b *Broker) carryOut(p *Plan, stdio []*os.File) (*command, error) {
	if p.HomeOwned {
		if err := b.checkHomeOwner(p.Role, p.Home); err != nil {
			return nil, err
		}
	}
	cmd := &command{
		role: p.Role, uid: p.UID, gid: p.GID, groups: p.Groups,
		argv: p.Argv, env: p.Env, cpus: p.CPUs, rlimits: p.Rlimits,
		seccomp: p.Seccomp, ownBinary: p.OwnBinary, stopsAfter: p.StopsAfter,
	}
	if len(stdio) == 3 {
		copy(cmd.stdio[:], stdio)
	} else {
		cmd.stdio = [3]*os.File{b.devnull, b.devnull, b.devnull}
	}
	if p.Landlock != nil {
		spec := *p.Landlock
		spec.Writable = existing(spec.Writable)
		rs, release, err := b.ruleSet(spec, p.LandlockABI)
		if err != nil {
			return nil, fmt.Errorf("%w: no command of %s can be confined", err, p.Role.Name)
		}
		cmd.landlock, cmd.unland = rs, release
	}
	if p.Egress {
		n := b.listeners.egress[p.Role.Name]
		if n == nil {
			cmd.release()
			return nil, fmt.Errorf("egress: %s has no network namespace (agent.egress)", p.Role.Name)
		}
		cmd.netns = n.ns
	}
	var err error
	if p.Cgroup != nil {
		if cmd.cgroup, err = b.makeGroup(p.Role, p.Cgroup); err != nil {
			cmd.release()
			return nil, err
		}
	}
	if cmd.cwd, err = confined.Open(b.cfg.ScratchDir(), p.Cwd, unix.O_PATH|unix.O_DIRECTORY); err != nil {
		cmd.release()
		return nil, fmt.Errorf("cwd: %w", err)
	}
	if p.Hold != nil {
		if cmd.unhold, cmd.cardStops, err = b.hold(p.Role, p.Hold); err != nil {
			cmd.release()
			return nil, err
		}
	}
	return cmd, nil
}

// checkHomeOwner checks that a requested HOME, in scratch/trials, is a
// folder (not a symlink) that the role's user owns.
func (b *Broker) checkHomeOwner(r roles.Role, home string) error {
	trials := filepath.Join(b.cfg.ScratchDir(), "trials")
	f, err := confined.Open(trials, home, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW)
	if err != nil {
		return fmt.Errorf("home: %w", err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("home: %s: %w", home, err)
	}
	if int(st.Uid) != r.UID {
		return fmt.Errorf("home: %s: owned by uid %d, not %s", home, st.Uid, r.Name)
	}
	return nil
}

// existing is the places that exist now: a Landlock rule needs its path.
func existing(paths []string) []string {
	var out []string
	for _, p := range paths {
		if _, err := os.Lstat(p); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// execute runs a prepared command and cleans up after it: for every role
// but a lane (and the controller), whatever its user still runs is stopped;
// for every role, set-id bits go from the folders it owns in scratch.
func (b *Broker) execute(cmd *command, timeout time.Duration, caller *rpc.Conn) (*rpc.RunResult, error) {
	r := cmd.role
	// A role whose leftovers are stopped after each command (Plan.StopsAfter)
	// runs one command at a time, so one command's cleanup never kills
	// another's; the failed stop is read under that lock.
	if cmd.stopsAfter {
		lk := b.userLock(r.UID)
		lk.Lock()
		defer lk.Unlock()
		if err := b.leftoverRefusal(r); err != nil {
			return nil, err
		}
	}
	res, runErr := b.runCommand(cmd, timeout, caller)
	if res != nil {
		if cmd.stopsAfter {
			n, err := b.StopUser(r)
			if err != nil {
				return res, fmt.Errorf("run: cleanup: %w", err)
			}
			res.Leftovers = n
		}
		res.SetID = b.ClearSetID(r)
	}
	return res, runErr
}

// ruleSet returns the rule set for a spec built for abi (Plan.LandlockABI)
// and a release the caller calls once spawn.Start's child has exec'd (or
// will not start); see landlock.Cache.
func (b *Broker) ruleSet(spec landlock.RoleSpec, abi int) (*os.File, func(), error) {
	return b.ruleSets.Get(spec, abi)
}
