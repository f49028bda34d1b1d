package procs_test

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"thermite/internal/procs"
	"thermite/internal/testrig"
	"thermite/internal/threadcred"
)

// startAs starts argv as uid (and gid uid) and ends it with the test. It
// waits for its first line on stdout, so what it opens is open.
func startAs(t testing.TB, uid int, argv ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var b [1]byte
	if _, err := io.ReadFull(out, b[:]); err != nil {
		t.Fatalf("%v gave no sign of life: %v", argv, err)
	}
	return cmd
}

// The broker measures a role's unlinked files on a thread that is the
// role's for the call (threadcred.As): a process of the role keeping a
// deleted file open is measured; one that made itself not dumpable (here,
// by running a program it may execute but not read) keeps its table from
// the measure, and the measure says so (procs.ErrHidden, naming it) while
// still counting what it could see.
func TestNotDumpableProcessOfRoleCountsHidden(t *testing.T) {
	testrig.RequireRoot(t)
	uid := testrig.FreeUIDs(t)
	dir := t.TempDir()
	// t.TempDir's folders are root's alone; the role passes through them.
	os.Chmod(filepath.Dir(dir), 0o755)
	os.Chmod(dir, 0o755)
	own := filepath.Join(dir, "own")
	os.Mkdir(own, 0o700)
	os.Chown(own, uid, uid)

	// A process of the role holding 64 KiB in a file it deleted.
	startAs(t, uid, "/bin/sh", "-c", `exec 3>"$0/held"; head -c 65536 /dev/zero >&3; rm "$0/held"; echo; exec sleep 60`, own)
	measure := func() (procs.Held, error) {
		var h procs.Held
		err := threadcred.As(uid, uid, func() error {
			var err error
			h, err = procs.HeldUnlinked("/proc", uid, nil)
			return err
		})
		return h, err
	}
	h, err := measure()
	if err != nil || h.Files != 1 || h.Bytes < 65536 {
		t.Fatalf("measure as the role: %+v %v, want its one 64 KiB deleted file", h, err)
	}

	// A copy of sleep the role may execute but not read: the kernel makes
	// the process not dumpable at exec.
	hidden := filepath.Join(dir, "unreadable-sleep")
	data, err := os.ReadFile("/bin/sleep")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hidden, data, 0o711); err != nil {
		t.Fatal(err)
	}
	os.Chmod(hidden, 0o711)
	sh := startAs(t, uid, "/bin/sh", "-c", `echo; exec "$0" 60`, hidden)
	// Wait until the exec happened: its comm is the copy's name.
	for i := 0; ; i++ {
		comm, _ := os.ReadFile("/proc/" + strconv.Itoa(sh.Process.Pid) + "/comm")
		if strings.HasPrefix(string(comm), "unreadable") {
			break
		}
		if i > 500 {
			t.Fatalf("the unreadable sleep did not start: comm %q", comm)
		}
		syscallSleep()
	}
	h, err = measure()
	if !errors.Is(err, procs.ErrHidden) || !strings.Contains(err.Error(), "process "+strconv.Itoa(sh.Process.Pid)+" (unreadable-sle") {
		t.Fatalf("measure with a not dumpable process of the role: %v, want %v naming process %d", err, procs.ErrHidden, sh.Process.Pid)
	}
	if h.Files != 1 || h.Bytes < 65536 {
		t.Fatalf("measure with a not dumpable process of the role: %+v, want the other's 64 KiB still counted", h)
	}
}

func syscallSleep() { syscall.Nanosleep(&syscall.Timespec{Nsec: 10e6}, nil) }

// BenchmarkHeldUnlinkedAsRole is one role's measure of unlinked files as
// the broker makes it (a fresh thread that is the role's, one pass over
// /proc), against the passes over /proc alone: ByUID reads every
// process's status whoever it is, ByUIDOwned only those of root's and the
// user's entries (here most are root's: the gain is on a rig whose
// processes are the roles').
//
//	go test ./internal/procs -run '^$' -bench HeldUnlinkedAsRole
func BenchmarkHeldUnlinkedAsRole(b *testing.B) {
	testrig.RequireRoot(b)
	const nobody = 65534
	b.Run("threadcred+measure", func(b *testing.B) {
		for b.Loop() {
			threadcred.As(nobody, nobody, func() error {
				_, err := procs.HeldUnlinked("/proc", nobody, nil)
				return err
			})
		}
	})
	b.Run("ByUID", func(b *testing.B) {
		for b.Loop() {
			procs.ByUID("/proc", nobody)
		}
	})
	b.Run("ByUIDOwned", func(b *testing.B) {
		for b.Loop() {
			procs.ByUIDOwned("/proc", nobody)
		}
	})
	b.Run("threadcred", func(b *testing.B) {
		for b.Loop() {
			threadcred.As(nobody, nobody, func() error { return nil })
		}
	})
}
