package procs

import (
	"bufio"
	"errors"
	"fmt"
	"os"
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
// dumpable), or the measure was killed. The trial's own processes did it,
// so it counts as over every cap.
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

// HeldUnlinked measures what the processes whose real uid is uid (all but
// this one) hold in unlinked regular files: every descriptor (stat through
// /proc/<pid>/fd/<n>, which reaches the open file, not a name), and every
// mapping of a deleted file whose descriptor was closed (/proc/<pid>/maps:
// its mapped length, as map_files needs CAP_SYS_ADMIN). Each inode counts
// once. It runs as that uid, which may read its own processes' tables, and
// which can change its effective uid to no other (ByUIDOwned);
// skip names processes to pass over (the broker's own commands, which hold
// no descriptor of the user's and may not be dumpable).
func HeldUnlinked(procRoot string, uid int, skip map[int]bool) (Held, error) {
	return HeldUnlinkedExcept(procRoot, uid, skip, 0)
}

// HeldUnlinkedExcept is HeldUnlinked passing over the files of the file
// system skipDev (an st_dev; 0 passes over none).
func HeldUnlinkedExcept(procRoot string, uid int, skip map[int]bool, skipDev uint64) (Held, error) {
	return HeldUnlinkedOn(procRoot, uid, skip, skipDev, nil)
}

// HeldUnlinkedOn is HeldUnlinkedExcept where the role's files lie on the
// file systems disk (st_dev; nil: none known). A deleted file there that
// a process keeps by a mapping alone, with no descriptor of it left in any
// process of the user, cannot be measured (mappedOnly): the measure then
// fails with ErrHidden.
func HeldUnlinkedOn(procRoot string, uid int, skip map[int]bool, skipDev uint64, disk map[uint64]bool) (Held, error) {
	pids, err := ByUIDOwned(procRoot, uid)
	if err != nil {
		return Held{}, fmt.Errorf("processes of uid %d: %w", uid, err)
	}
	type inode struct{ dev, ino uint64 }
	// seen holds what a descriptor shows (its blocks); mapped what only
	// mappings show (the most bytes one maps), and a process mapping it.
	seen := map[inode]int64{}
	type mapping struct {
		bytes int64
		pid   int
	}
	mapped := map[inode]mapping{}
	mappings := 0 // lines of maps read, every process together
	// A process whose table cannot be read may be between a change of
	// uid and its exec (not dumpable for that moment): such ones are
	// asked again, all together, for up to a second before they count.
	var refused []int
	// held takes in the file a /proc link reaches (a descriptor, a
	// folder a task works in or is rooted at, the executable): when no
	// name links it any more, its blocks. A deleted folder keeps its
	// blocks (ext4 frees them when the last reference goes) as a file
	// does, and so does a deleted symlink an O_PATH descriptor holds.
	held := func(link string) {
		var st unix.Stat_t
		if unix.Stat(link, &st) != nil {
			return // closed since, or not a file one can stat
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG, unix.S_IFDIR, unix.S_IFLNK:
		default:
			return
		}
		if st.Nlink != 0 || (skipDev != 0 && st.Dev == skipDev) {
			return
		}
		k := inode{st.Dev, st.Ino}
		seen[k] = max(seen[k], st.Blocks*512)
	}
	links := 0 // /proc links stat'ed, every process together
	scan := func(pid int) error {
		base := procRoot + "/" + strconv.Itoa(pid)
		// Every task: a thread cloned without CLONE_FILES or CLONE_FS
		// has a descriptor table, a working folder and a root of its
		// own, which the leader's /proc/PID/fd and cwd do not show.
		tids, err := readDir(base + "/task")
		if err != nil {
			return err
		}
		for i, tid := range tids {
			tb := base + "/task/" + tid
			fds, err := readDir(tb + "/fd")
			if err != nil {
				if tid != strconv.Itoa(pid) && (errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH)) {
					continue // a thread that ended meanwhile
				}
				return err
			}
			if links += len(fds); links > MaxLinks {
				return errTooManyLinks
			}
			for _, fd := range fds {
				held(tb + "/fd/" + fd)
			}
			held(tb + "/cwd")
			held(tb + "/root")
			if i == 0 {
				held(base + "/exe")
			}
		}
		found, n := deletedMappings(base+"/maps", MaxMappings-mappings)
		if mappings += n; mappings > MaxMappings {
			return errTooManyMappings
		}
		for k, n := range found {
			if skipDev == 0 || k.dev != skipDev {
				if m := mapped[inode(k)]; n > m.bytes {
					mapped[inode(k)] = mapping{n, pid}
				}
			}
		}
		return nil
	}
	var hidden []string
	for _, pid := range pids {
		if skip[pid] {
			continue
		}
		switch err := scan(pid); {
		case errors.Is(err, errTooManyMappings), errors.Is(err, errTooManyLinks):
			return Held{}, fmt.Errorf("%w: %w", ErrHidden, err)
		case err == nil, errors.Is(err, os.ErrNotExist), errors.Is(err, unix.ESRCH):
			// measured, or gone
		case errors.Is(err, os.ErrPermission):
			refused = append(refused, pid)
		default:
			hidden = append(hidden, describePID(procRoot, pid, err))
		}
	}
	for deadline := time.Now().Add(time.Second); len(refused) > 0; {
		if time.Now().After(deadline) {
			for _, pid := range refused {
				hidden = append(hidden, describePID(procRoot, pid, fmt.Errorf("its descriptors cannot be read: %w", os.ErrPermission)))
			}
			break
		}
		time.Sleep(20 * time.Millisecond)
		var again []int
		for _, pid := range refused {
			switch err := scan(pid); {
			case errors.Is(err, errTooManyMappings), errors.Is(err, errTooManyLinks):
				return Held{}, fmt.Errorf("%w: %w", ErrHidden, err)
			case errors.Is(err, os.ErrPermission):
				again = append(again, pid)
			}
		}
		refused = again
	}
	for k, m := range mapped {
		if _, ok := seen[k]; ok {
			continue // its descriptor showed its blocks
		}
		if mappedOnly(k.dev, disk) {
			hidden = append(hidden, describePID(procRoot, m.pid, fmt.Errorf("maps a deleted file (inode %d) it keeps no descriptor of, whose blocks no measure can read", k.ino)))
			continue
		}
		seen[k] = m.bytes
	}
	var h Held
	for _, n := range seen {
		h.Bytes += n
		h.Files++
	}
	if len(hidden) > 0 {
		return h, fmt.Errorf("%w: %s", ErrHidden, strings.Join(hidden, "; "))
	}
	return h, nil
}

// mappedOnly decides whether a deleted file on dev that only a mapping
// keeps defeats the measure. A mapping shows its own length, not the
// file's blocks: a lane could write a file under its cap through a
// descriptor, unlink it, map one page, close the descriptor, and so keep
// any number of such files, each counted as one page. The file's blocks
// are out of reach (/proc/PID/map_files opens it only with
// CAP_CHECKPOINT_RESTORE, which the broker does not hold), so such a file
// on a file system where the role's folders lie counts as hidden. Memory
// (a memfd or shared anonymous memory, on the kernel's internal shmem
// mount) is on none of those and still counts its mapped length.
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
func describePID(procRoot string, pid int, err error) string {
	comm, _ := os.ReadFile(procRoot + "/" + strconv.Itoa(pid) + "/comm")
	return fmt.Sprintf("process %d (%s): %v", pid, strings.TrimSpace(string(comm)), err)
}

// deletedMappings reads a maps file for mappings of deleted files: their
// device and inode, and the most bytes any one of them maps.
// lines is how many mappings it read: at most limit, and limit+1 when
// there were more (the rest unread).
func deletedMappings(path string, limit int) (out map[struct{ dev, ino uint64 }]int64, lines int) {
	out = map[struct{ dev, ino uint64 }]int64{}
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
		if !strings.HasSuffix(line, " (deleted)") {
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
		k := struct{ dev, ino uint64 }{unix.Mkdev(uint32(maj), uint32(mnr)), ino}
		out[k] = max(out[k], int64(end-start))
	}
	return out, lines
}
