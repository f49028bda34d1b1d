package weaken

// Every switch a thermite_weaken build reads, declared once: each turns
// one protection off, for the self-test's breakage tests. The code names
// them by these constants only (TestSwitchesByConstant), and a test that
// sets THERMITE_WEAKEN names only switches declared here.
const (
	// SysVIPC drops the filter's SysV IPC rules and the stop helper's
	// removal of a stopped user's IPC objects.
	SysVIPC = "sysv-ipc"
	// SetID answers openat2 again in every role command, and lets the
	// sweep and the hand-back skip a role's hard-linked set-id files.
	SetID = "setid"
	// RunFolder0711 leaves a timed run's folder as it was before issue 12:
	// the controller's, 0711, reachable by whoever knows its path.
	RunFolder0711 = "run-folder-0711"
	// LaneFoldersOpen leaves a lane's folders as they were before issue
	// 27: a trial's folder the controller's and 0711, searchable by every
	// user, and the lane's research area the lane's own, top and all, so
	// that a lane that opens its workspace or its area opens it to every
	// role.
	LaneFoldersOpen = "lane-folders-open"
	// POSIXQueues lets role commands call mq_open again, as before issue
	// 27: Landlock refuses the open with EACCES after the queue is made,
	// so a queue's name stays where every role's mq_open sees it.
	POSIXQueues = "posix-queues"
	// ProcVisible starts the broker without a /proc of its own: roles see
	// /proc as the host mounts it, as before issue 27 (the kernel policy
	// then refuses the start unless proc-hidepid is accepted).
	ProcVisible = "proc-visible"
	// AdvisoryCPUs holds judge CPUs by request only, as before issue 12:
	// no cpuset is narrowed or widened for a timed run.
	AdvisoryCPUs = "advisory-cpus"
	// SlowStart makes a timed run's start spend 150 ms of CPU and 450 ms
	// asleep before its exec, so a test sees whether the judge's clock
	// counts the start.
	SlowStart = "slow-start"
	// SharedHeldCard leaves a held card's node in its GPU group and its
	// holders running, as before issue 12.
	SharedHeldCard = "shared-held-card"
	// APITCP gives api roles TCP again, as before issue 13: the filter
	// allows AF_INET and AF_INET6 stream sockets and Landlock the API's
	// port, on any address.
	APITCP = "api-tcp"
	// ControllerBare starts the controller daemon as before issue 13: no
	// rule set, no filter, no cgroup of its own.
	ControllerBare = "controller-bare"
	// EgressOpen runs a command in egress mode in the host's network
	// namespace with an open network, as if the agent's namespace and its
	// one-port rule were gone.
	EgressOpen = "egress-open"
	// DiskUnseen makes the incremental disk measure re-stat nothing that
	// no folder event names: a sparse file's holes filled through mmap,
	// or a file written through a link elsewhere, go uncounted.
	DiskUnseen = "disk-unseen"
	// AIO lets a role set up Linux AIO again: its writes raise no
	// inotify event, so the incremental disk measure would not see them.
	AIO = "aio"
	// UnguardedStart starts a role's command as before the start-window
	// fix: under syscall.ForkLock, with nothing sending SIGCONT to a child
	// stopped between its uid switch and execve, so a lane that stops its
	// own processes holds every start after it.
	UnguardedStart = "unguarded-start"
	// StopSignals lets every role send SIGSTOP, SIGTSTP, SIGTTIN and
	// SIGTTOU again (and pick one with F_SETSIG), as before the filter
	// refused them: a lane stops its own user's processes, the broker's
	// starts and helpers among them where Landlock cannot scope signals.
	StopSignals = "stop-signals"
	// DiskSymlinks makes the disk measure pass over symlinks again: a
	// long target's block of its own goes uncounted.
	DiskSymlinks = "disk-symlinks"
	// LeakFD leaves the working folder's descriptor open into every role
	// command, above its stdio and slots.
	LeakFD = "leak-fd"
	// CapAmb keeps CAP_CHOWN in the broker's inheritable set and raises it
	// into every role command's ambient set.
	CapAmb = "cap-amb"
	// NoLandlock starts every role command with neither its Landlock rule
	// set nor its system-call filter.
	NoLandlock = "no-landlock"
	// FenceOnly leaves a role command's rule set at the GPU fence alone,
	// without the file-system rules.
	FenceOnly = "fence-only"
	// FlatCPUWeights gives every role's cgroup and the controller
	// daemon's the lanes' CPU weight, as if the rig's own work were one
	// more lane: a flood of lanes then takes the controller's and the
	// judge's CPU.
	FlatCPUWeights = "flat-cpu-weights"
	// LandlockABIPrefix, followed by a number, pretends the kernel has that
	// Landlock ABI (when lower than its own).
	LandlockABIPrefix = "landlock-abi-"
)
