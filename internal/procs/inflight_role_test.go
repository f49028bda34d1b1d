package procs_test

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/procs"
	"thermite/internal/testrig"
	"thermite/internal/threadcred"
)

// passDeleted is a program of the role: it writes argv[2] bytes to the
// file argv[1], unlinks it and sends its descriptor with SCM_RIGHTS over
// a unix socket pair to itself. argv[3] says what then: "keep" closes its
// own copy and leaves it unreceived in the pair's queue; "receive" takes
// it at once and keeps the received copy, then goes on passing it back
// and forth (a program passing a handle); "cycle" sends the receiving
// socket along into its own queue and closes every descriptor, so that no
// process holds the file nor the socket (only the kernel's unix garbage
// collector can free them). It prints a line once the file is written and
// another once it is done, after a line on stdin.
const passDeleted = `
import array, os, socket, sys, time
path, size, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
os.unlink(path)
os.write(fd, b"x" * size)
os.fsync(fd)
print("written", flush=True)
sys.stdin.readline()
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
def send(fds):
    a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
def receive():
    msg, anc, flags, addr = b.recvmsg(1, socket.CMSG_SPACE(4))
    return array.array("i", anc[0][2])[0]
if how == "keep":
    send([fd])
    os.close(fd)
elif how == "receive":
    send([fd])
    os.close(fd)
    fd = receive()
elif how == "cycle":
    send([fd, b.fileno()])
    os.close(fd)
    a.close()
    b.close()
print("done", b.fileno() if how != "cycle" else -1, flush=True)
while how == "receive":
    send([fd])
    os.close(fd)
    fd = receive()
    time.sleep(0.001)
time.sleep(60)
`

// inFlightLane runs passDeleted as uid with a file of size bytes in dir;
// it returns the process once the program is done.
func inFlightLane(t *testing.T, uid int, dir string, size int, how string, written func()) *exec.Cmd {
	t.Helper()
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("needs /usr/bin/python3 to pass descriptors as the role")
	}
	cmd := exec.Command("/usr/bin/python3", "-c", passDeleted, filepath.Join(dir, how), strconv.Itoa(size), how)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	out := bufio.NewReader(pipe)
	for _, want := range []string{"written", "done"} {
		line, err := out.ReadString('\n')
		if !strings.HasPrefix(line, want) {
			t.Fatalf("the %s lane said %q (%v), want %q", how, line, err, want)
		}
		if want == "written" {
			written()
			io.WriteString(in, "go\n")
		}
	}
	return cmd
}

// roleDir is a folder of uid's own under a fresh root-owned one.
func roleDir(t *testing.T, uid int) string {
	dir := t.TempDir()
	os.Chmod(filepath.Dir(dir), 0o755)
	os.Chmod(dir, 0o755)
	own := filepath.Join(dir, "own")
	os.Mkdir(own, 0o700)
	os.Chown(own, uid, uid)
	return own
}

// measureAs is the broker's measure of uid's unlinked files, on a thread
// that is the role's.
func measureAs(uid int) (procs.Held, time.Duration, error) {
	var h procs.Held
	t0 := time.Now()
	err := threadcred.As(uid, uid, func() error {
		var err error
		h, err = procs.HeldUnlinked("/proc", uid, nil)
		return err
	})
	return h, time.Since(t0), err
}

// A lane that writes a file, unlinks it, sends its descriptor over a
// socket pair to itself and closes its own copy keeps the file's blocks
// in the socket's queue, where no descriptor table shows them. The
// measure asks again as it does a refused table, then counts it as hidden
// (ErrHidden), naming the process and the socket.
func TestLaneKeepsADeletedFileOnlyInFlightIsHidden(t *testing.T) {
	testrig.RequireRoot(t)
	uid := testrig.FreeUIDs(t)
	p := inFlightLane(t, uid, roleDir(t, uid), 1<<20, "keep", func() {})
	h, took, err := measureAs(uid)
	want := "process " + strconv.Itoa(p.Process.Pid) + " (python3): its socket:["
	if !errors.Is(err, procs.ErrHidden) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "keeps descriptors in flight, unreceived: 1 (fdinfo scm_fds)") {
		t.Fatalf("measure: %+v %v, want %v: %s...] ... keeps descriptors in flight, unreceived: 1", h, err, procs.ErrHidden, want)
	}
	t.Logf("after %v: %v", took.Round(time.Millisecond), err)
	if took < 5*time.Second {
		t.Errorf("counted hidden after %v, before the 5 s a refused table is asked again", took)
	}
}

// A lane that passes a descriptor and receives it at once, then goes on
// passing it back and forth, is not refused: its deleted file counts by
// the received descriptor, once.
func TestLanePassesADescriptorAndReceivesItCountedNormally(t *testing.T) {
	testrig.RequireRoot(t)
	uid := testrig.FreeUIDs(t)
	inFlightLane(t, uid, roleDir(t, uid), 1<<20, "receive", func() {})
	for range 5 {
		h, _, err := measureAs(uid)
		if err != nil || h.Files != 1 || h.Bytes < 1<<20 || h.Bytes > 1<<20+64<<10 {
			t.Fatalf("measure: %+v %v, want the one deleted file's 1 MiB and no refusal", h, err)
		}
	}
}

// A file no one can reach: a lane sends a deleted file's descriptor and
// the receiving socket itself into that socket's queue, then closes
// every descriptor. No process holds either; the cycle is the kernel's
// unix garbage collector's, which the close of the last socket starts.
// The space comes back within a bound (statfs of a tmpfs of the role's),
// and the measure finds nothing held and nothing hidden.
func TestLaneKeepsAFileNoOneCanReachIsFreed(t *testing.T) {
	testrig.RequireRoot(t)
	uid := testrig.FreeUIDs(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=128m,mode=0700,uid="+strconv.Itoa(uid)+",gid="+strconv.Itoa(uid)); err != nil {
		t.Skipf("needs a tmpfs of the role's to see its space: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	os.Chmod(filepath.Dir(dir), 0o755)
	used := func() int64 {
		var fs unix.Statfs_t
		if err := unix.Statfs(dir, &fs); err != nil {
			t.Fatal(err)
		}
		return int64(fs.Blocks-fs.Bfree) * fs.Bsize
	}
	const size = 64 << 20
	inFlightLane(t, uid, dir, size, "cycle", func() {
		if u := used(); u < size {
			t.Fatalf("the lane's file takes %d bytes of the tmpfs, want its %d", u, size)
		}
	})
	// The kernel's unix garbage collector runs from a work queue: a bound
	// for it to have run at all, not for its speed (it took 2 s and more
	// on a loaded machine).
	closed := time.Now()
	deadline := closed.Add(30 * time.Second)
	for used() >= size/2 {
		if time.Now().After(deadline) {
			t.Fatalf("30 s after the cycle was closed the tmpfs still has %d bytes used: the unreachable file was not freed", used())
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("the unreachable file's %d MiB came back %v after the lane said it closed the cycle", size>>20, time.Since(closed).Round(time.Millisecond))
	h, _, err := measureAs(uid)
	if err != nil || h.Files != 0 {
		t.Fatalf("measure after the cycle was freed: %+v %v, want nothing held and nothing hidden", h, err)
	}
}

// holdSockets is a program of the role holding argv[1] unix socket pairs.
const holdSockets = `
import socket, sys, time
pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for i in range(int(sys.argv[1]))]
print(flush=True)
time.sleep(600)
`

// BenchmarkHeldUnlinkedSocketsAsRole is one role's measure as the broker
// makes it, one process of the role holding N unix socket pairs (2N
// descriptors): each socket costs, beside its stat, one read of its
// fdinfo for scm_fds.
//
//	go test ./internal/procs -run '^$' -bench HeldUnlinkedSocketsAsRole
func BenchmarkHeldUnlinkedSocketsAsRole(b *testing.B) {
	testrig.RequireRoot(b)
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		b.Skip("needs /usr/bin/python3 to hold sockets as the role")
	}
	for _, n := range []int{0, 500} {
		b.Run(strconv.Itoa(2*n), func(b *testing.B) {
			uid := testrig.FreeUIDs(b)
			startAs(b, uid, "/usr/bin/python3", "-c", holdSockets, strconv.Itoa(n))
			for b.Loop() {
				if _, _, err := measureAs(uid); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
