package spawn

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Stage is a step of a child's start between clone and execve. A child
// that fails one reports it with the errno and exits 127.
type Stage uint32

// The stages, in the order the raw child takes them.
const (
	stageNone Stage = iota
	StageSignalMask
	StageSetsid
	StageCgroup
	StageNetNS
	StageAffinity
	StageNoNewPrivs
	StageLandlock
	StageCwd
	StageDescriptors
	StageGroups
	StageGID
	StageUID
	StageDumpable
	StageCapabilities
	StageRlimit
	StageSeccomp
	StageExec
	// StageContinue is the child's own SIGCONT timer, made first.
	StageContinue
)

var stageNames = [...]string{
	stageNone:         "none",
	StageSignalMask:   "rt_sigprocmask",
	StageSetsid:       "setsid",
	StageCgroup:       "cgroup.procs",
	StageNetNS:        "setns",
	StageAffinity:     "sched_setaffinity",
	StageNoNewPrivs:   "no_new_privs",
	StageLandlock:     "landlock_restrict_self",
	StageCwd:          "fchdir",
	StageDescriptors:  "descriptors",
	StageGroups:       "setgroups",
	StageGID:          "setresgid",
	StageUID:          "setresuid",
	StageDumpable:     "prctl(PR_SET_DUMPABLE)",
	StageCapabilities: "capset",
	StageRlimit:       "prlimit64",
	StageSeccomp:      "seccomp",
	StageExec:         "execve",
	StageContinue:     "timer_create(SIGCONT)",
}

func (s Stage) String() string {
	if int(s) < len(stageNames) {
		return stageNames[s]
	}
	return fmt.Sprintf("stage %d", uint32(s))
}

// StageError is a child that could not reach its command: the stage it
// failed at and the kernel's errno. The child has exited 127.
type StageError struct {
	Stage Stage
	Errno unix.Errno
	// Detail names what the stage worked on (the program, the limit).
	Detail string
}

func (e *StageError) Error() string {
	name := unix.ErrnoName(e.Errno)
	if name == "" {
		name = fmt.Sprintf("errno %d", int(e.Errno))
	}
	switch {
	case e.Stage == StageExec && e.Errno == unix.ENOENT && e.Detail != "":
		return fmt.Sprintf("spawn: %s %s: not found (%s)", e.Stage, e.Detail, name)
	case e.Detail != "":
		return fmt.Sprintf("spawn: %s %s: %s", e.Stage, e.Detail, name)
	}
	return fmt.Sprintf("spawn: %s: %s", e.Stage, name)
}

// Unwrap lets errors.Is see the errno.
func (e *StageError) Unwrap() error { return e.Errno }

// Stamp is the clock's start a child reports just before execve: the
// CLOCK_MONOTONIC time, and the CPU time the child spent until then, so
// a timed run counts the command alone.
type Stamp struct {
	MonoNS, UserNS, SysNS int64
}

// The kinds of record on the report pipe.
const (
	recordStamp   = 1
	recordFailure = 2
)

// record is what a child writes on its report pipe, in the machine's byte
// order: a stamp just before execve, a failure if it cannot go on. Both
// are written before the vfork parent resumes (readReport).
type record struct {
	Kind   uint32
	Stage  uint32
	Errno  uint32
	Index  uint32 // which rlimit, candidate or descriptor the stage was at
	MonoNS int64
	UserNS int64
	SysNS  int64
}

const recordSize = int(unsafe.Sizeof(record{}))

// report is what the parent read from a child's report pipe.
type report struct {
	stamp    Stamp
	stamped  bool
	failed   bool
	failure  record
	complete bool // the data was whole records only
}

// parseReport reads the records in data.
func parseReport(data []byte) report {
	var r report
	r.complete = len(data)%recordSize == 0
	for len(data) >= recordSize {
		var rec record
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&rec)), recordSize), data)
		data = data[recordSize:]
		switch rec.Kind {
		case recordStamp:
			r.stamp = Stamp{MonoNS: rec.MonoNS, UserNS: rec.UserNS, SysNS: rec.SysNS}
			r.stamped = true
		case recordFailure:
			r.failed, r.failure = true, rec
		default:
			r.complete = false
		}
	}
	return r
}

// readReport reads what a vfork child wrote on its report pipe, once its
// parent has resumed: its stamp, if it reached one, and why it could not
// exec, if it could not. detail names what the failed stage worked on.
//
// The parent resumes when the child's memory is released, which happens
// only past execve's point of no return or at its exit, so by then every
// record the child will ever write is in the pipe (each an atomic write
// below PIPE_BUF): one read takes them all, without waiting for the end
// of file that comes later in the exec, when the close-on-exec write end
// is closed. Only a child that wrote nothing (killed before its stamp)
// leaves the read to wait for that end of file, which its exit brings.
func readReport(fd int, detail func(rec Stage, index int) string) (Stamp, bool, error) {
	var buf [4 * recordSize]byte
	n, err := unix.Read(fd, buf[:])
	for err == unix.EINTR {
		n, err = unix.Read(fd, buf[:])
	}
	if err != nil {
		return Stamp{}, false, fmt.Errorf("spawn: the child's report: %w", err)
	}
	r := parseReport(buf[:n])
	if !r.complete {
		return Stamp{}, false, fmt.Errorf("spawn: the child's report is %d bytes, not whole records", n)
	}
	if r.failed {
		e := &StageError{Stage: Stage(r.failure.Stage), Errno: unix.Errno(r.failure.Errno)}
		if detail != nil {
			e.Detail = detail(e.Stage, int(r.failure.Index))
		}
		return r.stamp, r.stamped, e
	}
	return r.stamp, r.stamped, nil
}
