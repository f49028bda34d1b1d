package broker

import (
	"errors"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"thermite/internal/rpc"
)

// A command's end is awaited on the thread of the goroutine that runs it,
// in one epoll_wait over its pidfd, its caller's connection and the
// broker's stop, with the timeout as epoll's: the kernel wakes that thread
// at the child's exit, where the SIGCHLD path (the runtime's signal
// thread, the reaper's goroutine and a channel) took three hand-offs
// between threads. The thread is blocked for the command's life, as
// os/exec's Wait blocks one. (A child started with exit signal 0 would
// spare the SIGCHLD too, but the kernel sends one all the same once it
// has exec'd: measured on 6.18.)

// endEvent is what woke awaitEnd.
type endEvent int

const (
	endExited   endEvent = iota // the pidfd is readable: the child ended
	endTimeout                  // the timeout passed first
	endCaller                   // the caller sent a frame or went away
	endStopping                 // the broker began to stop
)

// awaitEnd waits for the first of the child's end, its caller (conn, or
// nil for none), the broker's stop and the timeout.
func (b *Broker) awaitEnd(ch *child, conn *rpc.Conn, timeout time.Duration) (endEvent, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return 0, err
	}
	defer unix.Close(ep)
	watch := func(fd int, events uint32, ev endEvent) error {
		return unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: events, Fd: int32(ev)})
	}
	if err := watch(ch.pidfd, unix.EPOLLIN, endExited); err != nil {
		return 0, err
	}
	if err := watch(b.life.stopFD, unix.EPOLLIN, endStopping); err != nil {
		return 0, err
	}
	if conn != nil {
		// The same socket sits in the runtime's poller too; a second epoll
		// only observes it and reads nothing.
		if fd := conn.FD(); fd >= 0 {
			if err := watch(fd, unix.EPOLLIN|unix.EPOLLRDHUP, endCaller); err != nil {
				return 0, err
			}
		}
	}
	deadline := time.Now().Add(timeout)
	var events [3]unix.EpollEvent
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return endTimeout, nil
		}
		// epoll_wait's timeout is a C int of milliseconds: a lifted
		// timeout (a century) is waited in hours.
		ms := int(min(left+time.Millisecond-1, time.Hour) / time.Millisecond)
		n, err := unix.EpollWait(ep, events[:], ms)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		// The child's end first: a command that ended as its caller left
		// ended by itself.
		best := endEvent(-1)
		for _, e := range events[:n] {
			if ev := endEvent(e.Fd); best < 0 || ev < best {
				best = ev
			}
		}
		if best >= 0 {
			return best, nil
		}
	}
}

// waitidInfo is the kernel's siginfo_t as waitid fills it for a child:
// signo, errno, code, then pid, uid and status.
type waitidInfo struct {
	signo, errno, code int32
	_                  int32
	pid                int32
	uid                uint32
	status             int32
	_                  [100]byte
}

// reapEnded reaps a command through its pidfd once it has ended (or
// waits for its end): waitid's status and resource use, as the reaper
// would have them. The reaper's wait4(-1) may take it first (it has the
// same SIGCHLD): the registry entry is dropped under the reaper's lock, so
// no fork can register the pid meanwhile, and where waitid finds nothing
// (ECHILD) the reaper's answer on exited is the end.
func (b *Broker) reapEnded(ch *child) exit {
	for {
		fds := []unix.PollFd{{Fd: int32(ch.pidfd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, -1); err == unix.EINTR {
			continue
		}
		break
	}
	var info waitidInfo
	var e exit
	r := b.reaper
	r.mu.Lock()
	_, _, errno := unix.Syscall6(unix.SYS_WAITID, unix.P_PIDFD, uintptr(ch.pidfd), uintptr(unsafe.Pointer(&info)), unix.WEXITED|unix.WNOHANG|unix.WALL, uintptr(unsafe.Pointer(&e.ru)), 0)
	if errno == 0 && info.pid != 0 {
		e.at = time.Now()
		delete(r.waiters, ch.pid)
		e.traced = r.tracedPIDs[ch.pid]
		delete(r.tracedPIDs, ch.pid)
		r.mu.Unlock()
		e.ws = waitStatusOf(info.code, info.status)
		return e
	}
	r.mu.Unlock()
	if errno != 0 && !errors.Is(errno, unix.ECHILD) {
		// Not expected for a child of ours with a pidfd; the reaper's
		// answer is still the one to wait for.
		b.log.Error("waitid on a command's pidfd", "pid", ch.pid, "err", errno)
	}
	return <-ch.exited
}

// siginfo's si_code for a child's end (include/uapi/asm-generic/siginfo.h).
const (
	cldExited = 1
	cldDumped = 3
)

// waitStatusOf encodes a waitid end as wait4's status word.
func waitStatusOf(code, status int32) unix.WaitStatus {
	switch code {
	case cldExited:
		return unix.WaitStatus(uint32(status&0xff) << 8)
	case cldDumped:
		return unix.WaitStatus(uint32(status&0x7f) | 0x80)
	default: // CLD_KILLED
		return unix.WaitStatus(uint32(status & 0x7f))
	}
}
