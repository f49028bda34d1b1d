package procs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// errInFlight says that a unix socket keeps descriptors sent to it and
// not yet received: what they keep open (a deleted file's blocks) is in no
// process's table, and the measure cannot see it.
var errInFlight = errors.New("keeps descriptors in flight")

// errInFlightUnseen says that the kernel does not show a socket's
// descriptors in flight (fdinfo's scm_fds line, Linux 5.9 and later).
var errInFlightUnseen = errors.New("holds a socket whose descriptors in flight this kernel does not show (fdinfo scm_fds, Linux 5.9 and later)")

// inFlight reads the fdinfo of the socket descriptor fd of the task at tb
// and decides whether what it keeps in flight hides files from the
// measure: a unix socket's scm_fds counts the descriptors queued to it
// (for a listening one, in its connections not yet accepted). A socket
// with none, one closed meanwhile, or one that is no unix socket (no
// scm_fds line on a kernel that shows it) hides nothing. On a kernel that
// shows no scm_fds at all, any socket could hide files, and the measure
// fails closed (errInFlightUnseen, naming the socket): such kernels are
// older than any the rig is tried on (6.1 and later), and a loss named
// for the operator to accept would still let a lane keep any space.
func (s *heldScan) inFlight(tb, fd string) error {
	b, err := readSmall(tb+"/fdinfo/"+fd, s.fdinfo[:])
	if err != nil {
		return nil // closed since, or a thread that ended
	}
	n, shown := scmFDs(b)
	switch {
	case !shown && showsInFlight():
		return nil // not a unix socket
	case !shown:
		link, _ := os.Readlink(tb + "/fd/" + fd)
		return fmt.Errorf("%w: descriptor %s (%s)", errInFlightUnseen, fd, link)
	case n == 0:
		return nil
	}
	link, _ := os.Readlink(tb + "/fd/" + fd)
	return fmt.Errorf("its %s (descriptor %s) %w, unreceived: %d (fdinfo scm_fds), whose files no descriptor table shows", link, fd, errInFlight, n)
}

// readSmall reads a small /proc file into buf in one read (a socket's
// fdinfo is under 100 bytes): open, read, close, where os.ReadFile also
// stats it and reads again to see its end. One that fills buf is read
// whole, so that no line past it goes unread.
func readSmall(path string, buf []byte) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	n, err := unix.Read(fd, buf)
	switch {
	case err != nil:
		return nil, err
	case n == len(buf):
		return os.ReadFile(path)
	}
	return buf[:n], nil
}

// scmFDs reads the scm_fds line of an fdinfo: the descriptors in flight
// to a unix socket; shown is false where there is no such line.
func scmFDs(fdinfo []byte) (n int, shown bool) {
	for line := range bytes.Lines(fdinfo) {
		v, ok := bytes.CutPrefix(line, []byte("scm_fds:"))
		if !ok {
			continue
		}
		n, err := strconv.Atoi(string(bytes.TrimSpace(v)))
		if err != nil {
			return 0, false
		}
		return n, true
	}
	return 0, false
}

// showsInFlight reports whether this kernel shows a unix socket's
// descriptors in flight in its fdinfo: asked once, of a socket pair of this
// process's own.
var showsInFlight = sync.OnceValue(func() bool {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fds[0]))
	if err != nil {
		return false
	}
	_, shown := scmFDs(b)
	return shown
})
