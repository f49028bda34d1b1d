//go:build linux && (amd64 || arm64)

package seccomp

import (
	"path/filepath"
	"runtime"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sysvKind is one kind of SysV IPC object, made and removed with raw calls.
type sysvKind struct {
	name     string
	get, ctl uintptr
	getArgs  func(flags uintptr) []uintptr
	ctlArgs  func(id int, cmd uintptr, buf unsafe.Pointer) []uintptr
}

var sysvKinds = []sysvKind{
	{"shm", unix.SYS_SHMGET, unix.SYS_SHMCTL,
		func(f uintptr) []uintptr { return []uintptr{unix.IPC_PRIVATE, 4096, f} },
		func(id int, cmd uintptr, buf unsafe.Pointer) []uintptr {
			return []uintptr{uintptr(id), cmd, uintptr(buf)}
		}},
	{"msg", unix.SYS_MSGGET, unix.SYS_MSGCTL,
		func(f uintptr) []uintptr { return []uintptr{unix.IPC_PRIVATE, f} },
		func(id int, cmd uintptr, buf unsafe.Pointer) []uintptr {
			return []uintptr{uintptr(id), cmd, uintptr(buf)}
		}},
	{"sem", unix.SYS_SEMGET, unix.SYS_SEMCTL,
		func(f uintptr) []uintptr { return []uintptr{unix.IPC_PRIVATE, 1, f} },
		func(id int, cmd uintptr, buf unsafe.Pointer) []uintptr {
			return []uintptr{uintptr(id), 0, cmd, uintptr(buf)}
		}},
}

// make creates a private object with mode, returning its id.
func (k sysvKind) make(mode uintptr) (int, unix.Errno) {
	a := k.getArgs(unix.IPC_CREAT | unix.IPC_EXCL | mode)
	var args [6]uintptr
	copy(args[:], a)
	id, _, errno := unix.Syscall6(k.get, args[0], args[1], args[2], args[3], args[4], args[5])
	return int(id), errno
}

// control runs cmd on id with a buffer large enough for any *id_ds.
func (k sysvKind) control(id int, cmd uintptr, buf []byte) unix.Errno {
	var args [6]uintptr
	copy(args[:], k.ctlArgs(id, cmd, unsafe.Pointer(&buf[0])))
	_, _, errno := unix.Syscall6(k.ctl, args[0], args[1], args[2], args[3], args[4], args[5])
	runtime.KeepAlive(buf)
	return errno
}

// sysvMake makes an object others may use, and removes it when made.
func sysvMake(k sysvKind, mode uintptr) scenario {
	return func(string) string {
		id, errno := k.make(mode)
		if errno == 0 {
			k.control(id, unix.IPC_RMID, make([]byte, 256))
		}
		return errnoName(errno)
	}
}

// sysvOpenUp makes a private object (which must work), then tries IPC_SET
// with what IPC_STAT read, as a role opening its object up would; the
// object is removed either way.
func sysvOpenUp(k sysvKind, extra uintptr) scenario {
	return func(string) string {
		id, errno := k.make(0o600)
		if errno != 0 {
			return "make a 0600 object: " + errnoName(errno)
		}
		buf := make([]byte, 256)
		defer k.control(id, unix.IPC_RMID, buf)
		if errno := k.control(id, unix.IPC_STAT, buf); errno != 0 {
			return "IPC_STAT: " + errnoName(errno)
		}
		return errnoName(k.control(id, unix.IPC_SET|extra, buf))
	}
}

func sysvAttacks() []attack {
	var list []attack
	for _, k := range sysvKinds {
		list = append(list,
			attack{k.name + "get-0666", sysvMake(k, 0o666), "EPERM"},
			attack{k.name + "get-0640", sysvMake(k, 0o640), "EPERM"},
			attack{k.name + "get-0602", sysvMake(k, 0o602), "EPERM"},
			attack{k.name + "get-0600", sysvMake(k, 0o600), "ok"},
			attack{k.name + "ctl-ipc-set", sysvOpenUp(k, 0), "EPERM"},
		)
	}
	// With IPC_64 or'ed in, x86_64 and arm64 answer EINVAL themselves
	// (they take the command as it is); the filter refuses it first.
	list = append(list, attack{"shmctl-ipc-set-ipc64", sysvOpenUp(sysvKinds[0], 0x100), "EPERM"})
	return list
}

// openat2Create makes dir/new through openat2 with mode, and says the
// mode it got, or the errno.
func openat2Create(mode uint64) scenario {
	return func(dir string) string {
		how := unix.OpenHow{Flags: unix.O_CREAT | unix.O_WRONLY | unix.O_CLOEXEC, Mode: mode}
		p := filepath.Join(dir, "new")
		fd, err := unix.Openat2(unix.AT_FDCWD, p, &how)
		if err != nil {
			return errnoName(err.(unix.Errno))
		}
		unix.Close(fd)
		return "ok"
	}
}

func openat2Attacks() []attack {
	return []attack{
		{"openat2-creat-6755", openat2Create(0o6755), "ENOSYS"},
		{"openat2-creat-0755", openat2Create(0o755), "ENOSYS"},
	}
}

// The lane's file helper keeps openat2, resolve flags and all; the rest of
// its filter is every role's.
func TestOpenat2KeptForTheFileHelper(t *testing.T) {
	requireRoot(t)
	o := Options{Network: NetworkNone, FileHelper: true}
	for name, want := range map[string]string{
		"openat2": "ok", "openat2-creat-0755": "ok", "openat-creat-4755": "EPERM", "shmget-0666": "EPERM",
	} {
		if got := runChild(t, name, modeFiltered, o, scratchDir(t)); got.result != want {
			t.Errorf("%s in the file helper's filter: %s, want %s\n%s", name, got.result, want, got.output)
		}
	}
}
