package procs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Held is the space in files no name links any more (st_nlink 0) that a
// user's processes keep open or mapped: space a folder walk never sees,
// which stays taken until the last process lets go.
type Held struct {
	Bytes int64 // allocated bytes (st_blocks), each file once
	Files int
}

// ErrHidden says that a process keeps its open files from the measure: its
// descriptor table cannot be read by its own user (it made itself not
// dumpable), a unix socket it holds keeps descriptors sent to it and never
// received (in flight: a deleted file there is in no process's table), or
// the measure was killed. The trial's own processes did it, so it counts
// as over every cap.
var ErrHidden = errors.New("keeps its open files from the measure")

// MaxMappings bounds the mappings (lines of /proc/PID/maps) one measure
// reads, every process of the user together. A process may hold 65,530
// (vm.max_map_count) and a role hundreds of processes: read whole at each
// disk check, that is tens of seconds of the broker's CPU per check, for
// good. Reading 2^19 costs about half a second; a role past it is one
// whose files the measure cannot see (ErrHidden), its trial ended.
const MaxMappings = 1 << 19

var errTooManyMappings = fmt.Errorf("its processes hold more than %d mappings, past what the measure reads", MaxMappings)

// MaxLinks bounds, likewise, the descriptors one measure stats, every
// thread of every process of the user together: each thread's table is
// read, since a thread may have one of its own. The default limits (512
// tasks of 1,024 descriptors) stay within it.
const MaxLinks = 1 << 19

var errTooManyLinks = fmt.Errorf("its threads hold more than %d descriptors, past what the measure reads", MaxLinks)

// MaxMappedStats bounds the map_files entries one measure stats, every
// process together: one per deleted file on the role's file systems that
// mappings alone keep (and one per retry of one that moved). Each costs
// about 4 to 6 µs (the kernel finds the mapping under the process's mmap
// lock; the capability is raised and lowered around it): 2^14 of them
// about 0.1 s of the broker's CPU per check. A real program keeps a few
// (bun: one); a role past the bound keeps its files from the measure
// (ErrHidden).
const MaxMappedStats = 1 << 14

var errTooManyMappedStats = fmt.Errorf("its processes keep more than %d deleted files by mappings alone, past what the measure reads", MaxMappedStats)

// HeldUnlinked measures what the processes whose real uid is uid (all but
// this one) hold in unlinked regular files: every descriptor (stat through
// /proc/<pid>/fd/<n>, which reaches the open file, not a name), and every
// mapping of a deleted file whose descriptor was closed (/proc/<pid>/maps:
// its mapped length; HeldUnlinkedOn measures those on the role's file
// systems by their blocks). Each inode counts once. It runs as that uid,
// which may read its own processes' tables, and which can change its
// effective uid to no other (ByUIDOwned); skip names processes to pass
// over (the broker's own commands, which hold no descriptor of the user's
// and may not be dumpable).
func HeldUnlinked(procRoot string, uid int, skip map[int]bool) (Held, error) {
	return HeldUnlinkedExcept(procRoot, uid, skip, 0)
}

// HeldUnlinkedExcept is HeldUnlinked passing over the files of the file
// system skipDev (an st_dev; 0 passes over none).
func HeldUnlinkedExcept(procRoot string, uid int, skip map[int]bool, skipDev uint64) (Held, error) {
	return HeldUnlinkedOn(procRoot, uid, skip, skipDev, nil, unix.Stat)
}

// StatMapped stats what a /proc/PID/map_files/<start>-<end> link reaches:
// the mapped file itself, deleted or not. The kernel follows the link only
// for a caller holding CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN (effective,
// in the initial user namespace) that may also read the process (ptrace
// read access on the file-system ids); unix.Stat is one where the caller
// holds them, and the broker passes one that raises the capability on its
// measuring thread for that one call.
type StatMapped func(path string, st *unix.Stat_t) error

// HeldUnlinkedOn is HeldUnlinkedExcept where the role's files lie on the
// file systems disk (st_dev; nil: none known). A deleted file there that
// a process keeps by a mapping, with no descriptor of it counted, is
// measured by its blocks: statMapped on the mapping's map_files entry,
// which must be the inode the maps line names. Where that cannot be read
// (no capability, or the mapping moved each time it was read) the file
// counts as hidden (ErrHidden, naming the process and the file): a
// mapping shows its own length, not the file's blocks, and a lane could
// keep any number of such files each counted as one page. A process whose
// unix socket keeps descriptors in flight (fdinfo's scm_fds), past the
// bounds a refused table has (refusalHides), counts as hidden too, naming
// the socket: what a descriptor in flight keeps, no table shows.
func HeldUnlinkedOn(procRoot string, uid int, skip map[int]bool, skipDev uint64, disk map[uint64]bool, statMapped StatMapped) (Held, error) {
	pids, err := ByUIDOwned(procRoot, uid)
	if err != nil {
		return Held{}, fmt.Errorf("processes of uid %d: %w", uid, err)
	}
	return HeldUnlinkedOf(procRoot, pids, skip, skipDev, disk, statMapped)
}

// HeldUnlinkedOf is HeldUnlinkedOn for the processes pids, which the
// caller found (ByUIDOwned) as a user that sees them all: where /proc
// hides other users' processes (hidepid), a process of the uid that is
// not dumpable is hidden from the uid itself, so its own listing would
// pass over it. Measured as the uid, such a process is taken as refused
// while it lives (scanOf), as where /proc shows it but refuses its table.
func HeldUnlinkedOf(procRoot string, pids []int, skip map[int]bool, skipDev uint64, disk map[uint64]bool, statMapped StatMapped) (Held, error) {
	s := &heldScan{procRoot: procRoot, skipDev: skipDev, disk: disk, statMapped: statMapped,
		seen: map[inode]int64{}, mapped: map[inode]int64{}, unread: map[inode]string{}}
	// A process whose table cannot be read may be between a change of
	// uid and its exec (not dumpable for that moment): such ones are
	// asked again, all together, until refusalHides says they count.
	var refused []int
	var hidden []string
	for _, pid := range pids {
		if skip[pid] {
			continue
		}
		switch err := s.scanOf(pid); {
		case tooMany(err):
			return Held{}, fmt.Errorf("%w: %w", ErrHidden, err)
		case err == nil, errors.Is(err, os.ErrNotExist), errors.Is(err, unix.ESRCH):
			// measured, or gone
		case errors.Is(err, os.ErrPermission), errors.Is(err, errInFlight):
			if !zombie(procRoot, pid) {
				refused = append(refused, pid)
			}
		default:
			hidden = append(hidden, describePID(procRoot, pid, err))
		}
	}
	more, err := s.retryRefused(refused)
	if err != nil {
		return Held{}, err
	}
	hidden = append(hidden, more...)
	for k, why := range s.unread {
		if _, ok := s.seen[k]; !ok {
			hidden = append(hidden, why) // no descriptor nor entry showed its blocks
		}
	}
	for k, n := range s.mapped {
		if _, ok := s.seen[k]; !ok {
			s.seen[k] = n
		}
	}
	var h Held
	for _, n := range s.seen {
		h.Bytes += n
		h.Files++
	}
	if len(hidden) > 0 {
		sort.Strings(hidden)
		return h, fmt.Errorf("%w: %s", ErrHidden, strings.Join(hidden, "; "))
	}
	return h, nil
}

// tooMany says whether err is one of the bounds on a measure: then the
// whole measure is hidden, not one process.
func tooMany(err error) bool {
	return errors.Is(err, errTooManyMappings) || errors.Is(err, errTooManyLinks) || errors.Is(err, errTooManyMappedStats)
}

// heldScan is one HeldUnlinkedOn: what it asks and what it has found so
// far, every process together.
type heldScan struct {
	procRoot   string
	skipDev    uint64
	disk       map[uint64]bool
	statMapped StatMapped
	// seen holds what a descriptor or a map_files entry shows (its
	// blocks); mapped what only mappings of memory show (the most bytes
	// one maps); unread the deleted files on the role's file systems whose
	// map_files entry could not be read, and why, until a descriptor or
	// another process's entry shows their blocks.
	seen   map[inode]int64
	mapped map[inode]int64
	unread map[inode]string
	// mappings are the lines of maps read, links the /proc links stat'ed,
	// stats the map_files entries stat'ed, each bounded.
	mappings, links, stats int
	// fdinfo is where a socket's fdinfo is read (inFlight).
	fdinfo [512]byte
}

// retryRefused asks the processes whose tables could not be read, or
// whose sockets kept descriptors in flight, again, every 20 ms, until each
// is read with none in flight, gone, a zombie, or refusalHides says it
// counts as hidden. Passing a descriptor keeps it in flight for a moment
// (until the peer's recvmsg); a program that passes handles is seen with
// none in flight when asked again.
func (s *heldScan) retryRefused(refused []int) (hidden []string, err error) {
	// What each refused process had run when first refused: a process
	// that is only becoming a role's command needs a few milliseconds of
	// CPU to reach its exec, however long a loaded machine makes it wait.
	firstCPU := map[int]time.Duration{}
	for _, pid := range refused {
		firstCPU[pid] = cpuTime(s.procRoot, pid)
	}
	for t0 := time.Now(); len(refused) > 0; {
		time.Sleep(20 * time.Millisecond)
		var again []int
		for _, pid := range refused {
			err := s.scanOf(pid)
			waited, ran := time.Since(t0).Round(time.Millisecond), cpuTime(s.procRoot, pid)-firstCPU[pid]
			switch {
			case tooMany(err):
				return nil, fmt.Errorf("%w: %w", ErrHidden, err)
			case err == nil, errors.Is(err, os.ErrNotExist), errors.Is(err, unix.ESRCH), zombie(s.procRoot, pid):
				// Measured, gone, or ended and not yet reaped: a zombie
				// keeps no descriptor nor mapping, and its table is
				// refused to all but root.
			case !errors.Is(err, os.ErrPermission) && !errors.Is(err, errInFlight):
				hidden = append(hidden, describePID(s.procRoot, pid, err))
			case !refusalHides(ran, time.Since(t0)):
				again = append(again, pid)
			case errors.Is(err, errInFlight):
				hidden = append(hidden, describePID(s.procRoot, pid, fmt.Errorf("%w (so for %v, running %v of CPU meanwhile)", err, waited, ran)))
			default:
				hidden = append(hidden, describePID(s.procRoot, pid, fmt.Errorf("its descriptors cannot be read (refused for %v, running %v of CPU meanwhile): %w", waited, ran, os.ErrPermission)))
			}
		}
		refused = again
	}
	return hidden, nil
}

// scanOf is scan, where a process whose /proc entry is not there but which
// lives (kill(pid, 0) answers it: a process the caller may signal, its
// uid's or root's) counts as refused: /proc hides it from the caller
// (hidepid), as it does a process of the caller's uid that is not
// dumpable. Only on the real /proc, whose pids are this system's.
func (s *heldScan) scanOf(pid int) error {
	err := s.scan(pid)
	if errors.Is(err, os.ErrNotExist) && s.procRoot == "/proc" && unix.Kill(pid, 0) == nil {
		return fmt.Errorf("its /proc entry is hidden from the measure (hidepid): %w", os.ErrPermission)
	}
	return err
}

// held takes in the file a /proc link reaches (a descriptor, a folder a
// task works in or is rooted at, the executable): when no name links it
// any more, its blocks. A deleted folder keeps its blocks (ext4 frees
// them when the last reference goes) as a file does, and so does a
// deleted symlink an O_PATH descriptor holds. It returns the file's type
// (S_IFMT bits; 0 where it cannot be stat'ed).
func (s *heldScan) held(link string) uint32 {
	var st unix.Stat_t
	if unix.Stat(link, &st) != nil {
		return 0 // closed since, or not a file one can stat
	}
	kind := st.Mode & unix.S_IFMT
	switch kind {
	case unix.S_IFREG, unix.S_IFDIR, unix.S_IFLNK:
	default:
		return kind
	}
	if st.Nlink != 0 || (s.skipDev != 0 && st.Dev == s.skipDev) {
		return kind
	}
	k := inode{st.Dev, st.Ino}
	s.seen[k] = max(s.seen[k], st.Blocks*512)
	return kind
}

// readMaps reads a process's deleted mappings within the bound.
func (s *heldScan) readMaps(base string) (map[inode]deletedMapping, error) {
	found, n := deletedMappings(base+"/maps", MaxMappings-s.mappings)
	if s.mappings += n; s.mappings > MaxMappings {
		return nil, errTooManyMappings
	}
	return found, nil
}

// scan takes in what one process holds: its tasks' links, then its
// deleted mappings; then it names a socket keeping descriptors in flight.
func (s *heldScan) scan(pid int) error {
	base := s.procRoot + "/" + strconv.Itoa(pid)
	err := s.scanTasks(base, pid)
	if err != nil && !errors.Is(err, errInFlight) && !errors.Is(err, errInFlightUnseen) {
		return err
	}
	// A socket's descriptors in flight are named once the mappings,
	// too, are taken in.
	if merr := s.scanMappings(base, pid); merr != nil {
		return merr
	}
	return err
}

// scanTasks takes in every task's descriptors, working folder and root,
// and the process's executable. Every task: a thread cloned without
// CLONE_FILES or CLONE_FS has a descriptor table, a working folder and a
// root of its own, which the leader's /proc/PID/fd and cwd do not show.
//
// A socket keeping descriptors in flight (or one whose in-flight count
// the kernel does not show) is named in the error returned once the rest
// is taken in: the first such one, every task's files counted still.
func (s *heldScan) scanTasks(base string, pid int) error {
	tids, err := readDir(base + "/task")
	if err != nil {
		return err
	}
	var firstFlight error
	for i, tid := range tids {
		tb := base + "/task/" + tid
		fds, err := readDir(tb + "/fd")
		if err != nil {
			if tid != strconv.Itoa(pid) && (errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH)) {
				continue // a thread that ended meanwhile
			}
			return err
		}
		if s.links += len(fds); s.links > MaxLinks {
			return errTooManyLinks
		}
		for _, fd := range fds {
			if s.held(tb+"/fd/"+fd) == unix.S_IFSOCK && firstFlight == nil {
				firstFlight = s.inFlight(tb, fd)
			}
		}
		s.held(tb + "/cwd")
		s.held(tb + "/root")
		if i == 0 {
			s.held(base + "/exe")
		}
	}
	return firstFlight
}

// scanMappings takes in the process's deleted mappings: those off the
// role's file systems by the bytes mapped, those on them through their
// map_files entries.
func (s *heldScan) scanMappings(base string, pid int) error {
	found, err := s.readMaps(base)
	if err != nil {
		return err
	}
	// The role's file systems' files to read through map_files: those
	// no descriptor counted so far.
	files := map[inode]deletedMapping{}
	for k, m := range found {
		switch {
		case s.skipDev != 0 && k.dev == s.skipDev:
		case !mappedOnly(k.dev, s.disk):
			s.mapped[k] = max(s.mapped[k], m.bytes)
		default:
			if _, ok := s.seen[k]; !ok {
				files[k] = m
			}
		}
	}
	// A mapping may move (mremap) or go (munmap, exit) between the
	// read of maps and of its entry: maps is read again, at most
	// twice, for the files none of whose entries was there. A file no
	// longer mapped, or a process that ended, keeps nothing, as a
	// descriptor closed meanwhile does; a file still mapped whose
	// entry never was there counts as hidden.
	for round := 0; len(files) > 0; round++ {
		if s.stats += len(files); s.stats > MaxMappedStats {
			return errTooManyMappedStats
		}
		for k, m := range files {
			switch why, ok := readMapped(base, k, m, s.statMapped, s.seen); {
			case ok:
				delete(files, k)
			case why != "":
				s.unread[k] = describePID(s.procRoot, pid, errors.New(why))
				delete(files, k)
			}
		}
		if len(files) == 0 {
			break
		}
		if _, err := os.Stat(base); errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			return nil // ended: its mappings went with it
		}
		if round == 2 {
			for k, m := range files {
				s.unread[k] = describePID(s.procRoot, pid, fmt.Errorf("maps a deleted file %q (inode %d) it keeps no descriptor of, whose mappings moved each time they were read (map_files)", m.path, k.ino))
			}
			break
		}
		again, err := s.readMaps(base)
		if err != nil {
			return err
		}
		for k := range files {
			if m, ok := again[k]; ok {
				files[k] = m
			} else {
				delete(files, k) // unmapped since
			}
		}
	}
	return nil
}

type inode struct{ dev, ino uint64 }

// deletedMapping is what a process's maps shows of one deleted file: the
// most bytes one mapping of it spans, the map_files names of its
// mappings, and its path as maps spells it.
type deletedMapping struct {
	bytes  int64
	ranges []string
	path   string
}

// readMapped stats the deleted file k through the map_files entries of its
// mappings in the process at base and counts its blocks in seen (ok). why
// says why it is hidden: the capability is missing, or an entry is
// another file than maps said (the process replaced the mapping
// meanwhile). Neither, and not ok: no entry was there (moved or gone).
func readMapped(base string, k inode, m deletedMapping, statMapped StatMapped, seen map[inode]int64) (why string, ok bool) {
	for _, r := range m.ranges {
		entry := base + "/map_files/" + r
		var st unix.Stat_t
		err := statMapped(entry, &st)
		switch {
		case err == nil && (st.Dev != k.dev || st.Ino != k.ino):
			return fmt.Sprintf("maps a deleted file %q (inode %d) it keeps no descriptor of, and %s is another file (inode %d of device %d:%d), not the one maps names", m.path, k.ino, entry, st.Ino, unix.Major(st.Dev), unix.Minor(st.Dev)), false
		case err == nil:
			if st.Nlink == 0 {
				seen[k] = max(seen[k], st.Blocks*512)
			}
			return "", true
		case errors.Is(err, os.ErrNotExist), errors.Is(err, unix.ESRCH):
			continue // this mapping moved or went: the next one
		default:
			return fmt.Sprintf("maps a deleted file %q (inode %d) it keeps no descriptor of, whose blocks cannot be read: %s: %v", m.path, k.ino, entry, err), false
		}
	}
	return "", false
}

// mappedOnly decides whether a deleted file on dev that only a mapping
// keeps is measured by its blocks (map_files): a mapping shows its own
// length, not the file's blocks, so a lane could write a file under its
// cap through a descriptor, unlink it, map one page, close the
// descriptor, and so keep any number of such files, each counted as one
// page. Memory (a memfd or shared anonymous memory, on the kernel's
// internal shmem mount) is on none of the role's file systems and still
// counts its mapped length.
func mappedOnly(dev uint64, disk map[uint64]bool) bool {
	return disk[dev]
}

// readDir lists a descriptor table.
func readDir(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}

// describePID names a process for the error: its pid and command name.
// refusedCPU and refusedWall bound how long a process whose descriptors
// cannot be read is asked again before it counts as hiding them: the CPU
// it runs meanwhile, or the time that passes however little it runs.
const (
	refusedCPU  = 200 * time.Millisecond
	refusedWall = 5 * time.Second
)

// refusalHides decides whether a process refused since its first refusal
// counts as hiding its files: once it has run refusedCPU of CPU (a
// process between its change of uid and its exec needs far less; one
// that made itself undumpable goes on running), or after refusedWall. On
// a machine other lanes load, a command on its way to its exec may wait
// seconds for the CPU: the wall time alone must not end its trial.
func refusalHides(cpu, wall time.Duration) bool {
	return cpu >= refusedCPU || wall >= refusedWall
}

// zombie reports whether a process has ended and waits for its parent
// to reap it (state Z or X in /proc/<pid>/stat), all its threads with it:
// a main thread that ended alone is a zombie too, while another thread
// keeps every descriptor (num_threads, which counts the zombie leader
// until it is reaped, is then over 1).
func zombie(procRoot string, pid int) bool {
	b, err := os.ReadFile(procRoot + "/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	// After the name: state (field 3) ... num_threads (field 20).
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 18 || f[17] != "1" {
		return false
	}
	return f[0] == "Z" || f[0] == "X"
}

// cpuTime is the user and system time a process has run, from
// /proc/<pid>/stat (readable however undumpable it is); 0 when it is gone.
func cpuTime(procRoot string, pid int) time.Duration {
	b, err := os.ReadFile(procRoot + "/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The fields after the command's closing parenthesis, from the state
	// (field 3): utime and stime are fields 14 and 15, in clock ticks of
	// 1/100 s (USER_HZ).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

func describePID(procRoot string, pid int, err error) string {
	comm, _ := os.ReadFile(procRoot + "/" + strconv.Itoa(pid) + "/comm")
	return fmt.Sprintf("process %d (%s): %v", pid, strings.TrimSpace(string(comm)), err)
}

// deletedMappings reads a maps file for mappings of deleted files: their
// device and inode, the most bytes any one of them maps, the map_files
// name of each (start-end in hex, no leading zeros, as the kernel names
// them) and the path. lines is how many mappings it read: at most limit,
// and limit+1 when there were more (the rest unread).
func deletedMappings(path string, limit int) (out map[inode]deletedMapping, lines int) {
	out = map[inode]deletedMapping{}
	f, err := os.Open(path)
	if err != nil {
		return out, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if lines++; lines > limit {
			return out, lines
		}
		line := sc.Text()
		name, ok := strings.CutSuffix(line, " (deleted)")
		if !ok {
			continue
		}
		// start-end perms offset major:minor inode path
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		majS, minS, ok2 := strings.Cut(f[3], ":")
		if !ok || !ok2 {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		maj, err3 := strconv.ParseUint(majS, 16, 32)
		mnr, err4 := strconv.ParseUint(minS, 16, 32)
		ino, err5 := strconv.ParseUint(f[4], 10, 64)
		if errors.Join(err1, err2, err3, err4, err5) != nil || ino == 0 || end <= start {
			continue
		}
		// The path is what follows the inode field, spaces and all.
		if i := strings.Index(name, " /"); i >= 0 {
			name = name[i+1:]
		}
		k := inode{unix.Mkdev(uint32(maj), uint32(mnr)), ino}
		m := out[k]
		m.bytes = max(m.bytes, int64(end-start))
		m.ranges = append(m.ranges, strconv.FormatUint(start, 16)+"-"+strconv.FormatUint(end, 16))
		m.path = name
		out[k] = m
	}
	return out, lines
}
