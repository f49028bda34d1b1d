// Package threadcred runs a function with a role's file-system identity on
// one thread of the root process, where a helper process would cost an
// exec. It is the one place the broker changes one thread's credentials.
package threadcred

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// As runs fn on an OS thread of its own whose effective (and so
// file-system) uid and gid are uid and gid, with no supplementary groups,
// for that one call; every other thread keeps root's.
//
// The changes are raw system calls on the locked thread, where Go's own
// Setresuid changes every thread. Real and saved ids stay root's, so
// setting the effective uid back to 0 gives the thread back its
// capabilities, and no process of the role may signal it (kill checks the
// target's real and saved uid) nor renice, move or reschedule it (the
// thread keeps root's permitted capabilities, which the kernel wants the
// caller to hold: cap_safe_nice). The thread is never reused: fn may change
// what is per thread (the disk measure pins it off a timed run's CPUs),
// and nothing of a call should outlive it; so its goroutine ends locked
// to it and the runtime ends the thread (about 0.1 ms; the main thread it
// parks for good instead, running no goroutine again). The credentials are
// put back in reverse all the same, and an error says when they could not
// be.
// A caller that already is uid and gid runs fn where it is.
//
// The whole process is made not dumpable first: a thread whose
// credentials change makes the kernel do so anyway (commit_creds), and
// its /proc entries must stay root's, never the role's.
func As(uid, gid int, fn func() error) error {
	if unix.Geteuid() == uid && unix.Getegid() == gid {
		return fn() // already so: nothing to change
	}
	type answer struct{ err, fnErr error }
	ch := make(chan answer, 1)
	go func() {
		// Locked and never unlocked: the thread ends with this goroutine.
		runtime.LockOSThread()
		fnErr, err := as(uid, gid, fn)
		ch <- answer{err, fnErr}
	}()
	a := <-ch
	if a.err != nil {
		return a.err
	}
	return a.fnErr
}

// as changes the calling (locked) thread's credentials, runs fn, and puts
// them back. err is about the credentials; fnErr is fn's.
func as(uid, gid int, fn func() error) (fnErr, err error) {
	if _, _, e := unix.RawSyscall6(unix.SYS_PRCTL, unix.PR_SET_DUMPABLE, 0, 0, 0, 0, 0); e != 0 {
		return nil, fmt.Errorf("threadcred: prctl(PR_SET_DUMPABLE, 0): %w", e)
	}
	euid, egid := unix.Geteuid(), unix.Getegid()
	groups, err := unix.Getgroups()
	if err != nil {
		return nil, fmt.Errorf("threadcred: getgroups: %w", err)
	}
	// Order: groups and gid while the thread is still root (both need
	// CAP_SETGID), the uid last, which drops the effective capabilities.
	if e := setgroups(nil); e != 0 {
		return nil, fmt.Errorf("threadcred: setgroups([]) on the thread: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, ^uintptr(0), uintptr(gid), ^uintptr(0)); e != 0 {
		return nil, restore(fmt.Errorf("threadcred: setresgid(-1, %d, -1) on the thread: %w", gid, e), euid, egid, groups, false)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
		return nil, restore(fmt.Errorf("threadcred: setresuid(-1, %d, -1) on the thread: %w", uid, e), euid, egid, groups, false)
	}
	fnErr = fn()
	return fnErr, restore(nil, euid, egid, groups, true)
}

// restore puts back the uid (when it was changed), the gid and the groups,
// in that order: the uid first gives back the capabilities the others need.
func restore(cause error, euid, egid int, groups []int, uidChanged bool) error {
	if uidChanged {
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(euid), ^uintptr(0)); e != 0 {
			return fmt.Errorf("threadcred: setresuid back to %d on the thread: %w", euid, e)
		}
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, ^uintptr(0), uintptr(egid), ^uintptr(0)); e != 0 {
		return fmt.Errorf("threadcred: setresgid back to %d on the thread: %w", egid, e)
	}
	if e := setgroups(groups); e != 0 {
		return fmt.Errorf("threadcred: setgroups back on the thread: %w", e)
	}
	return cause
}

// setgroups is the raw system call, which changes the calling thread only.
func setgroups(groups []int) unix.Errno {
	gs := make([]uint32, len(groups))
	for i, g := range groups {
		gs[i] = uint32(g)
	}
	var p *uint32
	if len(gs) > 0 {
		p = &gs[0]
	}
	_, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(gs)), uintptr(unsafe.Pointer(p)), 0)
	runtime.KeepAlive(gs)
	return e
}
