// Package hashtree hashes a stored build and checks it again before a timed
// run.
//
// A manifest maps each entry's path, relative to the build's root and
// written with "/", to what the entry is:
//
//	"<64 hex digits>"   a regular file, by the SHA-256 of its content
//	"dir"               an empty folder (a folder with entries is implied
//	                    by their paths)
//
// A stored build holds nothing else: what runs must be exactly what was
// hashed, so a symlink (whose target can change), a regular file with more
// than one link (which can change through its other name), a device, a
// FIFO or a socket is an error naming it, in Hash and so in Verify. A
// manifest that records a symlink ("symlink:<target>", as older versions
// wrote) is refused.
//
// The tree is walked by descriptor: every folder is opened with
// openat(O_NOFOLLOW|O_DIRECTORY) relative to its parent, every file with
// openat(O_NOFOLLOW) and checked again with fstat, so a symlink swapped in
// while the walk runs is refused, never followed. Files are hashed in
// parallel, one worker per CPU.
package hashtree

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path"
	"runtime"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// SymlinkPrefix started a symlink's manifest value in older versions; a
// manifest holding one is refused.
const SymlinkPrefix = "symlink:"

// Dir is an empty folder's manifest value.
const Dir = "dir"

// readBuf is each worker's read size.
const readBuf = 256 << 10

// job is one regular file to hash: its open descriptor and its path.
type job struct {
	rel string
	fd  int
}

// hasher is one Hash call: the walk feeds jobs to the workers, and the
// first error (the walk's or a worker's) stops both.
type hasher struct {
	jobs chan job
	mu   sync.Mutex
	out  map[string]string
	err  error
	dent []byte // the walk's readlink buffer
}

func (h *hasher) fail(err error) {
	h.mu.Lock()
	if h.err == nil {
		h.err = err
	}
	h.mu.Unlock()
}

func (h *hasher) failed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err != nil
}

func (h *hasher) put(rel, v string) {
	h.mu.Lock()
	h.out[rel] = v
	h.mu.Unlock()
}

// Hash returns the manifest of the folder root: every regular file by its
// SHA-256, every empty folder as Dir. Anything else beneath root is an
// error (plainEntry). root itself must be a folder, not a symlink to one.
func Hash(root string) (map[string]string, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil, fmt.Errorf("hashtree: %s: not a folder (a symlink or a file)", root)
		}
		return nil, fmt.Errorf("hashtree: %s: %w", root, err)
	}
	workers := runtime.GOMAXPROCS(0)
	h := &hasher{
		jobs: make(chan job, 4*workers),
		out:  map[string]string{},
		dent: make([]byte, unix.PathMax),
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.work()
		}()
	}
	_, werr := h.walk(fd, "")
	if werr != nil {
		h.fail(werr)
	}
	close(h.jobs)
	wg.Wait()
	if h.err != nil {
		return nil, h.err
	}
	return h.out, nil
}

// work hashes files until the jobs run out; after a failure it only
// closes what it is handed.
func (h *hasher) work() {
	buf := make([]byte, readBuf)
	sum := sha256.New()
	for j := range h.jobs {
		if h.failed() {
			unix.Close(j.fd)
			continue
		}
		sum.Reset()
		err := readAll(j.fd, buf, func(b []byte) { sum.Write(b) })
		unix.Close(j.fd)
		if err != nil {
			h.fail(fmt.Errorf("hashtree: %s: %w", j.rel, err))
			continue
		}
		h.put(j.rel, hex.EncodeToString(sum.Sum(nil)))
	}
}

// readAll reads fd to its end, handing each chunk to fn.
func readAll(fd int, buf []byte, fn func([]byte)) error {
	for {
		n, err := unix.Read(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		fn(buf[:n])
	}
}

// walk records every entry beneath the open folder dir, whose path is rel
// ("" for the root), and says how many entries it has. It takes dir over
// and closes it.
func (h *hasher) walk(dir int, rel string) (int, error) {
	f := os.NewFile(uintptr(dir), show(rel))
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return 0, fmt.Errorf("hashtree: %s: %w", show(rel), err)
	}
	sort.Strings(names)
	for _, name := range names {
		if h.failed() {
			return 0, nil
		}
		child := name
		if rel != "" {
			child = rel + "/" + name
		}
		if err := h.entry(dir, name, child); err != nil {
			return 0, err
		}
	}
	return len(names), nil
}

// entry records one entry of the folder dir.
func (h *hasher) entry(dir int, name, rel string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("hashtree: %s: %w", rel, err)
	}
	if err := h.plainEntry(dir, name, rel, &st); err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		// O_NONBLOCK: should a FIFO be swapped in after the stat, the open
		// must not wait for a writer; the fstat below refuses it.
		fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("hashtree: %s: %w", rel, err)
		}
		var now unix.Stat_t
		if err := unix.Fstat(fd, &now); err != nil {
			unix.Close(fd)
			return fmt.Errorf("hashtree: %s: %w", rel, err)
		}
		if now.Dev != st.Dev || now.Ino != st.Ino || now.Nlink != 1 {
			unix.Close(fd)
			return fmt.Errorf("hashtree: %s: replaced while being hashed", rel)
		}
		h.jobs <- job{rel: rel, fd: fd}
		return nil
	default: // a folder
		fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				return fmt.Errorf("hashtree: %s: replaced while being hashed", rel)
			}
			return fmt.Errorf("hashtree: %s: %w", rel, err)
		}
		n, err := h.walk(fd, rel)
		if err != nil {
			return err
		}
		if n == 0 {
			h.put(rel, Dir)
		}
		return nil
	}
}

// plainEntry decides what a stored build may hold: folders, and regular
// files with one link. Anything else is an error naming it (a symlink with
// its target).
func (h *hasher) plainEntry(dir int, name, rel string, st *unix.Stat_t) error {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return nil
	case unix.S_IFREG:
		if st.Nlink != 1 {
			return fmt.Errorf("hashtree: %s has %d links: a stored build holds files with one link only", rel, st.Nlink)
		}
		return nil
	case unix.S_IFLNK:
		target, err := h.readlink(dir, name)
		if err != nil {
			return fmt.Errorf("hashtree: %s: %w", rel, err)
		}
		return fmt.Errorf("hashtree: %s: a symlink (to %q): a stored build holds files and folders only", rel, target)
	}
	return fmt.Errorf("hashtree: %s: %s, not a file or folder", rel, Kind(st.Mode))
}

func (h *hasher) readlink(dir int, name string) (string, error) {
	for {
		n, err := unix.Readlinkat(dir, name, h.dent)
		if err != nil {
			return "", err
		}
		if n < len(h.dent) {
			return string(h.dent[:n]), nil
		}
		h.dent = make([]byte, 2*len(h.dent))
	}
}

// Kind names a file type for an error ("a symlink", "a FIFO", …).
func Kind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFLNK:
		return "a symlink"
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFSOCK:
		return "a socket"
	}
	return fmt.Sprintf("a file of type %#o", mode&unix.S_IFMT)
}

func show(rel string) string {
	if rel == "" {
		return "."
	}
	return rel
}

// Verify hashes root again and compares it with manifest. It returns nil
// when they match, and otherwise the first difference, in path order, as
// one line naming the entry: its content changed, it appeared, it is
// missing, or it is now another kind of entry.
func Verify(root string, manifest map[string]string) error {
	if err := checkManifest(manifest); err != nil {
		return err
	}
	got, err := Hash(root)
	if err != nil {
		return err
	}
	return Diff(manifest, got)
}

// checkManifest refuses a manifest that Hash could not have written.
func checkManifest(m map[string]string) error {
	for p, v := range m {
		if p == "" || p == "." || path.Clean(p) != p || strings.HasPrefix(p, "/") || p == ".." || strings.HasPrefix(p, "../") {
			return fmt.Errorf("hashtree: manifest: %q is not a clean path inside the build", p)
		}
		if strings.HasPrefix(v, SymlinkPrefix) {
			return fmt.Errorf("hashtree: manifest: %s records a symlink: a stored build holds files and folders only", p)
		}
		if v != Dir && !IsSHA256(v) {
			return fmt.Errorf("hashtree: manifest: %s: %q is not a hex SHA-256 or %q", p, v, Dir)
		}
	}
	return nil
}

// IsSHA256 says whether v is a SHA-256 in lower-case hex, as Hash writes
// it.
func IsSHA256(v string) bool {
	if len(v) != 2*sha256.Size {
		return false
	}
	for _, c := range v {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// Diff compares a recorded manifest with one made now and returns the
// first difference in path order, or nil.
func Diff(recorded, now map[string]string) error {
	want, got := withFolders(recorded), withFolders(now)
	keys := make([]string, 0, len(want)+len(got))
	for k := range want {
		keys = append(keys, k)
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		w, inW := want[k]
		g, inG := got[k]
		switch {
		case !inG:
			return fmt.Errorf("hashtree: %s is missing (%s was recorded)", k, describe(w))
		case !inW:
			return fmt.Errorf("hashtree: %s appeared (%s)", k, describe(g))
		case w == g:
		case IsSHA256(w) && IsSHA256(g):
			return fmt.Errorf("hashtree: %s: content changed (sha256 %s… now, %s… recorded)", k, g[:12], w[:12])
		default:
			return fmt.Errorf("hashtree: %s: now %s, %s was recorded", k, describe(g), describe(w))
		}
	}
	return nil
}

// withFolders copies a manifest with every folder its paths imply added
// as Dir, so that a folder is compared like any other entry.
func withFolders(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
		for d := path.Dir(k); d != "." && d != "/"; d = path.Dir(d) {
			if out[d] == Dir {
				break // and so is every folder above it
			}
			out[d] = Dir
		}
	}
	return out
}

func describe(v string) string {
	if v == Dir {
		return "a folder"
	}
	return "a file"
}
