package broker

import (
	"fmt"
	"os"
	"os/signal"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// exit is how a child ended, as wait4 told the reaper.
type exit struct {
	ws unix.WaitStatus
	ru unix.Rusage
	at time.Time
	// traced: it stopped under the broker's trace and the reaper killed it.
	traced bool
}

// reaper is the broker's only waiter. The broker is a child subreaper, so
// every orphan of a role command ends up its child: one loop reaps them
// all and hands each registered child's status to whoever started it. The
// broker never uses os/exec, whose Wait would race with this loop.
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan exit
	orphans int
	// tracedPIDs are children the broker found itself tracing.
	tracedPIDs map[int]bool
	onTrace    func(pid int)
}

// noteTraced records that a child stopped under the broker's trace.
func (r *reaper) noteTraced(pid int) {
	r.mu.Lock()
	r.tracedPIDs[pid] = true
	f := r.onTrace
	r.mu.Unlock()
	if f != nil {
		f(pid)
	}
}

func newReaper(onTrace func(pid int)) *reaper {
	r := &reaper{waiters: map[int]chan exit{}, tracedPIDs: map[int]bool{}, onTrace: onTrace}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, unix.SIGCHLD)
	go func() {
		tick := time.NewTicker(time.Second)
		for {
			select {
			case <-sig:
			case <-tick.C:
			}
			r.reapAll()
		}
	}()
	return r
}

// fork runs start, which forks a child, with the registry locked, so the
// loop cannot reap the child before it is registered.
func (r *reaper) fork(start func() (int, error)) (int, <-chan exit, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := start()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan exit, 1)
	r.waiters[pid] = ch
	return pid, ch, nil
}

func (r *reaper) reapAll() {
	for {
		var e exit
		pid, err := unix.Wait4(-1, &e.ws, unix.WNOHANG, &e.ru)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		// Without WUNTRACED the kernel reports a stop only for a child the
		// broker traces, which a role makes it by PTRACE_TRACEME (the filter
		// refuses that; this is the second lock). A stopped child has not
		// ended, and the broker never holds a tracee: it is killed now
		// (SIGKILL ends a traced, stopped task; the pid cannot be reused
		// before this loop reaps it) and its end says so.
		if e.ws.Stopped() || e.ws.Continued() {
			r.noteTraced(pid)
			unix.Kill(pid, unix.SIGKILL)
			continue
		}
		e.at = time.Now()
		r.mu.Lock()
		e.traced = r.tracedPIDs[pid]
		delete(r.tracedPIDs, pid)
		ch, ok := r.waiters[pid]
		delete(r.waiters, pid)
		if !ok {
			r.orphans++
		}
		r.mu.Unlock()
		if ok {
			ch <- e
		}
	}
}

// describe spells a wait status for logs and errors.
func describe(ws unix.WaitStatus) string {
	switch {
	case ws.Exited():
		return fmt.Sprintf("exit status %d", ws.ExitStatus())
	case ws.Signaled():
		return "killed by " + unix.SignalName(ws.Signal())
	}
	return fmt.Sprintf("wait status %#x", uint32(ws))
}
