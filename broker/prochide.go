package broker

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"thermite/internal/hostpolicy"
)

// HideProcesses gives the calling thread a mount namespace of its own in
// which /proc is a new proc mount with hidepid=invisible: every process it
// then execs, the broker and through it the controller and every role's
// command, sees there only the processes it may trace, never another
// role's (stat, status, schedstat, cmdline, io: when the judge runs, what
// and for how long). The host's /proc is not touched, so rigs side by side
// each hold their own. gid= is the caller's group (root's), whose
// processes see all: the broker lists every role's processes (stops,
// measures, holds) without CAP_SYS_PTRACE. Host mounts made later still
// reach the namespace (it is a slave of the host's).
//
// It needs CAP_SYS_ADMIN and a locked OS thread that execs next (`thermite
// serve` calls it before its re-exec as the broker). It fails where the
// process lacks that capability (a container that gives it none); the
// broker then finds /proc as it is, and its kernel policy decides
// (proc-hidepid).
func HideProcesses() error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("a mount namespace of its own: unshare CLONE_NEWNS: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("its mounts as slaves of the host's: %w", err)
	}
	opts := "hidepid=invisible,gid=" + strconv.Itoa(os.Getegid())
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("mount proc on /proc with %s: %w", opts, err)
	}
	return nil
}

// HideProcessesFlag carries HideProcesses' failure from `thermite serve` to
// the broker it execs, to be named where the kernel policy refuses.
const HideProcessesFlag = "proc-hide-error"

// SetProcHideError records why `thermite serve` could not mount the
// broker's own /proc ("" when it did, or the broker was started otherwise).
func (b *Broker) SetProcHideError(why string) { b.procHideErr = why }

// procHidepid is what the kernel policy is told of /proc as every role
// sees it, which is the broker's own (roles inherit its mount namespace):
// "" when it hides other users' processes, else why not.
func (b *Broker) procHidepid() string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "/proc/self/mountinfo: " + err.Error()
	}
	why := hostpolicy.ProcHidden(string(data))
	if why != "" && b.procHideErr != "" {
		why += "; thermite serve could not mount its own: " + b.procHideErr
	}
	return why
}

// procView is the status's word on /proc as roles see it: the hidepid in
// force, or "none: why".
func (b *Broker) procView() string {
	if b.kernel.ProcHidepid != "" {
		return "none: " + b.kernel.ProcHidepid
	}
	data, _ := os.ReadFile("/proc/self/mountinfo")
	opts, _ := hostpolicy.ProcMountOptions(string(data))
	return hostpolicy.HidepidOf(opts) + " (" + opts + ")"
}
