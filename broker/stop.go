package broker

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"thermite/internal/procs"
	"thermite/internal/seccomp"
	"thermite/internal/spawn"
	"thermite/internal/sysvipc"
	"thermite/internal/weaken"
	"thermite/roles"
)

// stopState is the stop path's: one command at a time of a role whose
// leftovers are stopped after each (userLocks), one stop of a user at a
// time (stopLocks), and each user's last failed stop until one succeeds
// (failed, leftoverRefusal). Its maps are under b.mu.
type stopState struct {
	userLocks map[int]*sync.Mutex
	stopLocks map[int]*sync.Mutex
	failed    map[int]error
}

// StopUser ends every process of the role's user and says how many there
// were when it began: first its cgroup at once (cgroup.kill on v2, which
// takes forks in flight too), then the helper's kill(-1) loop, which
// nothing of the user escapes and which removes its SysV IPC objects.
func (b *Broker) StopUser(r roles.Role) (int, error) {
	// Stopping empties its HOME and TMPDIR: its last disk measure is old.
	defer b.bumpRole(r.UID)
	// The controller's user is the running controller: stopping it would
	// end the controller (its supervisor would start another after
	// stopping every role). Only the broker's own stop of the rig does that.
	if r.Kind == roles.Controller && b.ControllerPID() != 0 {
		return 0, fmt.Errorf("stop: %s is the controller's user and the controller runs: stop the rig instead", r.Name)
	}
	k := b.stopGroup(r)
	n, err := b.stopHelper(r)
	b.noteStop(r.UID, err)
	if err != nil {
		return max(n, k), err
	}
	b.resetOwnFolders(r)
	return max(n, k), nil
}

// noteStop keeps each user's last failed stop until a stop succeeds.
func (b *Broker) noteStop(uid int, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err == nil {
		delete(b.stops.failed, uid)
		return
	}
	if b.stops.failed == nil {
		b.stops.failed = map[int]error{}
	}
	b.stops.failed[uid] = err
}

// leftoverRefusal carries out Plan.StopsAfter before a command of a role
// whose leftovers are stopped after each command (the builder, the timing
// users, the agents): while its user's last stop failed, what an earlier
// command left (another lane's build or timed run, for the shared users)
// may still run, and would run beside this one; it may start once a stop
// now succeeds. The caller holds the role's user lock.
func (b *Broker) leftoverRefusal(r roles.Role) error {
	b.mu.Lock()
	_, failed := b.stops.failed[r.UID]
	b.mu.Unlock()
	if !failed {
		return nil
	}
	if _, err := b.StopUser(r); err != nil {
		return fmt.Errorf("run: %s still runs what its last stop could not end (%w): end its processes, then run again", r.Name, err)
	}
	return nil
}

// resetOwnFolders empties a role's HOME and TMPDIR once nothing of its user
// runs: no build, timed run or trial finds what an earlier one left there
// (a poisoned build tool's configuration, a cached answer). The controller's
// own are left alone.
func (b *Broker) resetOwnFolders(r roles.Role) {
	if r.Kind == roles.Controller {
		return
	}
	for _, d := range []string{b.homeOf(r), b.tmpOf(r)} {
		if err := clearFolder(d); err != nil {
			b.log.Warn("reset a role's folder", "role", r.Name, "path", d, "err", err)
		}
	}
}

// stopAllRoles stops every role's user, the controller's included. It is
// used only when no controller runs, so a user with no process now cannot
// get one (only the broker starts them) and may be skipped, unless it still
// owns SysV IPC objects, which only its stop removes.
func (b *Broker) stopAllRoles() error {
	var errs []error
	counts, _ := procs.CountByUID("/proc", b.uidSet())
	ipcOwners := map[int]bool{}
	objs, err := sysvipc.List("/proc")
	if err != nil {
		errs = append(errs, err)
	}
	for _, o := range objs {
		ipcOwners[o.UID], ipcOwners[o.CUID] = true, true
	}
	for _, r := range b.table.Roles {
		if len(counts[r.UID]) == 0 && !ipcOwners[r.UID] {
			continue
		}
		b.stopGroup(r)
		if _, err := b.stopHelper(r); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (b *Broker) uidSet() map[int]bool {
	m := map[int]bool{}
	for _, u := range b.table.UIDs() {
		m[u] = true
	}
	return m
}

// stopHelper runs the Go helper in stop mode as the role's user: kill(-1,
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
		c := &command{role: r, uid: r.UID, gid: r.GID, stdio: [3]*os.File{b.devnull, b.devnull, b.devnull}}
		spec := &spawn.Spec{Mode: spawn.ModeStop, StopTimeoutMS: 10_000}
		if weaken.Enabled {
			spec.KeepIPC = weaken.Has(seccomp.WeakenSysVIPC)
		}
		ch, err := b.startHelper(c, spec)
		if err != nil {
			// A process of the user may kill the raw child before its
			// execve too: another round, as for a helper killed later.
			lastErr = err
			continue
		}
		e := <-ch.exited
		ch.close()
		var n int
		if _, serr := fmt.Sscanf(ch.answer, "ok %d", &n); serr == nil && e.ws.Exited() && e.ws.ExitStatus() == 0 {
			left := b.hiddenLeft(r)
			if len(left) == 0 {
				return n, nil
			}
			lastErr = fmt.Errorf("stop %s: processes %v that /proc hides from its user outlived the helper", r.Name, left)
			continue
		}
		// Another process of the user may have killed the helper first;
		// it is dead by now or dies in the next round.
		lastErr = fmt.Errorf("stop %s: helper %s: %s", r.Name, describe(e.ws), ch.answer)
	}
	return 0, lastErr
}

// hiddenLeft waits, at most a second, for the processes of the role's
// user that the helper could not see to end, and returns those that did
// not. /proc (the broker's own, with hidepid) hides from a user its own
// processes that are not dumpable: the helper's kill(-1) reached them all
// the same, but its check that none is left could not see them. The
// broker's group sees every process (HideProcesses).
func (b *Broker) hiddenLeft(r roles.Role) []int {
	var pids []int
	for deadline := time.Now().Add(time.Second); ; time.Sleep(10 * time.Millisecond) {
		pids, _ = procs.ByUID("/proc", r.UID)
		if len(pids) == 0 || time.Now().After(deadline) {
			return pids
		}
	}
}

// stopLock is the user's lock for one stop at a time.
func (b *Broker) stopLock(uid int) *sync.Mutex { return b.lockOf(b.stops.stopLocks, uid) }

// userLock is the user's lock for a command and the stop after it.
func (b *Broker) userLock(uid int) *sync.Mutex { return b.lockOf(b.stops.userLocks, uid) }

// lockOf is uid's lock in locks, made on first use (under b.mu).
func (b *Broker) lockOf(locks map[int]*sync.Mutex, uid int) *sync.Mutex {
	b.mu.Lock()
	defer b.mu.Unlock()
	lk := locks[uid]
	if lk == nil {
		lk = &sync.Mutex{}
		locks[uid] = lk
	}
	return lk
}

// stopGroup kills every process in the role's cgroup, where it has one, and
// says how many there were. A failure is logged, not returned: the helper
// that runs next ends every process of the user either way.
func (b *Broker) stopGroup(r roles.Role) int {
	b.mu.Lock()
	g := b.cgroups.groups[r.UID]
	b.mu.Unlock()
	if g == nil {
		return 0
	}
	pids, _ := g.Procs()
	if err := g.Kill(); err != nil {
		b.log.Warn("stop a role's cgroup", "role", r.Name, "group", g.Path(), "err", err)
	}
	return len(pids)
}
