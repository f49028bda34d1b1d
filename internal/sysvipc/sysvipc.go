// Package sysvipc lists SysV IPC objects (shared memory segments, message
// queues, semaphore sets) and removes those of one user, as systemd's
// RemoveIPC= does when a user's last session ends. The stop helper calls it
// as the stopped role's user, once nothing of that user runs: the broker
// has no CAP_IPC_OWNER, and the owner or creator of an object may always
// remove it.
package sysvipc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The kinds of object, named as /proc/sysvipc names their files.
const (
	Shm = "shm"
	Msg = "msg"
	Sem = "sem"
)

// Kinds are every kind, in the order they are removed.
var Kinds = []string{Shm, Msg, Sem}

// shmDest is SHM_DEST in a segment's mode: removed, but still attached by
// some process, which keeps it listed until it detaches. It can no longer
// be found by its key.
const shmDest = 0o1000

// Object is one SysV IPC object as /proc/sysvipc lists it.
type Object struct {
	Kind string
	Key  int32
	ID   int
	Mode uint32 // the perms column: permission bits and, for shm, SHM_DEST and SHM_LOCKED
	UID  int    // the owner, which IPC_SET can change
	CUID int    // the creator, which nothing changes
}

func (o Object) String() string {
	return fmt.Sprintf("%s id %d key %#x mode %o uid %d cuid %d", o.Kind, o.ID, uint32(o.Key), o.Mode, o.UID, o.CUID)
}

// List reads every object of the calling process's IPC namespace from
// procRoot's sysvipc files ("/proc" outside tests).
func List(procRoot string) ([]Object, error) {
	var out []Object
	for _, k := range Kinds {
		p := filepath.Join(procRoot, "sysvipc", k)
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("sysvipc: %w", err)
		}
		objs, err := Parse(k, data)
		if err != nil {
			return nil, fmt.Errorf("sysvipc: %s: %w", p, err)
		}
		out = append(out, objs...)
	}
	return out, nil
}

// idColumn is the name of each kind's id column in its header.
var idColumn = map[string]string{Shm: "shmid", Msg: "msqid", Sem: "semid"}

// Parse reads one /proc/sysvipc file. It finds its columns by the header's
// names, which differ between kinds and kernel versions.
func Parse(kind string, data []byte) ([]Object, error) {
	lines := bytes.Split(data, []byte("\n"))
	if len(lines) == 0 {
		return nil, fmt.Errorf("no header")
	}
	col := map[string]int{}
	for i, name := range strings.Fields(string(lines[0])) {
		col[name] = i
	}
	for _, name := range []string{"key", idColumn[kind], "perms", "uid", "cuid"} {
		if _, ok := col[name]; !ok {
			return nil, fmt.Errorf("no column %q in the header %q", name, lines[0])
		}
	}
	var out []Object
	for _, l := range lines[1:] {
		f := strings.Fields(string(l))
		if len(f) == 0 {
			continue
		}
		if len(f) < len(col) {
			return nil, fmt.Errorf("short line %q", l)
		}
		key, err1 := strconv.ParseInt(f[col["key"]], 10, 32)
		id, err2 := strconv.Atoi(f[col[idColumn[kind]]])
		mode, err3 := strconv.ParseUint(f[col["perms"]], 8, 32)
		uid, err4 := strconv.Atoi(f[col["uid"]])
		cuid, err5 := strconv.Atoi(f[col["cuid"]])
		if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
			return nil, fmt.Errorf("line %q: %w", l, err)
		}
		out = append(out, Object{Kind: kind, Key: int32(key), ID: id, Mode: uint32(mode), UID: uid, CUID: cuid})
	}
	return out, nil
}

// belongsTo says whether removing uid's objects must remove o: it is
// uid's by owner or by creator (an object handed to another uid with
// IPC_SET still goes with its creator), and, for shared memory, not
// already removed and waiting for a last detach.
func belongsTo(o Object, uid int) bool {
	if o.UID != uid && o.CUID != uid {
		return false
	}
	return !(o.Kind == Shm && o.Mode&shmDest != 0)
}

// Get is shmget, msgget or semget: the id of the object with key (or a
// new one, with IPC_CREAT in flags; a segment of one page, a set of one
// semaphore).
func Get(kind string, key int32, flags int) (int, error) {
	var r uintptr
	var errno unix.Errno
	switch kind {
	case Shm:
		r, _, errno = unix.Syscall(unix.SYS_SHMGET, uintptr(key), 4096, uintptr(flags))
	case Msg:
		r, _, errno = unix.Syscall(unix.SYS_MSGGET, uintptr(key), uintptr(flags), 0)
	case Sem:
		r, _, errno = unix.Syscall(unix.SYS_SEMGET, uintptr(key), 1, uintptr(flags))
	default:
		return -1, fmt.Errorf("sysvipc: unknown kind %q", kind)
	}
	if errno != 0 {
		return -1, errno
	}
	return int(r), nil
}

// Control is shmctl, msgctl or semctl(id, 0, cmd) with buf as the
// *id_ds (nil for none). Every *id_ds starts with struct ipc64_perm:
// key, uid, gid, cuid, cgid, mode (4 bytes each).
func Control(kind string, id, cmd int, buf []byte) error {
	var p uintptr
	if len(buf) > 0 {
		p = uintptr(unsafe.Pointer(&buf[0]))
	}
	var errno unix.Errno
	switch kind {
	case Shm:
		_, _, errno = unix.Syscall(unix.SYS_SHMCTL, uintptr(id), uintptr(cmd), p)
	case Msg:
		_, _, errno = unix.Syscall(unix.SYS_MSGCTL, uintptr(id), uintptr(cmd), p)
	case Sem:
		_, _, errno = unix.Syscall6(unix.SYS_SEMCTL, uintptr(id), 0, uintptr(cmd), p, 0, 0)
	default:
		return fmt.Errorf("sysvipc: unknown kind %q", kind)
	}
	runtime.KeepAlive(buf)
	if errno != 0 {
		return errno
	}
	return nil
}

// Remove removes one object by id (IPC_RMID). An object already gone is
// not an error.
func Remove(o Object) error {
	err := Control(o.Kind, o.ID, unix.IPC_RMID, nil)
	switch {
	case err == nil, errors.Is(err, unix.EINVAL), errors.Is(err, unix.EIDRM):
		// EINVAL: the id no longer names an object (removed meanwhile).
		return nil
	}
	return fmt.Errorf("sysvipc: removing %s: %w", o, err)
}

// RemoveUserObjects removes every SysV IPC object whose owner or creator is
// uid, and lists again until none is left, so that an object made while it
// worked goes too; it gives up after limit, naming what is left. It returns
// how many it removed. The caller must be uid itself (or hold
// CAP_SYS_ADMIN) and should make sure nothing of uid runs any more.
func RemoveUserObjects(procRoot string, uid int, limit time.Duration) (int, error) {
	deadline := time.Now().Add(limit)
	removed := 0
	for {
		objs, err := List(procRoot)
		if err != nil {
			return removed, err
		}
		var left []Object
		for _, o := range objs {
			if belongsTo(o, uid) {
				left = append(left, o)
			}
		}
		if len(left) == 0 {
			return removed, nil
		}
		if time.Now().After(deadline) {
			names := make([]string, len(left))
			for i, o := range left {
				names[i] = o.String()
			}
			return removed, fmt.Errorf("sysvipc: %d objects of uid %d still exist after %s: %s", len(left), uid, limit, strings.Join(names, "; "))
		}
		var errs []error
		for _, o := range left {
			if err := Remove(o); err != nil {
				errs = append(errs, err)
				continue
			}
			removed++
		}
		if len(errs) > 0 {
			return removed, errors.Join(errs...)
		}
	}
}
