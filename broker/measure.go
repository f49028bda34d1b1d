package broker

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"thermite/internal/caps"
	"thermite/internal/procs"
	"thermite/internal/rpc"
	"thermite/internal/threadcred"
	"thermite/roles"
)

// measureState is the disk measure's. Its maps and counters are under
// b.mu.
type measureState struct {
	// ownExec are the running commands the broker started as thermite
	// itself (/proc/self/exe: a lane's file helper, a probe): not
	// dumpable where the binary is 0711, and holding no descriptor of
	// the role's (spawn.Start's child closes all but its slots), so the
	// unlinked-file measure passes over them.
	ownExec map[int]bool
	// starting are the stop helpers (startHelper) running as a role's
	// user until they answer: thermite itself, not dumpable (the binary is
	// 0711 and spawn.Main clears it), and holding nothing of the role's.
	starting map[int]bool
	// runGen counts each role's command starts, handGen the changes to
	// the folders handed to roles, and usage keeps each role's last disk
	// measure for reuse while neither moves (usagecache.go).
	runGen  map[int]uint64
	handGen uint64
	usage   map[int]keptUsage
	watch   *usageWatch // each folder's incremental disk measure (usagecache.go)
	quota   *quotaState // how roles' disks are measured (quota.go)
}

// heldUnlinked sums what the role's processes keep in unlinked files
// (procs.HeldUnlinkedOn), in the broker on a thread whose effective
// uid and gid are the role's for the call (threadcred.As): reading another
// user's descriptor tables and maps takes ptrace read access, which the
// kernel grants on the file-system ids when the target is not more
// capable, and otherwise only with CAP_SYS_PTRACE, which the broker does
// not keep. A process that made itself not dumpable still refuses it and
// counts as hidden (procs.ErrHidden). A deleted file on the role's file
// systems that a mapping alone keeps counts its blocks, read through
// /proc/PID/map_files with a capability raised for that stat
// (statMapped); where the broker holds none, it counts as hidden too.
// A unix socket of the role's that keeps descriptors in flight (a deleted
// file there is in no table) counts as hidden once it stays so past the
// bounds a refused table has.
// The thread runs off the CPUs a timed run holds, so the measure never
// disturbs it. It holds the stop
// lock, so it never measures while the role's processes are being ended.
func (b *Broker) heldUnlinked(r roles.Role, skipDev uint64) (procs.Held, error) {
	lk := b.stopLock(r.UID)
	lk.Lock()
	defer lk.Unlock()
	var cpus unix.CPUSet
	free := b.cpus.online.Minus(b.holds.heldCPUs())
	for _, c := range free {
		cpus.Set(c)
	}
	// The broker's own commands and stop helpers hold nothing of the
	// role's and are not dumpable.
	skip := map[int]bool{}
	b.mu.Lock()
	for _, m := range []map[int]bool{b.measure.ownExec, b.measure.starting} {
		for pid := range m {
			skip[pid] = true
		}
	}
	b.mu.Unlock()
	// The file systems the role's folders lie on: a deleted file there
	// that only a mapping keeps is measured by its blocks
	// (procs.HeldUnlinkedOn).
	disk := map[uint64]bool{}
	b.eachOwnedFolder(r, func(top *os.File) {
		var st unix.Stat_t
		if unix.Fstat(int(top.Fd()), &st) == nil && st.Dev != skipDev {
			disk[st.Dev] = true
		}
	}, func(error) {})
	// The role's processes are listed here, as root, whose group the
	// broker's /proc shows every process (HideProcesses): as the role,
	// the listing would pass over those of its processes that are not
	// dumpable, which /proc then hides from it.
	pids, err := procs.ByUIDOwned("/proc", r.UID)
	if err != nil {
		return procs.Held{}, fmt.Errorf("unlinked files of %s: %w", r.Name, err)
	}
	var h procs.Held
	err = threadcred.As(r.UID, r.GID, func() error {
		if len(free) > 0 {
			// Affinity is per thread, and this thread ends with the call.
			if err := unix.SchedSetaffinity(0, &cpus); err != nil {
				return fmt.Errorf("affinity: %w", err)
			}
		}
		var err error
		h, err = procs.HeldUnlinkedOf("/proc", pids, skip, skipDev, disk, statMapped(caps.PermittedOf(caps.MapFiles)))
		return err
	})
	if err != nil {
		return h, fmt.Errorf("unlinked files of %s: %w", r.Name, err)
	}
	return h, nil
}

// statMapped follows a /proc/PID/map_files link for the disk measure on
// the calling (locked) thread, with c (one of caps.MapFiles, which the
// kernel wants for it) effective for that one stat and no longer: the rest
// of the measure runs with no capability effective. c < 0: the broker
// holds none of them, and the stat is refused as the kernel would.
func statMapped(c int) procs.StatMapped {
	return func(path string, st *unix.Stat_t) error {
		if c < 0 {
			return errNoMapFilesCapability
		}
		return caps.WithEffective(c, func() error { return unix.Stat(path, st) })
	}
}

// errNoMapFilesCapability says the broker holds none of caps.MapFiles.
var errNoMapFilesCapability = fmt.Errorf("%w (following map_files takes CAP_CHECKPOINT_RESTORE, which the broker keeps wherever the kernel, Linux 5.9 and later, and its container give it, or CAP_SYS_ADMIN; it holds neither: give the container CHECKPOINT_RESTORE)", unix.EPERM)

// mapFilesReadable follows the map_files link of the broker's own first
// mapping, with the capability the disk measure raises (which a thread of
// the broker as root holds effective): it says whether the kernel lets
// the broker read map_files at all (a user namespace other than the
// initial one refuses even CAP_SYS_ADMIN), and with which capability.
func mapFilesReadable() (int, error) {
	c := caps.PermittedOf(caps.MapFiles)
	if c < 0 {
		return c, errNoMapFilesCapability
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return c, err
	}
	lo, hi, ok := strings.Cut(strings.Fields(string(maps) + " -")[0], "-")
	start, err1 := strconv.ParseUint(lo, 16, 64)
	end, err2 := strconv.ParseUint(hi, 16, 64)
	if !ok || err1 != nil || err2 != nil {
		return c, fmt.Errorf("/proc/self/maps: no mapping in %.40q", maps)
	}
	entry := "/proc/self/map_files/" + strconv.FormatUint(start, 16) + "-" + strconv.FormatUint(end, 16)
	var st unix.Stat_t
	if err := unix.Stat(entry, &st); err != nil {
		return c, fmt.Errorf("stat %s with %s: %w", entry, caps.Names(1<<uint(c)), err)
	}
	return c, nil
}

// DiskUsage measures a role's HOME, TMPDIR and the folders handed to it,
// and what its processes keep in unlinked files.
func (b *Broker) DiskUsage(r roles.Role, helperIdle bool) (*rpc.DiskUsage, error) {
	// Where scratch's file system keeps user quotas, one quotactl
	// (quota.go); elsewhere, and while the quota cannot say, the walk.
	if fs := b.quotaFS(); fs != nil {
		if u, ok, err := b.quotaUsage(r, fs); ok {
			return u, err
		}
	}
	gen, idle := b.roleGen(r.UID), b.roleIdle(r.UID)
	if u, ok := b.reusableUsage(r.UID, gen, helperIdle && idle); ok {
		return u, nil
	}
	u := &rpc.DiskUsage{}
	errs := b.measureFolders(r, 0, u)
	// Space in files unlinked but kept open or mapped by the role's
	// processes: no walk sees it, and the disk holds it all the same.
	h, err := b.heldUnlinked(r, 0)
	u.Bytes += h.Bytes
	u.Unlinked, u.UnlinkedFiles = h.Bytes, h.Files
	if err != nil {
		errs = append(errs, err)
	}
	// Kept for reuse only when nothing of the role could change its files
	// while they were walked: idle before and after, no command started.
	keep := len(errs) == 0 && idle && b.roleIdle(r.UID) && b.roleGen(r.UID) == gen
	b.keepUsage(r.UID, gen, u, keep)
	// A walk that could not finish counts as too much: a tree built to
	// defeat the measure is over every cap.
	return u, errors.Join(errs...)
}
