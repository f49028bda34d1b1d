package selftest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/rpc"
	"thermite/roles"
)

// The disk check's row (issue 17): where no quota measures a role, its
// folders are measured incrementally, from what inotify says changed, and
// a file whose growth no folder event shows (its holes filled through a
// shared mapping) must still be counted. The lane's probe maps a sparse
// file of its workspace, fills the holes and keeps the mapping while the
// broker measures: the mapping holds the file open, so not even a close
// event comes until it goes. The measure must count at least what a full
// walk of the same folders finds.

// OpFillHoles maps the sparse file Path, closes its descriptor, writes a
// byte in every page and syncs, makes Path+".filled", and keeps the
// mapping until Path+".measured" is there.
const OpFillHoles = "fill-holes"

// sparseSize is the size of the sparse file placed for the row.
const sparseSize = 1 << 20

// handshakeWait bounds each side's wait for the other.
const handshakeWait = 30 * time.Second

// fillHolesThroughMmap is the probe's side of the row.
func fillHolesThroughMmap(a Attempt) Outcome {
	fd, err := unix.Open(a.Path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return result(a.ID, err)
	}
	m, err := unix.Mmap(fd, 0, sparseSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	unix.Close(fd)
	if err != nil {
		return result(a.ID, err)
	}
	defer unix.Munmap(m)
	for i := 0; i < len(m); i += 4096 {
		m[i] = 1
	}
	if err := unix.Msync(m, unix.MS_SYNC); err != nil {
		return result(a.ID, err)
	}
	return awaitMeasure(a)
}

// awaitMeasure is a disk probe's hand-over: it makes Path+".filled", for
// the broker to measure, and returns once Path+".measured" is there.
func awaitMeasure(a Attempt) Outcome {
	f, err := unix.Open(a.Path+".filled", unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return result(a.ID, err)
	}
	unix.Close(f)
	if !waitFor(a.Path + ".measured") {
		return Outcome{ID: a.ID, Got: "ETIMEDOUT", Detail: "no " + a.Path + ".measured from the broker"}
	}
	return result(a.ID, nil)
}

// waitFor waits, up to handshakeWait, for path to be there.
func waitFor(path string) bool { return awaitFile(path, handshakeWait, nil) }

// diskPhase runs DiskRows for the first lane, with a sparse file placed
// in its workspace and the broker's measures taken before the probe and
// while it keeps the filled file mapped. One lane stands for all: each is
// measured by the same code.
func diskPhase(h Host, c *Context, record func([]rpc.Probe), fail func(role, attempt, expect, got string)) {
	lane, ok := c.Table.Lane(1)
	if !ok || c.Workspace[1] == "" {
		return
	}
	p := filepath.Join(c.Workspace[1], ".selftest-holes")
	defer func() {
		for _, s := range []string{"", ".filled", ".measured", "-links", "-links.filled", "-links.measured"} {
			removePlaced(c.Cfg.StateDir, p+s)
		}
	}()
	if err := placeSparse(c.Cfg.StateDir, p, lane.UID, lane.GID); err != nil {
		fail("rig", "place a sparse file in lane-1's workspace", "placed", err.Error())
		return
	}
	c.Sparse = map[int]string{1: p}
	c.disk = map[string]diskMeasure{}
	// The first measure takes the file in as it is: holed.
	before, _, err := h.MeasureDisk(lane)
	if err != nil {
		fail("rig", "measure lane-1's folders", "measured", err.Error())
		return
	}
	record(probeRows(c, lane, lane.Name, DiskRows, func(plan []Attempt) ([]Outcome, string) {
		// Each row's step, in the plan's order: the probe makes its
		// Path.filled, the broker measures, then makes Path.measured.
		done := make(chan struct{})
		go func() {
			defer close(done)
			for _, a := range plan {
				d := diskMeasure{before: before}
				if !waitFor(a.Path + ".filled") {
					// The probe is not there: the rest would wait in vain.
					d.err = fmt.Errorf("no %s.filled from the probe", a.Path)
					c.disk[a.Path] = d
					return
				}
				d.counted, d.walked, d.err = h.MeasureDisk(lane)
				d.links = linkBlocks(a.Path)
				before = d.counted
				if err := placeContent(c.Cfg.StateDir, a.Path+".measured", "", lane.UID, lane.GID, 0o600); err != nil {
					d.err = errors.Join(d.err, err)
				}
				c.disk[a.Path] = d
			}
		}()
		outs, why := runProbe(h, c, lane, plan)
		<-done
		return outs, why
	}, func() { stopRole(h, lane) }))
}

// diskMeasure is the broker's measure at one row's step: what the disk
// check counted, what a full walk found, what it counted at the step
// before, and the blocks the symlinks in the row's folder take.
type diskMeasure struct {
	counted, walked, before, links int64
	err                            error
}

// linkBlocks is what the symlinks directly in the folder dir take, 0 where
// it is no folder.
func linkBlocks(dir string) int64 {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var n int64
	for _, e := range ents {
		var st unix.Stat_t
		if e.Type()&os.ModeSymlink != 0 && unix.Lstat(filepath.Join(dir, e.Name()), &st) == nil {
			n += st.Blocks * 512
		}
	}
	return n
}

// OpLongSymlinks makes the folder Path with longSymlinks symlinks in it,
// each with a 4,000-byte target (1,000 where the file system refuses
// that), makes Path+".filled", and removes them
// once Path+".measured" is there.
const OpLongSymlinks = "long-symlinks"

const longSymlinks = 64

// keepBytesInSymlinks is the probe's side of the symlinks row.
func keepBytesInSymlinks(a Attempt) Outcome {
	if err := os.Mkdir(a.Path, 0o700); err != nil {
		return result(a.ID, err)
	}
	defer os.RemoveAll(a.Path)
	// 4,000 bytes where the file system takes them: a target is at most
	// one block less a byte on ext4, so one with 1 KiB blocks (a small
	// file system, as the VM test's quota image) refuses it
	// (ENAMETOOLONG), and 1,000 bytes, which still take a block of their
	// own there (and on XFS, whose limit is 1,024), are made instead. The
	// row compares with the blocks the links really take.
	target := strings.Repeat("a", 4000)
	for i := 0; i < longSymlinks; i++ {
		err := os.Symlink(target, filepath.Join(a.Path, strconv.Itoa(i)))
		if i == 0 && errors.Is(err, unix.ENAMETOOLONG) {
			target = target[:1000]
			err = os.Symlink(target, filepath.Join(a.Path, strconv.Itoa(i)))
		}
		if err != nil {
			return result(a.ID, err)
		}
	}
	return awaitMeasure(a)
}

// symlinksCounted checks that the measure taken while the symlinks were
// there counts at least their blocks more than the step before.
func symlinksCounted(c *Context, r roles.Role, o Outcome) string {
	p := c.Sparse[r.Index] + "-links"
	d := c.disk[p]
	if d.err != nil {
		return "measuring while the probe kept its symlinks: " + d.err.Error()
	}
	if d.counted-d.before < d.links {
		return fmt.Sprintf("the disk check counts %d bytes more in %s's folders after %d symlinks that take %d bytes: %d bytes in their targets went uncounted", d.counted-d.before, r.Name, longSymlinks, d.links, d.links-(d.counted-d.before))
	}
	return ""
}

// placeSparse makes a new file at path of sparseSize bytes and no block,
// owned by uid:gid, through descriptors as placeContent does.
func placeSparse(stateDir, path string, uid, gid int) error {
	if err := placeContent(stateDir, path, "", uid, gid, 0o600); err != nil {
		return err
	}
	pfd, err := openParent(stateDir, path)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	fd, err := unix.Openat(pfd, filepath.Base(path), unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, sparseSize); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// holesCounted checks that the measure taken while the probe kept the
// filled file mapped counts at least what a full walk found then.
func holesCounted(c *Context, r roles.Role, o Outcome) string {
	p := c.Sparse[r.Index]
	d := c.disk[p]
	if d.err != nil {
		return "measuring while the probe kept the file mapped: " + d.err.Error()
	}
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return fmt.Sprintf("%s: %v", p, err)
	}
	if st.Blocks*512 < sparseSize {
		return fmt.Sprintf("%s holds %d bytes after the probe's writes, not %d", p, st.Blocks*512, sparseSize)
	}
	if d.counted < d.walked {
		return fmt.Sprintf("the disk check counts %d bytes in %s's folders, a full walk %d: %d bytes written where no folder event shows went uncounted", d.counted, r.Name, d.walked, d.walked-d.counted)
	}
	return ""
}
