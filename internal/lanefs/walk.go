package lanefs

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

var direntPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// readNames lists the folder fd (opened for reading), without "." and "..".
func readNames(fd int) ([]string, error) {
	bp := direntPool.Get().(*[]byte)
	defer direntPool.Put(bp)
	buf := *bp
	var names []string
	if _, err := unix.Seek(fd, 0, io.SeekStart); err != nil {
		return nil, err
	}
	for {
		n, err := unix.ReadDirent(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

// openSub opens the folder name inside dirfd for reading, never through a
// symlink (O_NOFOLLOW on a single name, beneath dirfd).
func openSub(dirfd int, name string) (int, error) {
	return openBeneath(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
}

// removeTree removes name, in the folder pfd, and everything below it. It
// goes by descriptors: each folder is opened with O_NOFOLLOW relative to
// its parent's descriptor and its entries are removed with unlinkat
// relative to it, so a folder swapped for a symlink is removed as the
// symlink and never entered. It returns how many entries went.
func removeTree(pfd int, name string, depth int) (int, error) {
	if depth > maxDepth {
		return 0, errTooDeep
	}
	removed := 0
	for tries := 0; ; tries++ {
		err := unix.Unlinkat(pfd, name, 0)
		if err == nil {
			return removed + 1, nil
		}
		if err == unix.ENOENT {
			return removed, nil
		}
		if err != unix.EISDIR || tries >= 8 {
			return removed, err
		}
		fd, err := openSub(pfd, name)
		if err == unix.ELOOP || err == unix.ENOTDIR || err == unix.ENOENT {
			continue // swapped while we looked: try it as what it is now
		}
		if err != nil {
			return removed, err
		}
		n, err := removeBelow(fd, depth)
		unix.Close(fd)
		removed += n
		if err != nil {
			return removed, err
		}
		err = unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR)
		switch err {
		case nil:
			return removed + 1, nil
		case unix.ENOENT:
			return removed, nil
		case unix.ENOTEMPTY, unix.ENOTDIR:
			continue // something came in, or it was swapped: again
		}
		return removed, err
	}
}

// removeBelow empties the folder fd.
func removeBelow(fd int, depth int) (int, error) {
	removed := 0
	for round := 0; round < 8; round++ {
		names, err := readNames(fd)
		if err != nil {
			return removed, err
		}
		if len(names) == 0 {
			return removed, nil
		}
		for _, n := range names {
			m, err := removeTree(fd, n, depth+1)
			removed += m
			if err != nil {
				return removed, err
			}
		}
	}
	return removed, nil
}

// errStop ends a walk early; it is not an error to the caller.
var errStop = errors.New("stop")

// walkFunc sees each entry below a walk's top: the folder's descriptor,
// the entry's name in it and its path below the top, and its lstat. A
// folder is entered after fn returns true for it.
type walkFunc func(dirfd int, name, rel string, st *unix.Stat_t) (enter bool, err error)

// walk visits everything below the folder fd, names sorted, depth first.
// It never follows a symlink: each folder is opened by its single name
// with O_NOFOLLOW relative to its parent's descriptor; an entry that is
// gone or swapped by the time it is opened is skipped. Folders deeper
// than maxDepth are not entered.
func walk(fd int, rel string, depth int, fn walkFunc) error {
	names, err := readNames(fd)
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, name := range names {
		child := name
		if rel != "" {
			child = rel + "/" + name
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if err == unix.ENOENT {
				continue
			}
			return err
		}
		enter, err := fn(fd, name, child, &st)
		if err != nil {
			return err
		}
		if !enter || st.Mode&unix.S_IFMT != unix.S_IFDIR || depth >= maxDepth {
			continue
		}
		sub, err := openSub(fd, name)
		if err != nil {
			if err == unix.ENOENT || err == unix.ELOOP || err == unix.ENOTDIR || err == unix.EACCES {
				continue // gone, swapped for a symlink or a file, or closed to us
			}
			return err
		}
		err = walk(sub, child, depth+1, fn)
		unix.Close(sub)
		if err != nil {
			return err
		}
	}
	return nil
}

// globMatch matches a name, or the path below the walk's top when the
// pattern has a slash. An empty pattern matches everything.
func globMatch(glob, name, rel string) bool {
	if glob == "" {
		return true
	}
	target := name
	if strings.Contains(glob, "/") {
		target = rel
	}
	ok, _ := filepath.Match(glob, target)
	return ok
}

func checkGlob(glob string) *Error {
	if glob == "" {
		return nil
	}
	if _, err := filepath.Match(glob, ""); err != nil {
		return errorf(CodeBadRequest, "glob %q: %v", glob, err)
	}
	return nil
}

func (s *Server) find(req *FindRequest) (*FindResponse, *Error) {
	r, e := s.root(req.Root)
	if e != nil {
		return nil, e
	}
	if e := checkGlob(req.Glob); e != nil {
		return nil, e
	}
	limit := req.Max
	if limit <= 0 {
		limit = DefaultFind
	}
	limit = min(limit, MaxFind)
	fd, path, e := r.openDir(req.Path)
	if e != nil {
		return nil, e
	}
	defer unix.Close(fd)
	resp := &FindResponse{Paths: []string{}}
	budget := answerBudget
	err := walk(fd, "", 0, func(_ int, name, rel string, _ *unix.Stat_t) (bool, error) {
		if globMatch(req.Glob, name, rel) {
			if len(resp.Paths) >= limit || budget < 0 {
				resp.Truncated = true
				return false, errStop
			}
			p := joinShow(req.Path, rel)
			budget -= len(p) + 8
			resp.Paths = append(resp.Paths, p)
		}
		return true, nil
	})
	if err != nil && err != errStop {
		return nil, r.fail(path, err)
	}
	return resp, nil
}

func (s *Server) grep(req *GrepRequest) (*GrepResponse, *Error) {
	r, e := s.root(req.Root)
	if e != nil {
		return nil, e
	}
	if e := checkGlob(req.Glob); e != nil {
		return nil, e
	}
	re, err := regexp.Compile(req.Pattern)
	if err != nil {
		return nil, errorf(CodeBadRequest, "pattern: %v", err)
	}
	g := &grepper{re: re, limit: req.MaxMatches, budget: answerBudget, resp: &GrepResponse{Matches: []Match{}}}
	if g.limit <= 0 {
		g.limit = DefaultMatches
	}
	g.limit = min(g.limit, MaxMatches)
	path := req.Path
	if path == "" {
		path = "."
	}
	// The top may be a file or a folder; symlinks inside the root are
	// followed here, as for read, but never below it.
	fd, err := openBeneath(r.fd, path, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, r.fail(path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, r.fail(path, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		err = g.file(fd, path)
	case unix.S_IFDIR:
		err = walk(fd, "", 0, func(dirfd int, name, rel string, st *unix.Stat_t) (bool, error) {
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFDIR:
				return true, nil
			case unix.S_IFREG:
			default:
				return false, nil // symlinks, FIFOs, sockets: skipped
			}
			if !globMatch(req.Glob, name, rel) {
				return false, nil
			}
			ffd, err := openBeneath(dirfd, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW, 0)
			if err != nil {
				return false, nil // gone, swapped or closed to us: skipped
			}
			defer unix.Close(ffd)
			var fst unix.Stat_t
			if unix.Fstat(ffd, &fst) != nil || fst.Mode&unix.S_IFMT != unix.S_IFREG {
				return false, nil
			}
			if err := g.file(ffd, joinShow(req.Path, rel)); err == errStop {
				return false, errStop
			}
			return false, nil // a file that fails to read is passed over
		})
	default:
		return nil, errorf(CodeBadRequest, "%s: not a regular file or a folder", show(path))
	}
	if err != nil && err != errStop {
		return nil, r.fail(path, err)
	}
	return g.resp, nil
}

type grepper struct {
	re     *regexp.Regexp
	limit  int
	budget int
	resp   *GrepResponse
	br     *bufio.Reader
	long   []byte
}

// fdReader reads a descriptor.
type fdReader int

func (f fdReader) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(int(f), p)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return 0, io.EOF
		}
		return n, nil
	}
}

// binarySniff is how much of a file's start is checked for a NUL byte.
const binarySniff = 8000

// maxScanLine is how much of one line is matched; the rest of a longer
// line is passed over.
const maxScanLine = 1 << 20

// sizeReader reads a descriptor up to the size its file had when grep
// decided to read it: a file its writer grows meanwhile (truncate -s 1T)
// is read no further.
type sizeReader struct {
	fd   int
	left int64
}

func (s *sizeReader) Read(p []byte) (int, error) {
	if s.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > s.left {
		p = p[:s.left]
	}
	n, err := fdReader(s.fd).Read(p)
	s.left -= int64(n)
	return n, err
}

// hasHole says whether the file fd holds a hole before its end: a hole
// reads as NUL bytes, so the file is binary, as GNU grep takes it. A lane
// can publish a file of 16 TiB that takes a few blocks (truncate -s); read
// whole, it would hold the searching lane's file helper for an hour. A
// file system that cannot say where holes lie has none to say.
func hasHole(fd int, size int64) bool {
	if size == 0 {
		return false
	}
	off, err := unix.Seek(fd, 0, unix.SEEK_HOLE)
	if _, rerr := unix.Seek(fd, 0, io.SeekStart); rerr != nil {
		return true // unreadable from its start: passed over as binary
	}
	return err == nil && off < size
}

// file greps one open regular file, shown as path.
func (g *grepper) file(fd int, path string) error {
	g.long = g.long[:0]
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if hasHole(fd, st.Size) {
		g.resp.BinarySkipped++
		return nil
	}
	r := &sizeReader{fd: fd, left: st.Size}
	if g.br == nil {
		g.br = bufio.NewReaderSize(r, 64<<10)
	} else {
		g.br.Reset(r)
	}
	head, _ := g.br.Peek(binarySniff)
	if bytes.IndexByte(head, 0) >= 0 {
		g.resp.BinarySkipped++
		return nil
	}
	g.resp.FilesScanned++
	lineNo := 0
	for {
		chunk, err := g.br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			if len(g.long) < maxScanLine {
				g.long = append(g.long, chunk[:min(len(chunk), maxScanLine-len(g.long))]...)
			}
			continue
		}
		line := chunk
		if len(g.long) > 0 {
			if len(g.long) < maxScanLine {
				g.long = append(g.long, chunk[:min(len(chunk), maxScanLine-len(g.long))]...)
			}
			line = g.long
		}
		if len(line) > 0 || err == nil {
			lineNo++
			line = bytes.TrimSuffix(line, []byte("\n"))
			line = bytes.TrimSuffix(line, []byte("\r"))
			if g.re.Match(line) {
				if len(g.resp.Matches) >= g.limit || g.budget < 0 {
					g.resp.Truncated = true
					g.long = g.long[:0]
					return errStop
				}
				text := cut(line, MaxLine)
				g.budget -= len(path) + len(text) + 48
				g.resp.Matches = append(g.resp.Matches, Match{Path: path, LineNo: lineNo, Line: text})
			}
		}
		g.long = g.long[:0]
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// cut keeps at most n bytes of b, not splitting a UTF-8 sequence.
func cut(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	i := n
	for i > 0 && !utf8.RuneStart(b[i]) {
		i--
	}
	return string(b[:i])
}
