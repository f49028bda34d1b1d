package lanefs

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// openFile opens a regular file for reading through openBeneath
// (O_NONBLOCK, so that a FIFO cannot hang the helper) and checks its type.
func (r *root) openFile(path string) (int, *unix.Stat_t, *Error) {
	if path == "" {
		return -1, nil, errorf(CodeBadRequest, "empty path")
	}
	fd, err := openBeneath(r.fd, path, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, nil, r.fail(path, err)
	}
	st, e := regular(fd, path)
	if e != nil {
		unix.Close(fd)
		return -1, nil, e
	}
	return fd, st, nil
}

// regular fstats fd and refuses anything but a regular file.
func regular(fd int, path string) (*unix.Stat_t, *Error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, errorf(CodeIO, "%s: %v", show(path), err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return &st, nil
	case unix.S_IFDIR:
		return nil, errorf(CodeBadRequest, "%s: is a folder", show(path))
	}
	return nil, errorf(CodeBadRequest, "%s: not a regular file", show(path))
}

// preadFull reads len(buf) bytes from off, or up to the end of the file.
func preadFull(fd int, buf []byte, off int64) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := unix.Pread(fd, buf[n:], off+int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		if m == 0 {
			break
		}
		n += m
	}
	return n, nil
}

func (s *Server) read(req *ReadRequest) (*ReadResponse, *Error) {
	r, e := s.root(req.Root)
	if e != nil {
		return nil, e
	}
	if req.Offset < 0 || req.Limit < 0 {
		return nil, errorf(CodeBadRequest, "%s: offset and limit must not be negative", show(req.Path))
	}
	fd, st, e := r.openFile(req.Path)
	if e != nil {
		return nil, e
	}
	defer unix.Close(fd)
	limit := req.Limit
	if limit == 0 || limit > MaxRead {
		limit = MaxRead
	}
	want := max(min(limit, st.Size-req.Offset), 0)
	buf := make([]byte, want)
	n, err := preadFull(fd, buf, req.Offset)
	if err != nil {
		return nil, r.fail(req.Path, err)
	}
	size := st.Size
	if end := req.Offset + int64(n); end > size {
		size = end // grew while we read
	}
	return &ReadResponse{Data: buf[:n], Size: size, Truncated: req.Offset+int64(n) < size}, nil
}

// checkMode refuses anything but permission bits.
func checkMode(path string, mode uint32) *Error {
	if mode&^0o777 != 0 {
		return errorf(CodeBadRequest, "%s: mode %#o: only permission bits (0 to 0777) may be set", show(path), mode)
	}
	return nil
}

func (s *Server) write(req *WriteRequest) (*WriteResponse, *Error) {
	r, e := s.root(req.Root)
	if e != nil {
		return nil, e
	}
	if e := checkMode(req.Path, req.Mode); e != nil {
		return nil, e
	}
	if req.CreateParents {
		if dir, _ := split(req.Path); dir != "." {
			if _, e := r.mkdirAll(dir, 0o755, req.Path); e != nil {
				return nil, e
			}
		}
	}
	pfd, base, e := r.parent(req.Path)
	if e != nil {
		return nil, e
	}
	defer unix.Close(pfd)
	mode := req.Mode
	if mode == 0 {
		mode = 0o644
		var st unix.Stat_t
		if unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
			mode = st.Mode & 0o777
		}
	}
	if err := replaceFile(pfd, base, req.Data, mode); err != nil {
		return nil, r.fail(req.Path, err)
	}
	return &WriteResponse{Size: int64(len(req.Data))}, nil
}

// replaceFile puts data at the name base in the folder pfd: into a new
// temporary file made there (O_CREAT|O_EXCL|O_NOFOLLOW, so never through
// anything already there), then renamed over base. rename replaces the
// name itself: a symlink at base is replaced, never followed, and a hard
// link's other names keep the old content.
func replaceFile(pfd int, base string, data []byte, mode uint32) error {
	var (
		fd  int
		tmp string
		err error
	)
	for tries := 0; ; tries++ {
		tmp = tempName()
		fd, err = openBeneath(pfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW, 0o600)
		if err == unix.EEXIST && tries < 8 {
			continue
		}
		if err != nil {
			return err
		}
		break
	}
	err = writeAll(fd, data)
	if err == nil {
		err = unix.Fchmod(fd, mode)
	}
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(pfd, tmp, pfd, base)
	}
	if err != nil {
		unix.Unlinkat(pfd, tmp, 0)
	}
	return err
}

// tempName is a fresh hidden name for a file on its way in.
func tempName() string {
	var b [8]byte
	rand.Read(b[:])
	return ".lanefs-" + hex.EncodeToString(b[:]) + ".tmp"
}

func writeAll(fd int, data []byte) error {
	for len(data) > 0 {
		n, err := unix.Write(fd, data)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

func (s *Server) edit(req *EditRequest) (*EditResponse, *Error) {
	r, e := s.root(req.Root)
	if e != nil {
		return nil, e
	}
	if req.Old == "" {
		return nil, errorf(CodeBadRequest, "%s: old string is empty", show(req.Path))
	}
	pfd, base, e := r.parent(req.Path)
	if e != nil {
		return nil, e
	}
	defer unix.Close(pfd)
	fd, err := openBeneath(pfd, base, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW, 0)
	if err == unix.ELOOP {
		return nil, errorf(CodeBadRequest, "%s: is a symlink: edit the file it points to", show(req.Path))
	}
	if err != nil {
		return nil, r.fail(req.Path, err)
	}
	st, e := regular(fd, req.Path)
	if e != nil {
		unix.Close(fd)
		return nil, e
	}
	if st.Size > MaxEdit {
		unix.Close(fd)
		return nil, errorf(CodeTooLarge, "%s: %d bytes is over the %d-byte limit for edit", show(req.Path), st.Size, MaxEdit)
	}
	buf := make([]byte, st.Size+1)
	n, err := preadFull(fd, buf, 0)
	unix.Close(fd)
	if err != nil {
		return nil, r.fail(req.Path, err)
	}
	if n > MaxEdit {
		return nil, errorf(CodeTooLarge, "%s: over the %d-byte limit for edit", show(req.Path), MaxEdit)
	}
	content := buf[:n]
	old := []byte(req.Old)
	switch c := bytes.Count(content, old); c {
	case 0:
		return nil, errorf(CodeBadRequest, "%s: old string not found", show(req.Path))
	case 1:
	default:
		return nil, errorf(CodeBadRequest, "%s: old string occurs %d times (it must occur exactly once)", show(req.Path), c)
	}
	i := bytes.Index(content, old)
	out := make([]byte, 0, len(content)-len(old)+len(req.New))
	out = append(append(append(out, content[:i]...), req.New...), content[i+len(old):]...)
	if err := replaceFile(pfd, base, out, st.Mode&0o777); err != nil {
		return nil, r.fail(req.Path, err)
	}
	return &EditResponse{Size: int64(len(out))}, nil
}

// entry describes st under name.
func entry(name string, st *unix.Stat_t) Entry {
	e := Entry{
		Name:  name,
		Size:  st.Size,
		Mode:  st.Mode & 0o7777,
		MTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec).UTC(),
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		e.Type = TypeFile
	case unix.S_IFDIR:
		e.Type = TypeDir
	case unix.S_IFLNK:
		e.Type = TypeSymlink
	default:
		e.Type = TypeOther
	}
	return e
}

// entryAt lstats name in the folder dirfd; a symlink's text is read, not
// followed.
func entryAt(dirfd int, name string) (Entry, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return Entry{}, err
	}
	e := entry(name, &st)
	if e.Type == TypeSymlink {
		buf := make([]byte, 4096)
		if n, err := unix.Readlinkat(dirfd, name, buf); err == nil {
			e.Target = string(buf[:n])
		}
	}
	return e, nil
}

func (s *Server) list(req *ListRequest) (*ListResponse, *Error) {
	r, e := s.root(req.Root)
	if e != nil {
		return nil, e
	}
	fd, path, e := r.openDir(req.Path)
	if e != nil {
		return nil, e
	}
	defer unix.Close(fd)
	names, err := readNames(fd)
	if err != nil {
		return nil, r.fail(path, err)
	}
	sort.Strings(names)
	resp := &ListResponse{Entries: []Entry{}}
	budget := answerBudget
	for _, name := range names {
		if len(resp.Entries) >= MaxList || budget < 0 {
			resp.Truncated = true
			break
		}
		ent, err := entryAt(fd, name)
		if err != nil {
			if err == unix.ENOENT {
				continue // gone while we listed
			}
			return nil, r.fail(joinShow(path, name), err)
		}
		budget -= len(name) + len(ent.Target) + 128
		resp.Entries = append(resp.Entries, ent)
	}
	return resp, nil
}

func (s *Server) stat(req *StatRequest) (*StatResponse, *Error) {
	r, e := s.root(req.Root)
	if e != nil {
		return nil, e
	}
	path := req.Path
	if path == "" {
		path = "."
	}
	dir, base := split(path)
	if base == "" || base == "." || base == ".." {
		// The path names a folder through a dot (or is the root):
		// resolve it whole and describe what it reaches.
		fd, err := openBeneath(r.fd, path, unix.O_PATH, 0)
		if err != nil {
			return nil, r.fail(path, err)
		}
		defer unix.Close(fd)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return nil, r.fail(path, err)
		}
		name := base
		if name == "" {
			name = "."
		}
		return &StatResponse{entry(name, &st)}, nil
	}
	pfd, err := openBeneath(r.fd, dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, r.fail(path, err)
	}
	defer unix.Close(pfd)
	ent, err := entryAt(pfd, base)
	if err != nil {
		return nil, r.fail(path, err)
	}
	return &StatResponse{ent}, nil
}

func (s *Server) delete(req *DeleteRequest) (*DeleteResponse, *Error) {
	r, e := s.root(req.Root)
	if e != nil {
		return nil, e
	}
	pfd, base, e := r.parent(req.Path)
	if e != nil {
		return nil, e
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, r.fail(req.Path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		// A file, or a symlink itself: unlinkat never follows.
		if err := unix.Unlinkat(pfd, base, 0); err != nil {
			return nil, r.fail(req.Path, err)
		}
		return &DeleteResponse{Removed: 1}, nil
	}
	if !req.Recursive {
		if err := unix.Unlinkat(pfd, base, unix.AT_REMOVEDIR); err != nil {
			return nil, r.fail(req.Path, err)
		}
		return &DeleteResponse{Removed: 1}, nil
	}
	n, err := removeTree(pfd, base, 0)
	if err != nil {
		return &DeleteResponse{Removed: n}, r.fail(req.Path, err)
	}
	return &DeleteResponse{Removed: n}, nil
}

func (s *Server) mkdir(req *MkdirRequest) (*MkdirResponse, *Error) {
	r, e := s.root(req.Root)
	if e != nil {
		return nil, e
	}
	if e := checkMode(req.Path, req.Mode); e != nil {
		return nil, e
	}
	mode := req.Mode
	if mode == 0 {
		mode = 0o755
	}
	if req.Parents {
		created, e := r.mkdirAll(req.Path, mode, req.Path)
		if e != nil {
			return nil, e
		}
		return &MkdirResponse{Created: created}, nil
	}
	pfd, base, e := r.parent(req.Path)
	if e != nil {
		return nil, e
	}
	defer unix.Close(pfd)
	if err := mkdirAt(pfd, base, mode); err != nil {
		return nil, r.fail(req.Path, err)
	}
	return &MkdirResponse{Created: true}, nil
}

// mkdirAt makes the folder name in pfd with exactly mode (no umask): it
// is made private, opened without following anything, then fchmod'ed.
func mkdirAt(pfd int, name string, mode uint32) error {
	if err := unix.Mkdirat(pfd, name, 0o700); err != nil {
		return err
	}
	if mode == 0o700 {
		return nil
	}
	fd, err := openBeneath(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fchmod(fd, mode)
}

// mkdirAll makes path and every missing folder on its way. Each prefix
// of the path is resolved from the root with openBeneath, so ".." and
// symlinks inside are allowed and anything that leads out is refused;
// a missing folder is made with mkdirat in the descriptor of the prefix
// before it. name is what errors call the path.
func (r *root) mkdirAll(path string, mode uint32, name string) (bool, *Error) {
	if path == "" {
		return false, errorf(CodeBadRequest, "empty path")
	}
	prev, err := openBeneath(r.fd, ".", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return false, r.fail(name, err)
	}
	defer func() { unix.Close(prev) }()
	created := false
	start := 0
	// An absolute path, or one whose dots alone climb out, is refused
	// before anything is made. (One that leaves through a symlink is
	// refused by the kernel when its prefix is opened.)
	if c := filepath.Clean(path); strings.HasPrefix(path, "/") || c == ".." || strings.HasPrefix(c, "../") {
		return false, r.fail(name, unix.EXDEV)
	}
	for start < len(path) {
		end := strings.IndexByte(path[start:], '/')
		if end < 0 {
			end = len(path)
		} else {
			end += start
		}
		comp := path[start:end]
		prefix := path[:end]
		start = end + 1
		if comp == "" || comp == "." {
			continue
		}
		fd, err := openBeneath(r.fd, prefix, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err == unix.ENOENT && comp != ".." {
			err = mkdirAt(prev, comp, mode)
			if err == nil {
				created = true
			}
			if err == nil || err == unix.EEXIST {
				fd, err = openBeneath(r.fd, prefix, unix.O_PATH|unix.O_DIRECTORY, 0)
			}
		}
		if err != nil {
			return false, r.fail(name, err)
		}
		unix.Close(prev)
		prev = fd
	}
	return created, nil
}

var errTooDeep = errors.New("folders nested too deep")
