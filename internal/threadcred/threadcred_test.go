package threadcred

import (
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const nobody = 65534

// While calls run as another user, no other goroutine ever runs on a thread
// whose credentials are changed: the calls block, sleep and yield inside
// fn (so the scheduler has every chance to put something else on their
// thread), and other goroutines keep asking the thread they are on.
func TestAsThreadServesNoOtherGoroutine(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it changes one thread's effective uid")
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var strange atomic.Value
	var calls atomic.Int64
	for range 4 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				err := As(nobody, nobody, func() error {
					_, e, _ := unix.Getresuid()
					_, eg, _ := unix.Getresgid()
					groups, _ := unix.Getgroups()
					if e != nobody || eg != nobody || len(groups) != 0 {
						strange.Store("inside As: euid " + strconv.Itoa(e) + " egid " + strconv.Itoa(eg) + " groups " + strconv.Itoa(len(groups)))
					}
					time.Sleep(100 * time.Microsecond)
					runtime.Gosched()
					return nil
				})
				if err != nil {
					strange.Store("As: " + err.Error())
				}
				calls.Add(1)
			}
		}()
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				// getresuid and getresgid ask the thread this goroutine runs on now.
				r, e, s := unix.Getresuid()
				gr, ge, gs := unix.Getresgid()
				if r|e|s|gr|ge|gs != 0 {
					strange.Store("another goroutine ran with uids " + strconv.Itoa(e) + " gids " + strconv.Itoa(ge))
				}
				runtime.Gosched()
			}
		}()
	}
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	if s := strange.Load(); s != nil {
		t.Fatal(s)
	}
	if calls.Load() == 0 {
		t.Fatal("no call of As finished in 2 s")
	}
}

// After a call the thread it ran on is gone (the role may have reniced or
// pinned it while it was the role's), and every thread of the process is
// root's, with its capabilities and groups, and no error came back.
func TestAsLeavesEveryThreadRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it changes one thread's effective uid")
	}
	groupsBefore, _ := unix.Getgroups()
	var tids []int
	for range 20 {
		if err := As(nobody, nobody, func() error {
			tids = append(tids, unix.Gettid())
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tid := range tids {
		waitEnded(t, tid)
	}
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, tk := range tasks {
		data, err := os.ReadFile("/proc/self/task/" + tk.Name() + "/status")
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(data), "\n") {
			f := strings.Fields(l)
			switch {
			case len(f) == 0:
			case (f[0] == "Uid:" || f[0] == "Gid:") && strings.Join(f[1:], " ") != "0 0 0 0":
				t.Fatalf("thread %s after As: %s", tk.Name(), l)
			case f[0] == "CapEff:" && f[1] == "0000000000000000":
				t.Fatalf("thread %s lost its capabilities after As: %s", tk.Name(), l)
			case f[0] == "Groups:" && len(f)-1 != len(groupsBefore):
				t.Fatalf("thread %s after As: %s, want %v", tk.Name(), l, groupsBefore)
			}
		}
	}
	// A new call still works: the process itself lost nothing.
	if err := As(nobody, nobody, func() error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// fn runs with the user's file-system identity: a root-only file is
// refused (EACCES) inside, and its error comes back as it is; the same
// read after the call, as root, works.
func TestAsReadsAsTheUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it changes one thread's effective uid")
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	secret := dir + "/secret"
	if err := os.WriteFile(secret, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := As(nobody, nobody, func() error {
		_, err := os.ReadFile(secret)
		return err
	})
	if !errors.Is(err, unix.EACCES) {
		t.Fatalf("As(nobody, read a 0600 root file) = %v, want EACCES", err)
	}
	if _, err := os.ReadFile(secret); err != nil {
		t.Fatalf("root after As: %v", err)
	}
}

// While a call runs, a process of the user tries to renice the calling
// thread, whose effective uid is the user's: refused (EPERM), as the
// thread keeps root's permitted capabilities; a thread's own nice value
// (or affinity) set inside fn does not outlive the call, as the thread is
// gone after it (or, the main thread, parked for good).
func TestUserRenicingTheCallingThreadRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it changes one thread's effective uid")
	}
	renice, err := exec.LookPath("renice")
	if err != nil {
		t.Skip("needs renice (util-linux) to act as the user")
	}
	tids := make(chan int)
	done := make(chan struct{})
	var out []byte
	var runErr error
	go func() {
		tid := <-tids
		cmd := exec.Command(renice, "-n", "19", "-p", strconv.Itoa(tid))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		out, runErr = cmd.CombinedOutput()
		close(done)
	}()
	var tid, niceAfterUser int
	if err := As(nobody, nobody, func() error {
		tid = unix.Gettid()
		tids <- tid
		<-done
		p, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
		niceAfterUser = 20 - p // the raw system call answers 20 - nice
		if err != nil {
			return err
		}
		// The call itself may lower its thread's priority.
		return unix.Setpriority(unix.PRIO_PROCESS, 0, 19)
	}); err != nil {
		t.Fatal(err)
	}
	if runErr == nil || !strings.Contains(string(out), "Operation not permitted") || niceAfterUser != 0 {
		t.Fatalf("renice of the calling thread by its user: %v %s; nice %d, want EPERM and 0", runErr, out, niceAfterUser)
	}
	waitEnded(t, tid)
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, tk := range tasks {
		stat, err := os.ReadFile("/proc/self/task/" + tk.Name() + "/stat")
		if err != nil {
			continue
		}
		// After the command's ")": state is field 3, nice field 19.
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
		if f[16] == "19" && tk.Name() != strconv.Itoa(os.Getpid()) {
			t.Fatalf("thread %s runs at nice 19 after the call", tk.Name())
		}
	}
}

// waitEnded waits for the thread a call ran on to end. The runtime ends a
// thread after its locked goroutine has exited, which is after As has its
// answer; the main thread it parks for good instead (exiting it would
// leave the process a zombie), where it runs no goroutine again.
func waitEnded(t *testing.T, tid int) {
	t.Helper()
	if tid == os.Getpid() {
		return
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat("/proc/self/task/" + strconv.Itoa(tid)); os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %d, which ran a call as uid %d, still serves the process", tid, nobody)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
