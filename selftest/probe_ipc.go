package selftest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"thermite/internal/sysvipc"
)

// The probe's operations for issue 12's SysV IPC and set-id rows.
const (
	OpSysVShared   = "sysv-shared"   // make a new SysV object (Arg: shm, msg or sem) of mode 0666; removed again if made
	OpSysVOpenUp   = "sysv-open-up"  // make a 0600 object (Arg: kind), then IPC_SET it to 0666; removed either way
	OpSysVFind     = "sysv-find"     // look up the object Arg ("kind:key") for reading and writing, without creating it
	OpOpenat2SetID = "openat2-setid" // create Path through openat2 with mode 06755; removed again if made
	OpLinkSetID    = "link-setid"    // hard-link the file Path to Path+".link"
	// For tests and operators (`__probe try`):
	OpSysVMake    = "sysv-make"        // make an object (Arg "kind:key") of mode 0600 and leave it
	OpOpenat2Then = "openat2-fallback" // create Path with mode Arg (octal) through openat2, falling back to openat on ENOSYS as libraries do
	OpPOSIXMQ     = "mq-open"          // mq_open(Arg, O_CREAT) a POSIX message queue, unlinked again if made
)

// makeSharedSysVObject makes a new SysV object of kind Arg with mode
// 0666, which any user could then reach; removed again if made.
func makeSharedSysVObject(a Attempt) Outcome {
	id, err := sysvipc.Get(a.Arg, unix.IPC_PRIVATE, unix.IPC_CREAT|unix.IPC_EXCL|0o666)
	if err == nil {
		sysvipc.Remove(sysvipc.Object{Kind: a.Arg, ID: id})
	}
	return result(a.ID, err)
}

// openUpSysVObject makes a 0600 object of kind Arg, then IPC_SETs it to
// 0666; removed either way.
func openUpSysVObject(a Attempt) Outcome {
	id, err := sysvipc.Get(a.Arg, unix.IPC_PRIVATE, unix.IPC_CREAT|unix.IPC_EXCL|0o600)
	if err != nil {
		return Outcome{ID: a.ID, Got: "error: a 0600 " + a.Arg + " object: " + errName(err)}
	}
	defer sysvipc.Remove(sysvipc.Object{Kind: a.Arg, ID: id})
	buf := make([]byte, 512)
	if err := sysvipc.Control(a.Arg, id, unix.IPC_STAT, buf); err != nil {
		return Outcome{ID: a.ID, Got: "error: IPC_STAT: " + errName(err)}
	}
	// The mode is the sixth 32-bit word of struct ipc64_perm.
	binary.NativeEndian.PutUint32(buf[20:24], 0o666)
	return result(a.ID, sysvipc.Control(a.Arg, id, unix.IPC_SET, buf))
}

// findSysVObject looks up the object Arg ("kind:key") of another user
// for reading and writing, without creating it.
func findSysVObject(a Attempt) Outcome {
	kind, keyText, _ := strings.Cut(a.Arg, ":")
	key, err := strconv.ParseInt(keyText, 10, 32)
	if err != nil {
		return Outcome{ID: a.ID, Got: "error: key " + strconv.Quote(keyText)}
	}
	// Asking for read and write: with flags 0 the kernel checks no
	// permission at all and hands out the id of anyone's object.
	_, err = sysvipc.Get(kind, int32(key), 0o600)
	return result(a.ID, err)
}

// makeSysVObject makes an object (Arg "kind:key") of mode 0600 and
// leaves it, for another role's attempt to find.
func makeSysVObject(a Attempt) Outcome {
	kind, keyText, _ := strings.Cut(a.Arg, ":")
	key, err := strconv.ParseInt(keyText, 10, 32)
	if err != nil {
		return Outcome{ID: a.ID, Got: "error: key " + strconv.Quote(keyText)}
	}
	_, err = sysvipc.Get(kind, int32(key), unix.IPC_CREAT|unix.IPC_EXCL|0o600)
	return result(a.ID, err)
}

// createThroughOpenat2Fallback creates Path with mode Arg (octal)
// through openat2, falling back to openat on ENOSYS as libraries do.
func createThroughOpenat2Fallback(a Attempt) Outcome {
	mode, err := strconv.ParseUint(a.Arg, 8, 32)
	if err != nil {
		return Outcome{ID: a.ID, Got: "error: mode " + strconv.Quote(a.Arg)}
	}
	flags := unix.O_CREAT | unix.O_EXCL | unix.O_WRONLY | unix.O_CLOEXEC
	how := unix.OpenHow{Flags: uint64(flags), Mode: mode}
	via := "openat2"
	fd, err := unix.Openat2(unix.AT_FDCWD, a.Path, &how)
	if errors.Is(err, unix.ENOSYS) {
		via = "openat"
		fd, err = unix.Open(a.Path, flags, uint32(mode))
	}
	if err != nil {
		return Outcome{ID: a.ID, Got: errName(err), Detail: "via " + via}
	}
	var st unix.Stat_t
	unix.Fstat(fd, &st)
	unix.Close(fd)
	unix.Unlink(a.Path)
	return Outcome{ID: a.ID, Got: "ok", Detail: fmt.Sprintf("via %s mode %04o", via, st.Mode&0o7777)}
}

// openPOSIXQueue opens (creating) the POSIX message queue Arg, and
// unlinks it again: also after a refused open, which (Landlock's EACCES)
// may come after the queue was made.
func openPOSIXQueue(a Attempt) Outcome {
	// The kernel takes the name without its leading slash, as glibc's
	// mq_open passes it (with one, the lookup itself answers EACCES).
	name, err := unix.BytePtrFromString(strings.TrimPrefix(a.Arg, "/"))
	if err != nil {
		return result(a.ID, err)
	}
	fd, _, errno := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(name)), unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o600, 0, 0, 0)
	defer unix.Syscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(name)), 0, 0)
	if errno != 0 {
		return result(a.ID, errno)
	}
	unix.Close(int(fd))
	return result(a.ID, nil)
}

// createSetIDThroughOpenat2 creates Path through openat2 with mode 06755
// and reports the mode made; removed again if made.
func createSetIDThroughOpenat2(a Attempt) Outcome {
	how := unix.OpenHow{Flags: unix.O_CREAT | unix.O_EXCL | unix.O_WRONLY | unix.O_CLOEXEC, Mode: 0o6755}
	fd, err := unix.Openat2(unix.AT_FDCWD, a.Path, &how)
	if err != nil {
		return result(a.ID, err)
	}
	var st unix.Stat_t
	unix.Fstat(fd, &st)
	unix.Close(fd)
	unix.Unlink(a.Path)
	return Outcome{ID: a.ID, Got: "ok", Detail: fmt.Sprintf("made mode %04o", st.Mode&0o7777)}
}

// linkSetIDFile hard-links the file Path to Path+".link" (an existing
// link is no error).
func linkSetIDFile(a Attempt) Outcome {
	err := unix.Link(a.Path, a.Path+".link")
	if errors.Is(err, unix.EEXIST) {
		err = nil
	}
	return result(a.ID, err)
}
