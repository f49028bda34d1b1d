package selftest

import (
	"os"
	"os/signal"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// Issue 27's attempts: the kernel's channels between roles that no file
// mode closes. A unix socket reaches a listener another role made in a
// folder it opened to every role; a watch on a folder every role reads
// shows when another role opens a file there.
const (
	OpUnixSocket = "unix-socket" // make an AF_UNIX stream socket
	OpSocketPair = "socketpair"  // make an AF_UNIX socket pair and pass a byte over it
	OpMkfifo     = "mkfifo"      // make a FIFO in the folder Path, then remove it
	OpInotify    = "inotify"     // inotify_init1, then watch the folder Path
	OpFanotify   = "fanotify"    // fanotify_init with FAN_REPORT_FID (which an unprivileged user may ask for)
	OpDnotify    = "dnotify"     // open the folder Path and ask fcntl(F_NOTIFY) for its accesses
	OpOpenUp     = "open-up"     // chmod the folder Path 0755, and back if that worked
	OpKeyctl     = "keyctl"      // keyctl Arg: get-persistent (the user's persistent keyring) or join-session (a named session keyring)
)

// keyctlAttempt asks keyctl for a keyring that outlives the command or
// that another user may find: its user's persistent keyring
// (KEYCTL_GET_PERSISTENT), or a session keyring joined by name
// (KEYCTL_JOIN_SESSION_KEYRING), which finds any keyring of that name
// whose permissions let the caller search it, another role's included.
func keyctlAttempt(a Attempt) Outcome {
	var err error
	switch a.Arg {
	case "get-persistent":
		_, err = unix.KeyctlInt(unix.KEYCTL_GET_PERSISTENT, -1, unix.KEY_SPEC_PROCESS_KEYRING, 0, 0)
	case "join-session":
		_, err = unix.KeyctlJoinSessionKeyring("thermite-selftest")
	default:
		return Outcome{ID: a.ID, Got: "error: keyctl " + strconv.Quote(a.Arg)}
	}
	return result(a.ID, err)
}

// makeUnixSocket makes a unix socket, the first step to connecting to any
// listener by its path.
func makeUnixSocket(a Attempt) Outcome {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err == nil {
		unix.Close(fd)
	}
	return result(a.ID, err)
}

// makeSocketPair makes a socket pair and passes a byte over it: the
// unnamed sockets a program's own processes talk over.
func makeSocketPair(a Attempt) Outcome {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return result(a.ID, err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	if _, err := unix.Write(fds[0], []byte{'x'}); err != nil {
		return result(a.ID, err)
	}
	b := make([]byte, 1)
	if n, err := unix.Read(fds[1], b); err != nil || n != 1 || b[0] != 'x' {
		return Outcome{ID: a.ID, Got: "error: the pair did not pass its byte"}
	}
	return result(a.ID, nil)
}

// makeFIFO makes a FIFO in the folder Path, a name another role could
// open, and removes it.
func makeFIFO(a Attempt) Outcome {
	p := filepath.Join(a.Path, ".selftest-fifo")
	err := unix.Mkfifo(p, 0o600)
	if err == nil {
		os.Remove(p)
	}
	return result(a.ID, err)
}

// watchWithInotify watches the folder Path for opens and reads.
func watchWithInotify(a Attempt) Outcome {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		return result(a.ID, err)
	}
	defer unix.Close(fd)
	_, err = unix.InotifyAddWatch(fd, a.Path, unix.IN_OPEN|unix.IN_ACCESS)
	return result(a.ID, err)
}

// watchWithFanotify asks for a fanotify group of the kind an unprivileged
// user may have.
func watchWithFanotify(a Attempt) Outcome {
	fd, err := unix.FanotifyInit(unix.FAN_CLASS_NOTIF|unix.FAN_REPORT_FID|unix.FAN_CLOEXEC, unix.O_RDONLY)
	if err == nil {
		unix.Close(fd)
	}
	return result(a.ID, err)
}

// watchWithDnotify asks for a signal on every access in the folder Path.
func watchWithDnotify(a Attempt) Outcome {
	fd, err := unix.Open(a.Path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return Outcome{ID: a.ID, Got: "error: " + a.Path + ": " + err.Error()}
	}
	defer unix.Close(fd)
	const dnAccess = 0x1 // DN_ACCESS, linux/fcntl.h
	// Where the watch is allowed, an access before the close raises
	// SIGIO, which would end the probe.
	signal.Ignore(unix.SIGIO)
	_, err = unix.FcntlInt(uintptr(fd), unix.F_NOTIFY, dnAccess)
	return result(a.ID, err)
}

// openFolderToAll chmods the folder Path 0755, as a lane that wants other
// roles to reach a socket it listens on there would; where that works the
// mode is put back.
func openFolderToAll(a Attempt) Outcome {
	var st unix.Stat_t
	if err := unix.Stat(a.Path, &st); err != nil {
		return Outcome{ID: a.ID, Got: "error: " + a.Path + ": " + err.Error()}
	}
	err := unix.Chmod(a.Path, 0o755)
	if err == nil {
		unix.Chmod(a.Path, st.Mode&0o7777)
	}
	return result(a.ID, err)
}
