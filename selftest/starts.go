package selftest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/procs"
	"thermite/internal/rpc"
	"thermite/roles"
)

// The start window (internal/spawn): from its uid switch until execve a
// role's new command already runs as the role's user, while the broker's
// thread that starts it waits in the kernel (CLONE_VFORK), with the Go
// runtime's own pauses and every later start waiting on that thread. A
// lane that stops its own user's processes in a loop catches some of its
// starts there, where no Landlock signal scope keeps it out (ABI 5 and
// lower); the broker must get such a start going again itself, or the lane
// holds every start for as long as it likes. The Starts rows prove it
// through the broker's own start path. Every role's filter now refuses
// stop signals at their root (seccomp's denyStopSignals, proved by the
// row "stop a process of its own user ..."), so the stops here reach
// something only where that rule is gone; the row still proves the start
// path behind it.

// OpStopOwn sends SIGSTOP, SIGTSTP, SIGTTIN and SIGTTOU in turn to every
// process it may signal (kill(-1)), from two threads: it makes
// Path/.selftest-stopping once both have begun, and goes on for the first
// duration of Arg ("1s,4s"), or until Path/.selftest-enough appears if
// its filter refused every call so far. Then it writes
// Path/.selftest-stopped and leaves what it stopped stopped until
// Path/.selftest-go-on appears or the second duration has passed, and
// sends SIGCONT to every process it may signal. Detail counts the calls
// and those the kernel ran. (kill(-1) answers 0 where every process
// refused it, so no call the kernel ran says whether a stop landed.)
const OpStopOwn = "stop-own"

const (
	// stopperFor is how long at most the lane's probe stops its own
	// processes: the self-test tells it sooner that it has seen enough
	// starts meanwhile (startsWhileStopping), unless a start is held.
	stopperFor = time.Second
	// stopperHold is how long at most it leaves what it stopped stopped
	// after: a start the broker left stopped holds the broker (and, for a
	// Go runtime waiting on the thread, the self-test itself) that long.
	stopperHold = 4 * time.Second
	// startsBound is how long another role's command may take to start
	// and end meanwhile: generous for a command that ends at once (a
	// loaded qemu without KVM took 2.2 s), and a second short of
	// stopperHold, which a held start takes at least.
	startsBound = 3 * time.Second
	// startsWhileStopping of the lane's starts, and runsWhileStopping of
	// the other role's commands, begun and ended while the probe stopped
	// its own processes, are enough where its filter refused every one of
	// its stops (EPERM before the kernel ran the call, so no stop was ever
	// sent): then they only show that starts go on. A probe whose kill(-1)
	// the kernel ran stops for the whole of stopperFor whatever it is
	// told, for kill(-1) answers 0 even where every process refused it,
	// and nothing then says its stops reached no start.
	startsWhileStopping = 8
	runsWhileStopping   = 2

	stoppingMark = ".selftest-stopping"
	enoughMark   = ".selftest-enough"
	stoppedMark  = ".selftest-stopped"
	goOnMark     = ".selftest-go-on"
)

// startsMarks are the hand-over's marks in the lane's temp folder.
var startsMarks = []string{stoppingMark, enoughMark, stoppedMark, goOnMark}

// stopOwnProcesses is the attack on the start window: kill(-1) with each
// stop signal in a loop stops every process of its user it may signal, a
// new command caught between its uid switch and execve included (kill(-1)
// leaves out the caller itself). It lets them go at the end, so a broker
// they held comes back to say so.
func stopOwnProcesses(a Attempt) Outcome {
	loop, hold, err := stopperTimes(a.Arg)
	if err != nil || a.Path == "" {
		return Outcome{ID: a.ID, Got: "error: " + strconv.Quote(a.Arg) + " " + strconv.Quote(a.Path)}
	}
	end := time.Now().Add(loop)
	var enough atomic.Bool
	over := make(chan struct{})
	go func() {
		if awaitFile(filepath.Join(a.Path, enoughMark), loop, over) {
			enough.Store(true)
		}
	}()
	var sent, ran atomic.Int64
	var wg, begun sync.WaitGroup
	for range 2 {
		wg.Add(1)
		begun.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			first := true
			for !(enough.Load() && ran.Load() == 0) && time.Now().Before(end) {
				for _, sig := range []unix.Signal{unix.SIGSTOP, unix.SIGTSTP, unix.SIGTTIN, unix.SIGTTOU} {
					sent.Add(1)
					if unix.Kill(-1, sig) != unix.EPERM {
						ran.Add(1)
					}
				}
				if first {
					begun.Done()
					first = false
				}
			}
			if first {
				begun.Done()
			}
		}()
	}
	begun.Wait()
	markErr := os.WriteFile(filepath.Join(a.Path, stoppingMark), nil, 0o600)
	wg.Wait()
	close(over)
	defer unix.Kill(-1, unix.SIGCONT)
	if markErr != nil {
		return result(a.ID, markErr)
	}
	if err := os.WriteFile(filepath.Join(a.Path, stoppedMark), nil, 0o600); err != nil {
		return result(a.ID, err)
	}
	awaitFile(filepath.Join(a.Path, goOnMark), hold, nil)
	return Outcome{ID: a.ID, Got: "ok", Detail: fmt.Sprintf("%d kill(-1) calls, %d of them run by the kernel", sent.Load(), ran.Load())}
}

// stopperTimes reads "LOOP,HOLD".
func stopperTimes(arg string) (loop, hold time.Duration, err error) {
	l, h, _ := strings.Cut(arg, ",")
	if loop, err = time.ParseDuration(l); err != nil {
		return 0, 0, err
	}
	if hold, err = time.ParseDuration(h); err != nil {
		return 0, 0, err
	}
	if loop <= 0 || hold < 0 || loop+hold > time.Minute {
		return 0, 0, fmt.Errorf("%q: out of range", arg)
	}
	return loop, hold, nil
}

// stopperAttempt is the Starts row's attempt for a lane.
func stopperAttempt(c *Context, r roles.Role) []Attempt {
	return []Attempt{{Op: OpStopOwn, Path: tmpOf(c, r.Name), Arg: stopperFor.String() + "," + stopperHold.String()}}
}

// startsSeen is what the self-test saw of the starts it made while the
// lane's probe ran.
type startsSeen struct {
	lane, other string
	// laneStarts counts the lane's starts, laneFailed those that failed
	// (the lane's own business), laneStopped those found stopped once
	// started; otherRuns the other role's commands.
	laneStarts, laneFailed, laneStopped, otherRuns int
	// otherBad is the first of the other role's commands that failed or
	// took longer than startsBound; held says what still waited when
	// every bound had run out; after is how the lane's next command, once
	// its probe was done, went wrong. Each is "" when all was well.
	otherBad, held, after string
}

// startsPhase runs the Starts rows as the first lane: its probe stops its
// own processes while the self-test starts, through the broker's start
// path, the lane's commands one after another (each ended as soon as it
// has exec'd) and another role's commands, each run to its end; once the
// probe is done, one more of the lane's commands.
func startsPhase(h Host, c *Context, record func([]rpc.Probe)) {
	lane, ok := c.Table.Lane(1)
	if !ok {
		return
	}
	other, ok := c.Table.Role(otherRole(c, lane))
	if !ok {
		return
	}
	c.Starting = true
	defer func() { c.Starting, c.Starts = false, nil }()
	record(probeRows(c, lane, lane.Name, Policy, func(plan []Attempt) ([]Outcome, string) {
		return startsUnderStopper(h, c, lane, other, plan)
	}, nil))
}

// startsUnderStopper runs the lane's probe with plan and the starts
// beside it, records what it saw in c.Starts, and returns the probe's
// outcomes. Once startsWhileStopping of the lane's starts and
// runsWhileStopping of the other's commands have ended while the probe
// stopped, the probe is told that is enough (it heeds that only where its
// filter refused every stop). The starts go on until the probe has
// stopped stopping and one more of each has ended; then the probe is told
// to let its processes go. Every hand-over waits on its mark's event. Where a start is still held when every bound has run out,
// it ends the lane's processes from here (a start of a helper would wait
// behind the held one), so that the self-test goes on and says so.
func startsUnderStopper(h Host, c *Context, lane, other roles.Role, plan []Attempt) ([]Outcome, string) {
	r := &startsRun{
		h: h, c: c, lane: lane, other: other,
		s:         &startsSeen{lane: lane.Name, other: other.Name},
		tmp:       tmpOf(c, lane.Name),
		probeDone: make(chan struct{}), stopping: make(chan struct{}), stopped: make(chan struct{}), allDone: make(chan struct{}),
		wait: stopperFor + stopperHold + startsBound,
	}
	c.Starts = r.s
	data, _ := json.Marshal(plan)
	r.clearMarks()
	defer r.clearMarks()
	go r.runLaneProbe(data)
	go r.watchStopMarks()
	r.wg.Add(2)
	go r.startLaneCommands()
	go r.runOtherCommands()
	go r.letProbeGo()
	if !r.awaitEnd() {
		return held1(plan, r.s.held), ""
	}
	if r.s.held == "" {
		r.s.after = commandBad(h.RunProbe(lane, nil, []byte("[]")))
	}
	h.StopUser(lane)
	h.StopUser(other)
	if r.why != "" && r.s.held != "" {
		// The probe itself was ended to let the broker go on: the row
		// says what was held, not that its probe could not run.
		return held1(plan, r.s.held), ""
	}
	return r.outs, r.why
}

// startsRun is what startsUnderStopper's goroutines share: the lane's
// probe, the lane's starts and the other role's commands beside it.
type startsRun struct {
	h           Host
	c           *Context
	lane, other roles.Role
	s           *startsSeen
	tmp         string // the lane's tmp, where the marks are

	mu                  sync.Mutex // guards what follows, and s
	outs                []Outcome
	why                 string
	laneDone, otherDone bool
	// laneDuring and otherDuring count the starts and commands begun
	// and ended while the probe stopped its own processes.
	laneDuring, otherDuring int
	enough                  sync.Once

	wg                                    sync.WaitGroup // the lane's starts and the other's commands
	probeDone, stopping, stopped, allDone chan struct{}
	wait                                  time.Duration
}

// clearMarks removes the marks of the lane's probe.
func (r *startsRun) clearMarks() {
	for _, m := range startsMarks {
		removePlaced(r.c.Cfg.StateDir, filepath.Join(r.tmp, m))
	}
}

// closed says whether ch is closed.
func closed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// over says whether a loop may end: a start or command begun once the
// probe had stopped stopping (or was done) has ended.
func (r *startsRun) over(begun bool) bool { return begun || closed(r.probeDone) }

// during says whether a start or command began while the probe stopped
// its own processes.
func (r *startsRun) during() bool { return closed(r.stopping) && !closed(r.stopped) }

// seen counts one start or command that began while the probe stopped its
// own processes, and tells the probe it is enough once both counts are
// reached (with r.mu held).
func (r *startsRun) seen(count *int) {
	*count++
	if r.laneDuring >= startsWhileStopping && r.otherDuring >= runsWhileStopping {
		r.enough.Do(func() { placeFile(r.c.Cfg.StateDir, filepath.Join(r.tmp, enoughMark), 0, 0, 0o644) })
	}
}

// runLaneProbe runs the lane's probe with the plan in data.
func (r *startsRun) runLaneProbe(data []byte) {
	o, w := probeOutcomes(r.h.RunProbe(r.lane, nil, data))
	r.mu.Lock()
	r.outs, r.why = o, w
	r.mu.Unlock()
	close(r.probeDone)
}

// watchStopMarks closes stopping and then stopped as the probe's marks
// for them appear.
func (r *startsRun) watchStopMarks() {
	for _, m := range []struct {
		name string
		ch   chan struct{}
	}{{stoppingMark, r.stopping}, {stoppedMark, r.stopped}} {
		if !awaitFile(filepath.Join(r.tmp, m.name), r.wait, r.probeDone) {
			return
		}
		close(m.ch)
	}
}

// startLaneCommands starts the lane's commands one after another, each
// ended at once, until one begun after the probe stopped stopping ended.
func (r *startsRun) startLaneCommands() {
	defer r.wg.Done()
	s := r.s
	for {
		after, began := closed(r.stopped), r.during()
		pid, stop, err := r.h.StartCanary(r.lane, nil)
		// A command of the lane found stopped once started shows the
		// lane's stops reach its new commands (where no signal scope
		// keeps them out).
		stoppedNow := err == nil && processStopped(pid)
		r.mu.Lock()
		s.laneStarts++
		if err != nil {
			s.laneFailed++
		}
		if stoppedNow {
			s.laneStopped++
		}
		if began && r.during() {
			r.seen(&r.laneDuring)
		}
		r.mu.Unlock()
		if err == nil {
			stop()
		}
		if r.over(after) {
			break
		}
	}
	r.mu.Lock()
	r.laneDone = true
	r.mu.Unlock()
}

// runOtherCommands runs the other role's commands one after another, each
// within startsBound, until one begun after the probe stopped stopping
// ended.
func (r *startsRun) runOtherCommands() {
	defer r.wg.Done()
	s, lane, other := r.s, r.lane, r.other
	for n := 1; ; n++ {
		after, began := closed(r.stopped), r.during()
		t0 := time.Now()
		bad := commandBad(r.h.RunProbe(other, nil, []byte("[]")))
		if took := time.Since(t0); bad == "" && took > startsBound {
			bad = fmt.Sprintf("took %s, more than %s", took.Round(time.Millisecond), startsBound)
		}
		r.mu.Lock()
		s.otherRuns = n
		if bad != "" && s.otherBad == "" {
			s.otherBad = fmt.Sprintf("%s's command %d while %s stopped its own processes: %s", other.Name, n, lane.Name, bad)
		}
		if began && r.during() {
			r.seen(&r.otherDuring)
		}
		r.mu.Unlock()
		if r.over(after) {
			break
		}
	}
	r.mu.Lock()
	r.otherDone = true
	r.mu.Unlock()
}

// letProbeGo tells the probe to let its processes go once the starts and
// commands are done, and closes allDone once the probe is.
func (r *startsRun) letProbeGo() {
	r.wg.Wait()
	// The starts went on after the stops: the probe may let go.
	placeFile(r.c.Cfg.StateDir, filepath.Join(r.tmp, goOnMark), 0, 0, 0o644)
	<-r.probeDone
	close(r.allDone)
}

// awaitEnd waits for everything to end. Where a start is still held when
// every bound has run out, it says what in s.held and ends the lane's
// processes; it returns false where they stayed held after that.
func (r *startsRun) awaitEnd() bool {
	s, lane, other := r.s, r.lane, r.other
	select {
	case <-r.allDone:
		return true
	case <-time.After(r.wait):
	}
	r.mu.Lock()
	var held []string
	if !r.otherDone {
		held = append(held, fmt.Sprintf("%s's command %d had not ended", other.Name, s.otherRuns+1))
	}
	if !r.laneDone {
		held = append(held, fmt.Sprintf("%s's start %d had not returned", lane.Name, s.laneStarts+1))
	}
	if !closed(r.probeDone) {
		held = append(held, fmt.Sprintf("%s's probe had not ended", lane.Name))
	}
	s.held = fmt.Sprintf("the broker's starts were held: %s after %s began stopping its own processes, %s", r.wait, lane.Name, strings.Join(held, ", "))
	r.mu.Unlock()
	endProcessesOf(lane.UID)
	select {
	case <-r.allDone:
		return true
	case <-time.After(startsBound):
		r.mu.Lock()
		s.held += "; they stayed held after its processes were ended"
		r.mu.Unlock()
		return false
	}
}

// held1 answers every attempt of plan with what was held.
func held1(plan []Attempt, held string) []Outcome {
	out := make([]Outcome, len(plan))
	for i, a := range plan {
		out[i] = Outcome{ID: a.ID, Got: held}
	}
	return out
}

// commandBad says how a command the self-test ran to see that starts go
// on went wrong: `__probe` with an empty plan answers "[]" and exits 0.
func commandBad(stdout, stderr []byte, res *rpc.RunResult, err error) string {
	switch {
	case err != nil:
		return err.Error()
	case res == nil:
		return "no result"
	case res.ExitCode != 0 || strings.TrimSpace(string(stdout)) != "[]":
		return fmt.Sprintf("exit %d (%s), %q %q", res.ExitCode, res.Stopped, strings.TrimSpace(string(stdout)), strings.TrimSpace(string(stderr)))
	}
	return ""
}

// startsWentOn judges the starts made while the lane's probe stopped its
// own processes: every command of the other role started and ended within
// the bound, and the lane's next command ran.
func startsWentOn(c *Context, r roles.Role, o Outcome) string {
	s := c.Starts
	if s == nil {
		return "the self-test made no starts beside the probe"
	}
	bad := ""
	switch {
	case s.held != "":
		bad = s.held
	case s.otherBad != "":
		bad = s.otherBad
	case s.otherRuns == 0:
		bad = fmt.Sprintf("no command of %s ran while %s stopped its own processes", s.other, r.Name)
	case s.after != "":
		bad = fmt.Sprintf("%s's next command, after it stopped its own processes: %s", r.Name, s.after)
	default:
		return ""
	}
	// How far the stops reached: a held start is one of these.
	return fmt.Sprintf("%s (%d of its %d starts were found stopped once started)", bad, s.laneStopped, s.laneStarts)
}

// endProcessesOf ends every process of uid by SIGKILL through a pidfd,
// from this process: a start held in its window ends with its child, and
// nothing here waits on a start. The owner is read again once the pidfd
// pins the process, in case its pid was reused before.
func endProcessesOf(uid int) {
	for range 20 {
		pids, err := procs.ByUID("/proc", uid)
		if err != nil || len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			fd, err := unix.PidfdOpen(pid, 0)
			if err != nil {
				continue
			}
			if realUIDOf(pid) == uid {
				unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
			}
			unix.Close(fd)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// processStopped says whether the process pid is stopped now (state T).
func processStopped(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command's name, which ends with the last ')'.
	i := strings.LastIndexByte(string(data), ')')
	return i >= 0 && i+2 < len(data) && data[i+2] == 'T'
}

// realUIDOf is a process's real uid, -1 when it cannot be read.
func realUIDOf(pid int) int {
	st, err := procs.Status(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	f := strings.Fields(st["Uid"])
	if len(f) == 0 {
		return -1
	}
	uid, err := strconv.Atoi(f[0])
	if err != nil {
		return -1
	}
	return uid
}
