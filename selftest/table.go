package selftest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"thermite/fence"
	"thermite/internal/config"
	"thermite/internal/hostpolicy"
	"thermite/internal/netpolicy"
	"thermite/internal/posixacl"
	"thermite/internal/sysvipc"
	"thermite/roles"
)

// Context is what the rows need to know about this rig at this moment:
// where the real targets are, or the canaries placed where they would be.
type Context struct {
	Cfg           config.Config
	Table         *roles.Table
	BrokerPID     int
	ControllerPID int // the controller, or a canary process of its user
	// LiveController is the controller daemon's pid when it runs, else 0.
	LiveController int
	// CtlCgroup is the controller daemon's cgroup as /proc/<pid>/cgroup
	// ends it ("" without cgroups), CtlCgroupDirs its folders, CtlMemory
	// and CtlPids the limits it must have.
	CtlCgroup          string
	CtlCgroupDirs      []string
	CtlMemory, CtlPids int64
	// CPUWeights are the weights the kernel holds for the rig's groups,
	// by group (a role's name, or the controller daemon's group), on
	// cgroup v2's scale; CPUWeightsStatus the broker's word on them ("on:
	// ..." or Off and why), CPUWeightsErr what failed to read.
	CPUWeights       map[string]int64
	CPUWeightsStatus string
	CPUWeightsErr    error
	Ledger           string
	Kit              string
	Secret           string
	SecretValues     []string
	BuildDir         string            // a build folder handed to the builder
	StoredFile       string            // a file of a stored build
	OtherPID         map[string]int    // role name -> a process of another role
	Workspace        map[int]string    // lane number -> a workspace handed to it
	RunKit           map[int]string    // timing card -> a file of its run's kit copy
	RunOut           map[int]string    // timing card -> its run's out/
	RunDir           map[int]string    // timing card -> its run's folder
	RunBuild         map[int]string    // timing card -> its run's link to the stored build
	EnvAllowed       map[string]bool   // the variables a role's command may have
	AgentDir         map[int]string    // agent number -> an agent folder (with a token) handed to it
	LaneArea         map[int]string    // lane number -> a research area handed to it
	OpenedByLane     map[int]string    // lane number -> a folder of its trial's it opened to every role (0777)
	ResearchRun      string            // a run\'s research folder, the controller\'s
	EndedToken       string            // a token of an ended trial, when one exists
	OpenDir          string            // a folder every user may write by its mode (0777)
	Abstract         string            // an abstract unix socket the broker listens on
	TCPPort          int               // a TCP port on 127.0.0.1 that is not the API's
	APIPort          int               // the harness API's TCP port (0: none)
	OtherLoopback    string            // ADDRESS:PORT of a canary on another loopback address at the API's port ("": no TCP API)
	EgressOther      string            // ADDRESS:PORT of a canary on another loopback address at the egress proxy's port ("": no agent.egress)
	LandlockABI      int               // the kernel's Landlock ABI, as the broker builds rule sets for it
	ProcHidden       bool              // /proc hides other users' processes (hidepid)
	Network          roleNetworks      // role name -> its network policy
	Cgroup           map[string]string // role name -> its cgroup's path, "" without cgroups
	ControlKeySHA    string            // the SHA-256 the launch named for control's key
	GPU              *fence.Layout     // nil without a GPU layout
	BrokerCapBnd     string            // the broker's own bounding set, as /proc shows it
	Given            map[string][]int  // role name -> the cards its probe runs with
	// IPCLeft is, per role name, the key of a SysV object of each kind its
	// user owned when it was stopped; LinkedSetID, per lane number, a set-id
	// file of the lane's own in its workspace (placeLeftovers).
	IPCLeft     map[string]map[string]int32
	LinkedSetID map[int]string
	// Online is every CPU the broker may use; Holding is set while a
	// timing user holds HeldCPUs for the Held rows.
	Online   string
	Holding  bool
	HeldCPUs string
	// CardCanaryPID is a process of lane-1 started with the card a timing
	// user then held, 0 without one.
	CardCanaryPID int
	// Lost holds the protections the operator accepted losing here.
	Lost map[string]bool
	// Sparse is, per lane number, the sparse file of DiskRows; disk the
	// broker's measure at each of their steps, by path (diskPhase).
	Sparse map[int]string
	disk   map[string]diskMeasure
	// Starting is set while the Starts rows run; Starts is what the
	// self-test saw of the starts made meanwhile (startsPhase).
	Starting bool
	Starts   *startsSeen
}

// Who says which roles a row applies to.
type Who func(r roles.Role) bool

// Every role.
func Every(roles.Role) bool { return true }

// Except every role of the given kinds.
func Except(kinds ...roles.Kind) Who {
	return func(r roles.Role) bool {
		for _, k := range kinds {
			if r.Kind == k {
				return false
			}
		}
		return true
	}
}

// Only roles of the given kinds.
func Only(kinds ...roles.Kind) Who {
	return func(r roles.Role) bool { return !Except(kinds...)(r) }
}

// Row is one line of the policy: for the roles it names, an attempt and
// the outcomes that count as right. Anything else, including "the file was
// not there" and "the probe could not run", is a failure that says so.
type Row struct {
	Who     Who
	Attempt string
	// Make builds the probe's attempts for a role; none means the row does
	// not apply to it here.
	Make func(c *Context, r roles.Role) []Attempt
	// Want lists the outcomes that are right (EACCES, EPERM, ok, ...).
	Want []string
	// WantFor, when set, decides Want for each role.
	WantFor func(c *Context, r roles.Role) []string
	// Check, when set, looks at the outcome's detail (or at what the run
	// left behind) and says what is wrong, or "" when nothing is.
	Check func(c *Context, r roles.Role, o Outcome) string
	// Alone runs the row's attempts each in a probe process of its own.
	Alone bool
	// Held runs the row only while a timing user holds its judge CPUs
	// (and card) as a timed run does, and only then.
	Held bool
	// Starts runs the row only in the starts phase, as the first lane:
	// its probe runs while the self-test starts commands for the lane and
	// for another role through the broker (startsPhase).
	Starts bool
	// Lost names the protection (internal/hostpolicy) the row proves: a
	// failure where the operator accepted that protection's loss is
	// recorded as such, and the verdict says "without" it.
	Lost string
}

func one(op, path string) func(*Context, roles.Role) []Attempt {
	return func(*Context, roles.Role) []Attempt { return []Attempt{{Op: op, Path: path}} }
}

func at(op string, path func(c *Context, r roles.Role) string) func(*Context, roles.Role) []Attempt {
	return func(c *Context, r roles.Role) []Attempt {
		p := path(c, r)
		if p == "" {
			return nil
		}
		return []Attempt{{Op: op, Path: p}}
	}
}

func pid(op string, p func(c *Context, r roles.Role) int) func(*Context, roles.Role) []Attempt {
	return func(c *Context, r roles.Role) []Attempt {
		n := p(c, r)
		if n <= 0 {
			return nil
		}
		return []Attempt{{Op: op, PID: n}}
	}
}

// BeyondHost is an address no host holds (TEST-NET-3): what a probe that
// reaches it would reach is the world beyond the rig.
const BeyondHost = "203.0.113.1"

// roleNetworks is each role's network policy, by role name.
type roleNetworks map[string]netpolicy.Network

// tcpWant is what a TCP connect must come to: EPERM for none and api
// (seccomp makes no AF_INET or AF_INET6 socket), EACCES for egress
// (Landlock: not its proxy's port) or, where Landlock has no TCP rules
// (ABI below 4), ECONNREFUSED (its namespace: nothing listens there but
// its proxy), through for open.
// otherProcWant is the right outcome of opening a file of another user's
// /proc/PID: refused, or, where /proc hides other users' processes
// (hidepid), not found, which is more than refused.
func otherProcWant(c *Context, _ roles.Role) []string {
	if c.ProcHidden {
		return []string{"EACCES", "ENOENT"}
	}
	return refused
}

func tcpWant(c *Context, r roles.Role) []string {
	switch n := c.Network[r.Name]; {
	case n.AllowsInet():
		return succeeds
	case n == netpolicy.Egress:
		if c.LandlockABI < 4 {
			return []string{"ECONNREFUSED"}
		}
		return refused
	}
	return notPerm
}

var (
	refused  = []string{"EACCES"}
	notPerm  = []string{"EPERM"}
	succeeds = []string{"ok"}
)

// Policy is the isolation self-test: every row, in one place. Later
// capabilities add their rows here.
var Policy = []Row{
	// Judge CPUs, held in the kernel (cpuset), not by request.
	{Who: Except(roles.Timing), Held: true, Attempt: "move onto a judge CPU a timed run holds", Make: func(c *Context, _ roles.Role) []Attempt {
		return []Attempt{{Op: OpAffinity, Arg: c.HeldCPUs}}
	}, Want: []string{"EINVAL"}, Lost: hostpolicy.JudgeCPUSet},
	// A held card, the timed run's alone.
	{Who: Only(roles.Lane), Held: true, Attempt: "keep a process given a card running through a timed run's hold on it", Make: func(c *Context, r roles.Role) []Attempt {
		if r.Index != 1 || c.CardCanaryPID == 0 {
			return nil
		}
		return []Attempt{{Op: OpSignal, PID: c.CardCanaryPID}}
	}, Want: []string{"ESRCH"}},
	{Who: Only(roles.Timing), Attempt: "widen its affinity beyond its judge CPUs", Make: func(c *Context, _ roles.Role) []Attempt {
		return []Attempt{{Op: OpAffinity, Arg: c.Online}}
	}, Want: succeeds, Check: func(c *Context, r roles.Role, o Outcome) string {
		share, err := c.Cfg.JudgeCPUsOf(r.Index - 1)
		if err != nil {
			return err.Error()
		}
		if o.Detail != share.String() {
			return fmt.Sprintf("runs on %s after asking for %s; want its judge CPUs %s only", o.Detail, c.Online, share)
		}
		return ""
	}, Lost: hostpolicy.JudgeCPUSet},
	// What no role may do.
	{Who: Except(roles.Controller), Attempt: "read the ledger", Make: at(OpRead, func(c *Context, _ roles.Role) string { return c.Ledger }), Want: refused},
	{Who: Except(roles.Controller), Attempt: "read a kit", Make: at(OpRead, func(c *Context, _ roles.Role) string { return c.Kit }), Want: refused},
	{Who: Every, Attempt: "read a secret file", Make: at(OpRead, func(c *Context, _ roles.Role) string { return c.Secret }), Want: refused},
	{Who: Except(roles.Controller, roles.Builder, roles.Timing), Attempt: "connect to the broker socket", Make: at(OpConnect, func(c *Context, _ roles.Role) string { return c.Cfg.BrokerSocket() }), Want: refused},
	// The judge's users make no unix socket at all (roles.NoUnixSocketKinds).
	{Who: Only(roles.Builder, roles.Timing), Attempt: "connect to the broker socket", Make: at(OpConnect, func(c *Context, _ roles.Role) string { return c.Cfg.BrokerSocket() }), Want: notPerm},
	{Who: Except(roles.Controller), Attempt: "open the controller's environ", Make: at(OpRead, func(c *Context, _ roles.Role) string { return procEnviron(c.ControllerPID) }), Want: refused, WantFor: otherProcWant},
	{Who: Every, Attempt: "open the broker's environ", Make: at(OpRead, func(c *Context, _ roles.Role) string { return procEnviron(c.BrokerPID) }), Want: refused, WantFor: otherProcWant},
	{Who: Every, Attempt: "signal the broker", Make: pid(OpSignal, func(c *Context, _ roles.Role) int { return c.BrokerPID }), Want: notPerm},
	{Who: Except(roles.Controller), Attempt: "signal the controller", Make: pid(OpSignal, func(c *Context, _ roles.Role) int { return c.ControllerPID }), Want: notPerm},
	{Who: Every, Attempt: "signal another role's process", Make: pid(OpSignal, func(c *Context, r roles.Role) int { return c.OtherPID[r.Name] }), Want: notPerm},
	{Who: Every, Attempt: "ptrace another role's process", Make: pid(OpPtrace, func(c *Context, r roles.Role) int { return c.OtherPID[r.Name] }), Want: notPerm},
	// The start window (starts.go): stopping its own user's processes in a
	// loop, a lane catches some of its new commands between their uid
	// switch and execve, where the broker waits on them.
	{Who: Only(roles.Lane), Starts: true, Attempt: "hold other roles' command starts by stopping its own processes in a loop", Make: stopperAttempt, Want: succeeds, Check: startsWentOn},
	// At its root: no role may stop any process, so none reaches a start
	// or a stop helper of its user, with or without Landlock's scope.
	{Who: Only(roles.Lane), Attempt: "stop a process of its own user with SIGSTOP, SIGTSTP, SIGTTIN or SIGTTOU", Make: stopChildAttempts, Want: notPerm},
	{Who: Every, Attempt: "write a closed temporary place", Make: func(c *Context, _ roles.Role) []Attempt {
		var out []Attempt
		for _, p := range c.Cfg.ClosedTmp {
			out = append(out, Attempt{Op: OpCreateIn, Path: p})
		}
		return out
	}, Want: refused},
	{Who: Every, Attempt: "read another role's temp folder", Make: at(OpList, func(c *Context, r roles.Role) string { return tmpOf(c, otherRole(c, r)) }), Want: refused},
	{Who: Every, Attempt: "write another role's temp folder", Make: at(OpCreateIn, func(c *Context, r roles.Role) string { return tmpOf(c, otherRole(c, r)) }), Want: refused},
	{Who: Except(roles.Controller), Attempt: "list the store", Make: at(OpList, func(c *Context, _ roles.Role) string { return c.Cfg.StoreDir() }), Want: refused},
	{Who: Except(roles.Controller), Attempt: "write a stored build", Make: at(OpWrite, func(c *Context, _ roles.Role) string { return c.StoredFile }), Want: refused},
	{Who: Except(roles.Controller), Attempt: "chmod a stored build", Make: at(OpChmod, func(c *Context, _ roles.Role) string { return c.StoredFile }), Want: notPerm},
	{Who: Except(roles.Controller), Attempt: "rename a stored build", Make: at(OpRename, func(c *Context, _ roles.Role) string { return c.StoredFile }), Want: refused},
	{Who: Every, Attempt: "keep a set-id bit past the run", Make: at(OpSetID, func(c *Context, r roles.Role) string { return filepath.Join(tmpOf(c, r.Name), ".selftest-setid") }),
		// Made and refused (a filter that forbids the chmod) are both fine,
		// as long as no set-id bit is left once the run is over.
		Want: []string{"ok", "EPERM"}, Check: setIDGone},
	{Who: Every, Attempt: "open another lane's workspace", Make: at(OpList, func(c *Context, r roles.Role) string { return c.Workspace[otherLane(c, r)] }), Want: refused},
	{Who: Except(roles.Timing), Attempt: "write a timed run's out/", Make: at(OpCreateIn, func(c *Context, _ roles.Role) string { return c.RunOut[1] }), Want: refused},
	// A timed run's folder holds every case of its kit, hidden ones
	// included, and the stored build's path: another role that knows every
	// path (as /proc once told it) still opens none of it.
	{Who: Except(roles.Controller), Attempt: "list another role's timed run folder", Make: at(OpList, func(c *Context, r roles.Role) string { return c.RunDir[otherTiming(c, r)] }), Want: refused},
	{Who: Except(roles.Controller), Attempt: "read another role's timed run's copy of the kit", Make: at(OpRead, func(c *Context, r roles.Role) string { return c.RunKit[otherTiming(c, r)] }), Want: refused},
	{Who: Except(roles.Controller), Attempt: "read another role's timed run's build link", Make: at(OpReadlink, func(c *Context, r roles.Role) string { return c.RunBuild[otherTiming(c, r)] }), Want: refused},

	// Trials: lanes and agents apart from each other and from the judge.
	{Who: Only(roles.Lane), Attempt: "read another lane's agent folder", Make: at(OpList, func(c *Context, r roles.Role) string { return c.AgentDir[otherLane(c, r)] }), Want: refused},
	{Who: Except(roles.Controller), Attempt: "read another trial's token", Make: at(OpRead, func(c *Context, r roles.Role) string {
		n := otherLane(c, r)
		if r.Kind == roles.Agent {
			n = r.Index%c.Cfg.Lanes + 1
			if n == r.Index {
				return ""
			}
		}
		if c.AgentDir[n] == "" {
			return ""
		}
		return filepath.Join(c.AgentDir[n], "token")
	}), Want: refused},
	{Who: Only(roles.Lane), Attempt: "read another lane's research area", Make: at(OpList, func(c *Context, r roles.Role) string { return c.LaneArea[otherLane(c, r)] }), Want: refused},
	// Issue 27: a lane's folders are closed by what it cannot change. Its
	// trial's folder lets only the lane and its agent pass, so a folder
	// the lane opens inside (its workspace, whose top git wants the
	// lane's) stays out of every other role's reach; its research area's
	// top is the controller's, for the lane's group, as its HOME is root's.
	{Who: Except(roles.Controller), Attempt: "list a folder another lane opened to every role (0777) in its trial's folder", Make: at(OpList, func(c *Context, r roles.Role) string { return c.OpenedByLane[notItsLane(c, r)] }), Want: refused},
	{Who: Only(roles.Lane), Attempt: "list a folder it opened to every role (0777) in its trial's folder", Make: at(OpList, func(c *Context, r roles.Role) string { return c.OpenedByLane[r.Index] }), Want: succeeds},
	{Who: Only(roles.Lane), Attempt: "open its research area to every role (chmod 0755)", Make: at(OpOpenUp, func(c *Context, r roles.Role) string { return c.LaneArea[r.Index] }), Want: notPerm},
	{Who: Only(roles.Lane), Attempt: "write its own research area", Make: at(OpCreateIn, func(c *Context, r roles.Role) string { return c.LaneArea[r.Index] }), Want: succeeds},
	{Who: Except(roles.Controller), Attempt: "write the research folder", Make: at(OpCreateIn, func(c *Context, _ roles.Role) string { return c.ResearchRun }), Want: refused},
	{Who: Only(roles.Agent), Attempt: "read its lane's workspace", Make: at(OpList, func(c *Context, r roles.Role) string { return c.Workspace[r.Index] }), Want: refused},
	{Who: Only(roles.Agent), Attempt: "read its own token", Make: at(OpRead, func(c *Context, r roles.Role) string {
		if c.AgentDir[r.Index] == "" {
			return ""
		}
		return filepath.Join(c.AgentDir[r.Index], "token")
	}), Want: succeeds},
	{Who: Only(roles.Lane, roles.Agent), Attempt: "use a token of an ended trial", Make: func(c *Context, r roles.Role) []Attempt {
		if c.EndedToken == "" {
			return nil
		}
		return []Attempt{{Op: OpAPI, Path: c.Cfg.RoleAPISocket(r.Name), Arg: c.EndedToken}}
	}, Want: []string{"401"}},

	// The hardening: only its own places are writable, namespaces, mounts,
	// set-id modes, io_uring and terminal injection are refused, abstract
	// sockets are scoped, and the network is the role's policy.
	{Who: Every, Attempt: "write a folder whose mode lets everyone write", Make: at(OpCreateIn, func(c *Context, _ roles.Role) string { return c.OpenDir }), Want: refused, Lost: hostpolicy.LandlockFS},
	{Who: Every, Attempt: "make a user namespace, as unshare -U does", Make: one(OpUnshare, ""), Want: notPerm},
	{Who: Every, Attempt: "mount a file system", Make: at(OpMount, func(c *Context, r roles.Role) string { return tmpOf(c, r.Name) }), Want: notPerm},
	{Who: Every, Attempt: "chmod a file set-uid", Make: at(OpChmodSUID, func(c *Context, r roles.Role) string { return filepath.Join(tmpOf(c, r.Name), ".selftest-suid") }), Want: notPerm},
	{Who: Every, Attempt: "set up io_uring", Make: one(OpIOUring, ""), Want: notPerm},
	{Who: Every, Attempt: "set up Linux AIO, whose writes raise no event the disk check sees", Make: one(OpAIO, ""), Want: notPerm},
	{Who: Every, Attempt: "make the broker its tracer with PTRACE_TRACEME", Make: one(OpTraceMe, ""), Want: notPerm, Alone: true},
	{Who: Every, Attempt: "inject terminal input with TIOCSTI", Make: one(OpTIOCSTI, ""), Want: notPerm},
	// Issue 27: the judge's users reach no listener a lane opened to every
	// role, and make none; lanes and agents watch no other role's opens.
	{Who: Only(roles.Builder, roles.Timing), Attempt: "make a unix socket, which could reach a listener a lane opened to every role", Make: one(OpUnixSocket, ""), Want: notPerm},
	{Who: Except(roles.Builder, roles.Timing), Attempt: "make a unix socket, as reaching its API socket does", Make: one(OpUnixSocket, ""), Want: succeeds},
	{Who: Every, Attempt: "make a socket pair, which has no name another role reaches", Make: one(OpSocketPair, ""), Want: succeeds},
	{Who: Only(roles.Builder, roles.Timing), Attempt: "make a FIFO in its own temp folder", Make: at(OpMkfifo, func(c *Context, r roles.Role) string { return tmpOf(c, r.Name) }), Want: refused, Lost: hostpolicy.LandlockFS},
	{Who: Except(roles.Builder, roles.Timing), Attempt: "make a FIFO in its own temp folder", Make: at(OpMkfifo, func(c *Context, r roles.Role) string { return tmpOf(c, r.Name) }), Want: succeeds},
	{Who: Only(roles.Lane, roles.Agent, roles.Builder, roles.Timing), Attempt: "watch a folder every role reads with inotify, which shows another role's opens", Make: one(OpInotify, "/usr/bin"), Want: notPerm},
	{Who: Only(roles.Lane, roles.Agent, roles.Builder, roles.Timing), Attempt: "watch with fanotify (FAN_REPORT_FID, open to an unprivileged user)", Make: one(OpFanotify, ""), Want: notPerm},
	{Who: Only(roles.Lane, roles.Agent, roles.Builder, roles.Timing), Attempt: "watch a folder every role reads with dnotify (fcntl F_NOTIFY)", Make: one(OpDnotify, "/usr/bin"), Want: notPerm},
	{Who: Only(roles.Controller), Attempt: "watch a folder with inotify (a role that runs no lane's code)", Make: one(OpInotify, "/usr/bin"), Want: succeeds},
	// Issue 27, keyrings: a key in a keyring a role's later commands, or
	// another role, could find (its session's, its user's, its persistent
	// one, a session keyring joined by name, which finds another user's
	// keyring whose permissions allow it) is refused by the filter.
	{Who: Every, Attempt: "add a key to its session, user or process keyring", Make: func(*Context, roles.Role) []Attempt {
		return []Attempt{{Op: OpAddKey, Arg: "session"}, {Op: OpAddKey, Arg: "user"}, {Op: OpAddKey, Arg: "process"}}
	}, Want: notPerm},
	{Who: Every, Attempt: "reach its user's persistent keyring, or join a session keyring by name, as another role's may be found", Make: func(*Context, roles.Role) []Attempt {
		return []Attempt{{Op: OpKeyctl, Arg: "get-persistent"}, {Op: OpKeyctl, Arg: "join-session"}}
	}, Want: notPerm},
	// Issue 27, POSIX message queues: their names are shared by every
	// role, and Landlock refuses a queue only after mq_open made it, so
	// the filter refuses every queue call: no name is ever left.
	{Who: Every, Attempt: "make a POSIX message queue, whose name every role's mq_open would see", Make: func(_ *Context, r roles.Role) []Attempt {
		return []Attempt{{Op: OpPOSIXMQ, Arg: "/thermite-selftest-" + r.User}}
	}, Want: notPerm},
	// A role's HOME and TMPDIR are root's, for its group: it cannot open
	// them to other roles.
	{Who: Every, Attempt: "open its own HOME to every role (chmod 0755)", Make: at(OpOpenUp, func(c *Context, r roles.Role) string { return filepath.Join(c.Cfg.ScratchDir(), "home", r.Name) }), Want: notPerm},
	{Who: Every, Attempt: "open its own temp folder to every role (chmod 0755)", Make: at(OpOpenUp, func(c *Context, r roles.Role) string { return tmpOf(c, r.Name) }), Want: notPerm},
	{Who: Every, Attempt: "connect to the broker's abstract unix socket", Make: func(c *Context, r roles.Role) []Attempt {
		if inEgress(c, r) {
			return nil // abstractFromEgress
		}
		return []Attempt{{Op: OpAbstract, Arg: c.Abstract}}
	}, Want: notPerm, Lost: hostpolicy.LandlockScope},
	// Abstract names belong to a network namespace: from its own, an agent
	// in egress mode does not find the broker's at all, before Landlock's
	// scope is asked.
	{Who: Only(roles.Agent, roles.Lane), Attempt: "connect to the broker's abstract unix socket from its egress namespace", Make: abstractFromEgress, Want: []string{"ECONNREFUSED"}},
	{Who: Every, Attempt: "connect to a TCP port that is not the API's", Make: func(c *Context, r roles.Role) []Attempt {
		return []Attempt{{Op: OpTCP, Arg: strconv.Itoa(c.TCPPort)}}
	}, WantFor: tcpWant},
	// Issue 13: api roles reach the harness API through its unix socket
	// and get no TCP at all, since a port rule would reach every address
	// on that port: another loopback address, or the world.
	{Who: Every, Attempt: "connect to the harness API's TCP port", Make: func(c *Context, r roles.Role) []Attempt {
		if c.APIPort == 0 {
			return nil
		}
		return []Attempt{{Op: OpTCP, Arg: strconv.Itoa(c.APIPort)}}
	}, WantFor: tcpWant},
	{Who: Every, Attempt: "connect to another loopback address on the API's port", Make: func(c *Context, r roles.Role) []Attempt {
		if c.OtherLoopback == "" {
			return nil
		}
		return []Attempt{{Op: OpTCP, Arg: c.OtherLoopback}}
	}, WantFor: tcpWant},
	{Who: Every, Attempt: "connect to an address beyond this host on the API's port", Make: func(c *Context, r roles.Role) []Attempt {
		if c.APIPort == 0 || c.Network[r.Name].AllowsInet() || inEgress(c, r) {
			return nil // egress mode: egressBeyond
		}
		return []Attempt{{Op: OpTCP, Arg: net.JoinHostPort(BeyondHost, strconv.Itoa(c.APIPort))}}
	}, Want: notPerm},
	// Agent egress: the one TCP address of a command in egress mode is its
	// proxy, 127.0.0.1 in a network namespace of its own. Landlock lets the
	// proxy's port through on any address, so these prove the namespace:
	// nothing else listens there and nothing beyond lo is routed.
	// Lanes run them in the lane harness's egress mode (egressPhase).
	{Who: Only(roles.Agent, roles.Lane), Attempt: "reach a TCP address other than its egress proxy", Make: egressOther, Want: []string{"ECONNREFUSED"}},
	{Who: Only(roles.Agent, roles.Lane), Attempt: "reach an address beyond this host on its egress proxy's port", Make: egressBeyond, Want: []string{"ENETUNREACH"}},
	{Who: Every, Attempt: "run inside its role's cgroup", Make: func(c *Context, r roles.Role) []Attempt {
		if c.Cgroup[r.Name] == "" {
			return nil
		}
		return []Attempt{{Op: OpCgroup}}
	}, Want: succeeds, Check: func(c *Context, r roles.Role, o Outcome) string {
		if !strings.Contains(o.Detail, c.Cgroup[r.Name]) {
			return fmt.Sprintf("not in %s: %s", c.Cgroup[r.Name], strings.ReplaceAll(strings.TrimSpace(o.Detail), "\n", "; "))
		}
		return ""
	}},

	// Issue 12: SysV IPC is private to its user and goes when the user is
	// stopped; no set-id file through openat2 or a hard link.
	{Who: Every, Attempt: "make a SysV IPC object other users may open", Make: sysvKinds(OpSysVShared), Want: notPerm},
	{Who: Every, Attempt: "open its SysV IPC object up with IPC_SET", Make: sysvKinds(OpSysVOpenUp), Want: notPerm},
	{Who: Except(roles.Controller), Attempt: "find a SysV IPC object its user owned when it was stopped", Make: func(c *Context, r roles.Role) []Attempt {
		var out []Attempt
		for _, kind := range sysvipc.Kinds {
			if key, ok := c.IPCLeft[r.Name][kind]; ok {
				out = append(out, Attempt{Op: OpSysVFind, Arg: kind + ":" + strconv.Itoa(int(key))})
			}
		}
		return out
	}, Want: []string{"ENOENT"}},
	{Who: Every, Attempt: "create a set-id file through openat2", Make: at(OpOpenat2SetID, func(c *Context, r roles.Role) string { return filepath.Join(tmpOf(c, r.Name), ".selftest-openat2") }),
		// ENOSYS: callers fall back to openat, whose mode the filter checks.
		Want: []string{"ENOSYS"}},
	{Who: Only(roles.Lane), Attempt: "keep the set-id bits of its own file by hard-linking it", Make: at(OpLinkSetID, func(c *Context, r roles.Role) string { return c.LinkedSetID[r.Index] }),
		Want: succeeds, Check: linkedSetIDGone},

	// The one-container image: the supervisor's place, the exchange
	// folders, and no host variable.
	{Who: Except(roles.Supervisor), Attempt: "read the supervisor's folder", Make: at(OpList, func(c *Context, _ roles.Role) string { return existing(c.Cfg.Image.SupervisorDir) }), Want: refused},
	{Who: Except(roles.Supervisor), Attempt: "read the supervisor's token", Make: at(OpRead, func(c *Context, _ roles.Role) string {
		if c.Cfg.Image.SupervisorDir == "" {
			return ""
		}
		return existing(filepath.Join(c.Cfg.Image.SupervisorDir, "token"))
	}), Want: refused},
	{Who: Except(roles.Supervisor, roles.Controller), Attempt: "read the outbox", Make: at(OpList, func(c *Context, _ roles.Role) string { return existing(c.Cfg.Image.Outbox) }), Want: refused},
	{Who: Except(roles.Supervisor), Attempt: "write the inbox", Make: at(OpCreateIn, func(c *Context, _ roles.Role) string { return existing(c.Cfg.Image.Inbox) }), Want: refused},
	{Who: Every, Attempt: "no host variable in its environment", Make: one(OpEnv, ""), Want: succeeds, Check: func(c *Context, _ roles.Role, o Outcome) string {
		var bad []string
		for _, n := range strings.Split(o.Detail, ",") {
			for _, p := range c.Cfg.StripEnvPrefixes {
				if strings.HasPrefix(n, p) {
					bad = append(bad, n)
				}
			}
		}
		return strings.Join(bad, ",")
	}},

	// What must hold for every role.
	{Who: Every, Attempt: "CapEff, CapPrm, CapAmb and CapInh are 0", Make: one(OpStatus, ""), Want: succeeds, Check: capsZero},
	{Who: Every, Attempt: "the capability bounding set is empty", Make: one(OpStatus, ""), Want: succeeds, Check: boundingEmpty},
	{Who: Every, Attempt: "no_new_privs is set", Make: one(OpStatus, ""), Want: succeeds, Check: noNewPrivs},
	{Who: Every, Attempt: "uid, gid and groups are the table's", Make: one(OpStatus, ""), Want: succeeds, Check: idsMatch},
	{Who: Every, Attempt: "/etc/group gives it only the table's groups", Make: func(c *Context, r roles.Role) []Attempt {
		return []Attempt{{Op: OpEtcGroups, Arg: r.User}}
	}, Want: succeeds, Check: etcGroupsMatch},
	{Who: Every, Attempt: "only descriptors 0, 1 and 2 are open", Make: one(OpFDs, ""), Want: succeeds, Check: onlyStdio},
	{Who: Every, Attempt: "no secret and no broker variable in the environment", Make: func(c *Context, _ roles.Role) []Attempt {
		return []Attempt{{Op: OpEnv, Arg: strings.Join(c.SecretValues, "\x00")}}
	}, Want: succeeds, Check: envClean},
	{Who: Every, Attempt: "write its own temp folder", Make: at(OpCreateIn, func(c *Context, r roles.Role) string { return tmpOf(c, r.Name) }), Want: succeeds},

	// The GPU fence: every role tries every card and control node.
	{Who: Every, Attempt: "open a card it was not given", Make: func(c *Context, r roles.Role) []Attempt {
		var out []Attempt
		for _, card := range gpuCards(c) {
			if !given(c, r, card.Index) {
				out = append(out, Attempt{Op: OpOpenDev, Path: card.Path})
			}
		}
		return out
	}, Want: refused},
	{Who: Every, Attempt: "ioctl a card it was not given, opened with access mode 3", Make: func(c *Context, r roles.Role) []Attempt {
		var out []Attempt
		for _, card := range gpuCards(c) {
			if !given(c, r, card.Index) {
				out = append(out, Attempt{Op: OpIoctl3, Path: card.Path})
			}
		}
		return out
	}, Want: refused, Lost: hostpolicy.GPUIoctlFence},
	{Who: Every, Attempt: "open a GPU control node without a card", Make: func(c *Context, r roles.Role) []Attempt {
		if c.GPU == nil || len(c.Given[r.Name]) > 0 {
			return nil
		}
		var out []Attempt
		for _, p := range c.GPU.Control {
			out = append(out, Attempt{Op: OpOpenDev, Path: p})
		}
		return out
	}, Want: refused},
	{Who: Every, Attempt: "open the card it was given", Make: func(c *Context, r roles.Role) []Attempt {
		var out []Attempt
		for _, i := range c.Given[r.Name] {
			if card, ok := c.GPU.Card(i); ok {
				out = append(out, Attempt{Op: OpOpenDev, Path: card.Path})
			}
		}
		return out
	}, Want: succeeds},
	{Who: Every, Attempt: "open the GPU control nodes with its card", Make: func(c *Context, r roles.Role) []Attempt {
		if len(c.Given[r.Name]) == 0 {
			return nil
		}
		var out []Attempt
		for _, p := range c.GPU.Control {
			out = append(out, Attempt{Op: OpOpenDev, Path: p})
		}
		return out
	}, Want: succeeds},
	{Who: Every, Attempt: "see exactly the one card it was given", Make: func(c *Context, r roles.Role) []Attempt {
		if len(c.Given[r.Name]) == 0 {
			return nil
		}
		return []Attempt{{Op: OpCards, Path: c.Cfg.GPU.DevRoot}}
	}, Want: succeeds, Check: func(c *Context, r roles.Role, o Outcome) string {
		card, _ := c.GPU.Card(c.Given[r.Name][0])
		if want := "1 " + filepath.Base(card.Path); o.Detail != want {
			return "opens " + o.Detail + ", want " + want
		}
		return ""
	}},
	{Who: Every, Attempt: "NVML, where it loads, reports exactly one device", Make: func(c *Context, r roles.Role) []Attempt {
		if len(c.Given[r.Name]) == 0 {
			return nil
		}
		return []Attempt{{Op: OpNVML}}
	}, Want: succeeds, Check: func(c *Context, r roles.Role, o Outcome) string {
		if strings.HasPrefix(o.Detail, "-1 ") || strings.HasPrefix(o.Detail, "1 ") {
			return "" // "-1 no NVML": the static build, or no driver
		}
		return "NVML reports " + o.Detail
	}},
	{Who: Every, Attempt: "CUDA_VISIBLE_DEVICES names exactly its cards", Make: func(c *Context, r roles.Role) []Attempt {
		return []Attempt{{Op: OpGetenv, Arg: "CUDA_VISIBLE_DEVICES"}}
	}, Want: succeeds, Check: func(c *Context, r roles.Role, o Outcome) string {
		want := ""
		if c.GPU != nil {
			want = strings.TrimPrefix(c.GPU.Env(c.Given[r.Name])[0], "CUDA_VISIBLE_DEVICES=")
		}
		if o.Detail != want {
			return fmt.Sprintf("CUDA_VISIBLE_DEVICES=%q, want %q", o.Detail, want)
		}
		return ""
	}},

	// What must succeed.
	{Who: Only(roles.Controller), Attempt: "reach the broker socket", Make: at(OpConnect, func(c *Context, _ roles.Role) string { return c.Cfg.BrokerSocket() }), Want: succeeds},
	{Who: Only(roles.Lane), Attempt: "write its workspace", Make: at(OpCreateIn, func(c *Context, r roles.Role) string { return c.Workspace[r.Index] }), Want: succeeds},
	{Who: Only(roles.Timing), Attempt: "read its run's copy of the kit", Make: at(OpRead, func(c *Context, r roles.Role) string { return c.RunKit[r.Index] }), Want: succeeds},
	{Who: Every, Attempt: "write a timed run's copy of the kit", Make: at(OpWrite, func(c *Context, r roles.Role) string {
		if r.Kind == roles.Timing {
			return c.RunKit[r.Index]
		}
		return c.RunKit[1]
	}), Want: refused},
	{Who: Only(roles.Builder), Attempt: "write the build folder it was given", Make: at(OpCreateIn, func(c *Context, _ roles.Role) string { return c.BuildDir }), Want: succeeds},
	{Who: Except(roles.Builder, roles.Controller), Attempt: "open the builder's build folder", Make: at(OpList, func(c *Context, _ roles.Role) string { return c.BuildDir }), Want: refused},
	{Who: Only(roles.Timing), Attempt: "read its run's build link", Make: at(OpReadlink, func(c *Context, r roles.Role) string { return c.RunBuild[r.Index] }), Want: succeeds},
	{Who: Only(roles.Timing), Attempt: "write its run's out/", Make: at(OpCreateIn, func(c *Context, r roles.Role) string { return c.RunOut[r.Index] }), Want: succeeds},

	// Issue 27: each lane and agent has its own API socket, in a folder
	// only its group passes, so that no lane queues on another's backlog.
	{Who: Only(roles.Lane, roles.Agent), Attempt: "connect to another lane's harness API socket", Make: at(OpConnect, func(c *Context, r roles.Role) string {
		n := r.Index%c.Cfg.Lanes + 1
		if n == r.Index {
			return ""
		}
		return c.Cfg.RoleAPISocket(fmt.Sprintf("%s-%d", r.Kind, n))
	}), Want: refused},
	{Who: Only(roles.Lane, roles.Agent), Attempt: "connect to its lane's other harness API socket (lane's or agent's)", Make: at(OpConnect, func(c *Context, r roles.Role) string {
		other := roles.Agent
		if r.Kind == roles.Agent {
			other = roles.Lane
		}
		return c.Cfg.RoleAPISocket(fmt.Sprintf("%s-%d", other, r.Index))
	}), Want: refused},
	{Who: Except(roles.Controller, roles.Builder, roles.Timing), Attempt: "connect to the harness API's operator socket", Make: at(OpConnect, func(c *Context, _ roles.Role) string { return existing(c.Cfg.APISocket()) }), Want: refused},
	{Who: Only(roles.Builder, roles.Timing), Attempt: "connect to the harness API's operator socket", Make: at(OpConnect, func(c *Context, _ roles.Role) string { return existing(c.Cfg.APISocket()) }), Want: notPerm},
}

// DiskRows run in a phase of their own (diskPhase), for the first lane:
// the broker measures its folders between the probe's steps.
var DiskRows = []Row{
	{Who: Only(roles.Lane), Attempt: "grow a file unseen by the disk check: fill a sparse file's holes through a shared mapping, which no folder event shows",
		Make: at(OpFillHoles, func(c *Context, r roles.Role) string { return c.Sparse[r.Index] }), Want: succeeds, Check: holesCounted},
	{Who: Only(roles.Lane), Attempt: "keep bytes in symlinks unseen by the disk check: a target over 60 bytes takes a block of its own",
		Make: at(OpLongSymlinks, func(c *Context, r roles.Role) string { return c.Sparse[r.Index] + "-links" }), Want: succeeds, Check: symlinksCounted},
}

// DaemonLabel names the controller daemon's rows: its probe runs confined
// exactly as the controller itself (rule set, filter, cgroup), not as a
// command of the controller's user.
const DaemonLabel = "controller daemon"

// DaemonRows are what the controller daemon must not do, and what it must
// still do: a flaw in what it parses reaches no further than this.
var DaemonRows = []Row{
	{Attempt: "write outside its own folders, in a folder whose mode lets everyone write", Make: at(OpCreateIn, func(c *Context, _ roles.Role) string { return c.OpenDir }), Want: refused, Lost: hostpolicy.LandlockFS},
	{Attempt: "list a folder outside the places it reads", Make: at(OpList, func(c *Context, _ roles.Role) string { return c.OpenDir }), Want: refused, Lost: hostpolicy.LandlockFS},
	{Attempt: "write its research folder", Make: at(OpCreateIn, func(c *Context, _ roles.Role) string { return c.ResearchRun }), Want: succeeds},
	{Attempt: "write its own temp folder", Make: at(OpCreateIn, func(c *Context, r roles.Role) string { return tmpOf(c, r.Name) }), Want: succeeds},
	{Attempt: "make a user namespace, as unshare -U does", Make: one(OpUnshare, ""), Want: notPerm},
	{Attempt: "mount a file system", Make: at(OpMount, func(c *Context, r roles.Role) string { return tmpOf(c, r.Name) }), Want: notPerm},
	{Attempt: "set up io_uring", Make: one(OpIOUring, ""), Want: notPerm},
	{Attempt: "add a key to a kernel keyring", Make: one(OpAddKey, ""), Want: notPerm},
	{Attempt: "make a POSIX message queue, whose name every role's mq_open would see", Make: one(OpPOSIXMQ, "/thermite-selftest-controller-daemon"), Want: notPerm},
	{Attempt: "open a netlink socket of a family other than NETLINK_ROUTE, such as uevents", Make: func(*Context, roles.Role) []Attempt {
		return []Attempt{{Op: OpNetlink, Arg: strconv.Itoa(unix.NETLINK_KOBJECT_UEVENT)}}
	}, Want: notPerm},
	{Attempt: "open a NETLINK_ROUTE socket, as fetch's address lookup does", Make: func(*Context, roles.Role) []Attempt {
		return []Attempt{{Op: OpNetlink, Arg: strconv.Itoa(unix.NETLINK_ROUTE)}}
	}, Want: succeeds},
	{Attempt: "connect to a TCP port, as fetch does", Make: func(c *Context, _ roles.Role) []Attempt {
		return []Attempt{{Op: OpTCP, Arg: strconv.Itoa(c.TCPPort)}}
	}, Want: succeeds},
	{Attempt: "connect to the broker's abstract unix socket", Make: func(c *Context, _ roles.Role) []Attempt {
		return []Attempt{{Op: OpAbstract, Arg: c.Abstract}}
	}, Want: notPerm, Lost: hostpolicy.LandlockScope},
	{Attempt: "reach the broker socket", Make: at(OpConnect, func(c *Context, _ roles.Role) string { return c.Cfg.BrokerSocket() }), Want: succeeds},
	{Attempt: "make the broker its tracer with PTRACE_TRACEME", Make: one(OpTraceMe, ""), Want: notPerm, Alone: true},
	{Attempt: "runs under a seccomp filter, Seccomp 2, with no_new_privs", Make: one(OpStatus, ""), Want: succeeds, Check: func(_ *Context, _ roles.Role, o Outcome) string {
		return seccompFiltered(o.Detail)
	}},
	{Attempt: "runs inside the controller's cgroup", Make: func(c *Context, _ roles.Role) []Attempt {
		if c.CtlCgroup == "" {
			return nil
		}
		return []Attempt{{Op: OpCgroup}}
	}, Want: succeeds, Check: func(c *Context, _ roles.Role, o Outcome) string {
		if !strings.Contains(o.Detail, c.CtlCgroup) {
			return fmt.Sprintf("not in %s: %s", c.CtlCgroup, strings.ReplaceAll(strings.TrimSpace(o.Detail), "\n", "; "))
		}
		return ""
	}},
}

// seccompFiltered wants a status (as /proc/<pid>/status lists it) with
// seccomp in filter mode and no_new_privs set.
func seccompFiltered(status string) string {
	var bad []string
	if v := statusField(status, "Seccomp"); v != "2" {
		bad = append(bad, "Seccomp "+v)
	}
	if v := statusField(status, "NoNewPrivs"); v != "1" {
		bad = append(bad, "NoNewPrivs "+v)
	}
	return strings.Join(bad, ", ")
}

// controllerCgroupHolds checks the controller daemon's cgroup: its memory
// limit and its pids limit as configured, in every hierarchy that has
// them, and the running controller inside it.
func controllerCgroupHolds(c *Context) string {
	if c.CtlCgroup == "" {
		return ""
	}
	var bad []string
	mem, pids := false, false
	for _, d := range c.CtlCgroupDirs {
		for _, f := range []string{"memory.limit_in_bytes", "memory.max"} {
			if data, err := os.ReadFile(filepath.Join(d, f)); err == nil {
				mem = true
				if got := strings.TrimSpace(string(data)); got != strconv.FormatInt(c.CtlMemory, 10) {
					bad = append(bad, fmt.Sprintf("%s is %s, want %d", filepath.Join(d, f), got, c.CtlMemory))
				}
			}
		}
		if data, err := os.ReadFile(filepath.Join(d, "pids.max")); err == nil {
			pids = true
			if got := strings.TrimSpace(string(data)); got != strconv.FormatInt(c.CtlPids, 10) {
				bad = append(bad, fmt.Sprintf("%s is %s, want %d", filepath.Join(d, "pids.max"), got, c.CtlPids))
			}
		}
		if c.LiveController > 0 {
			data, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			if err != nil {
				bad = append(bad, err.Error())
			} else if !contains(strings.Fields(string(data)), strconv.Itoa(c.LiveController)) {
				bad = append(bad, fmt.Sprintf("the controller (pid %d) is not in %s", c.LiveController, d))
			}
		}
	}
	if !mem {
		bad = append(bad, "no memory limit file in "+strings.Join(c.CtlCgroupDirs, ", "))
	}
	if !pids {
		bad = append(bad, "no pids.max in "+strings.Join(c.CtlCgroupDirs, ", "))
	}
	return strings.Join(bad, "; ")
}

// cpuWeightsHold checks the CPU weights the kernel holds for the rig's
// groups: lanes and agents alike, and the controller daemon's group and
// every other group of the rig's own work at least every lane's and
// agent's together (broker.CPUWeight's rule), so that a flood of lanes
// cannot take their CPU. It returns Off and why where the rig has none.
func cpuWeightsHold(c *Context) string {
	if strings.HasPrefix(c.CPUWeightsStatus, Off) {
		return c.CPUWeightsStatus
	}
	if c.CPUWeightsErr != nil {
		return c.CPUWeightsErr.Error()
	}
	names := make([]string, 0, len(c.CPUWeights))
	for n := range c.CPUWeights {
		names = append(names, n)
	}
	sort.Strings(names)
	var bad []string
	lane, laneOf := int64(-1), ""
	for _, n := range names {
		if r, ok := c.Table.Role(n); ok && (r.Kind == roles.Lane || r.Kind == roles.Agent) {
			if w := c.CPUWeights[n]; lane < 0 {
				lane, laneOf = w, n
			} else if w != lane {
				bad = append(bad, fmt.Sprintf("%s weighs %d, %s %d", n, w, laneOf, lane))
			}
		}
	}
	if lane < 0 {
		return "no lane's or agent's group: the lanes' commands run in no cpu group, weighed session by session"
	}
	together := lane * int64(2*c.Cfg.Lanes)
	ctl := c.CtlCgroup == ""
	for _, n := range names {
		if r, ok := c.Table.Role(n); ok && (r.Kind == roles.Lane || r.Kind == roles.Agent) {
			continue
		}
		ctl = ctl || strings.HasSuffix(c.CtlCgroup, "/"+n)
		if w := c.CPUWeights[n]; w < together {
			bad = append(bad, fmt.Sprintf("%s weighs %d, less than the %d lanes' and agents' %d together", n, w, 2*c.Cfg.Lanes, together))
		}
	}
	if !ctl {
		bad = append(bad, "no weight read for the controller daemon's group "+c.CtlCgroup)
	}
	return strings.Join(bad, "; ")
}

// sysvKinds is one attempt of op for each kind of SysV IPC object.
func sysvKinds(op string) func(*Context, roles.Role) []Attempt {
	return func(*Context, roles.Role) []Attempt {
		var out []Attempt
		for _, kind := range sysvipc.Kinds {
			out = append(out, Attempt{Op: op, Arg: kind})
		}
		return out
	}
}

func gpuCards(c *Context) []fence.Card {
	if c.GPU == nil {
		return nil
	}
	return c.GPU.Cards
}

func given(c *Context, r roles.Role, card int) bool {
	for _, i := range c.Given[r.Name] {
		if i == card {
			return true
		}
	}
	return false
}

// existing is p when it exists, else "" (the row does not apply).
func existing(p string) string {
	if p == "" {
		return ""
	}
	if _, err := os.Lstat(p); err != nil {
		return ""
	}
	return p
}

func procEnviron(pid int) string {
	if pid <= 0 {
		return ""
	}
	return "/proc/" + strconv.Itoa(pid) + "/environ"
}

func tmpOf(c *Context, role string) string {
	if role == "" {
		return ""
	}
	return filepath.Join(c.Cfg.ScratchDir(), "tmp", role)
}

// otherRole is some role other than r, for the cross-role rows.
func otherRole(c *Context, r roles.Role) string {
	if r.Name == "builder" {
		return "planner"
	}
	return "builder"
}

// otherTiming is the timing card of a timed run that is not r's: card 1
// for every role but a timing user, the next card for one (0: there is
// none).
func otherTiming(c *Context, r roles.Role) int {
	if r.Kind != roles.Timing {
		return 1
	}
	n := r.Index%c.Cfg.TimingUsers + 1
	if n == r.Index {
		return 0
	}
	return n
}

// notItsLane is a lane that is neither r nor r's: for a lane or an agent
// the next lane (0: there is none), for any other role the first.
func notItsLane(c *Context, r roles.Role) int {
	if r.Kind == roles.Lane || r.Kind == roles.Agent {
		n := r.Index%c.Cfg.Lanes + 1
		if n == r.Index {
			return 0
		}
		return n
	}
	return 1
}

// otherLane is a lane that is not r.
func otherLane(c *Context, r roles.Role) int {
	if r.Kind == roles.Lane {
		n := r.Index%c.Cfg.Lanes + 1
		if n == r.Index {
			return 0 // one lane: no other
		}
		return n
	}
	return 1
}

func statusField(detail, field string) string {
	for _, l := range strings.Split(detail, "\n") {
		k, v, ok := strings.Cut(l, ":")
		if ok && k == field {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func capsZero(_ *Context, _ roles.Role, o Outcome) string {
	var bad []string
	for _, f := range []string{"CapEff", "CapPrm", "CapAmb", "CapInh"} {
		v := statusField(o.Detail, f)
		if v != "0000000000000000" {
			bad = append(bad, f+" "+v)
		}
	}
	return strings.Join(bad, ", ")
}

// boundingEmpty wants no capability even to lose. Where the broker's own
// bounding set could not be cleared (a container without CAP_SETPCAP), the
// role's may hold what the broker's does, and never more.
func boundingEmpty(c *Context, _ roles.Role, o Outcome) string {
	v := statusField(o.Detail, "CapBnd")
	if v == "0000000000000000" || v == c.BrokerCapBnd {
		return ""
	}
	return fmt.Sprintf("CapBnd %s (the broker's is %s)", v, c.BrokerCapBnd)
}

func noNewPrivs(_ *Context, _ roles.Role, o Outcome) string {
	if v := statusField(o.Detail, "NoNewPrivs"); v != "1" {
		return "NoNewPrivs " + v
	}
	return ""
}

// expectedGroups are the table's groups for a role plus, for a probe that
// runs with cards, the GPU groups its run gets.
func expectedGroups(c *Context, r roles.Role) []int {
	out := append([]int(nil), r.Groups...)
	if c.GPU != nil {
		for _, name := range c.GPU.Groups(c.Given[r.Name]) {
			for _, g := range c.Table.Groups {
				if g.Name == name {
					out = append(out, g.GID)
				}
			}
		}
	}
	seen := map[int]bool{}
	uniq := out[:0]
	for _, g := range out {
		if !seen[g] {
			seen[g] = true
			uniq = append(uniq, g)
		}
	}
	return uniq
}

func idsMatch(c *Context, r roles.Role, o Outcome) string {
	var bad []string
	uids := strings.Fields(statusField(o.Detail, "Uid"))
	gids := strings.Fields(statusField(o.Detail, "Gid"))
	if len(uids) != 4 || uids[0] != strconv.Itoa(r.UID) || uids[1] != uids[0] || uids[2] != uids[0] || uids[3] != uids[0] {
		bad = append(bad, "Uid "+strings.Join(uids, " "))
	}
	if len(gids) != 4 || gids[0] != strconv.Itoa(r.GID) || gids[1] != gids[0] || gids[2] != gids[0] || gids[3] != gids[0] {
		bad = append(bad, "Gid "+strings.Join(gids, " "))
	}
	got := strings.Fields(statusField(o.Detail, "Groups"))
	sort.Strings(got)
	if want := groupList(expectedGroups(c, r)); strings.Join(got, " ") != want {
		bad = append(bad, fmt.Sprintf("Groups %q, want %q", strings.Join(got, " "), want))
	}
	return strings.Join(bad, ", ")
}

func groupList(gids []int) string {
	s := make([]string, len(gids))
	for i, g := range gids {
		s[i] = strconv.Itoa(g)
	}
	sort.Strings(s)
	return strings.Join(s, " ")
}

func etcGroupsMatch(_ *Context, r roles.Role, o Outcome) string {
	got := strings.ReplaceAll(o.Detail, ",", " ")
	if want := groupList(r.Groups); got != want {
		return fmt.Sprintf("/etc/group names %s in %q, want %q", r.User, got, want)
	}
	return ""
}

func onlyStdio(_ *Context, _ roles.Role, o Outcome) string {
	if o.Detail != "0,1,2" {
		return "open descriptors " + o.Detail
	}
	return ""
}

func envClean(c *Context, _ roles.Role, o Outcome) string {
	var extra []string
	for _, n := range strings.Split(o.Detail, ",") {
		if n != "" && !c.EnvAllowed[n] {
			extra = append(extra, n)
		}
	}
	if len(extra) > 0 {
		return "variables beyond the role's: " + strings.Join(extra, ",")
	}
	return ""
}

// setIDGone looks, after the run, at the file the probe made.
func setIDGone(c *Context, r roles.Role, o Outcome) string {
	if o.Got != "ok" {
		return ""
	}
	p := filepath.Join(tmpOf(c, r.Name), ".selftest-setid")
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return "" // gone with its bits
	}
	defer unix.Unlink(p)
	if st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
		return fmt.Sprintf("%s kept mode %04o after the run", p, st.Mode&0o7777)
	}
	return ""
}

// RigCheck is a property of the rig itself, checked by the broker as root:
// modes and owners that no probe's refusal would reveal on its own. A
// check that returns Off and why is one the rig runs without (not
// isolation: fairness, timing), said in its row.
type RigCheck struct {
	Attempt string
	Check   func(c *Context) string
}

// Off begins what a RigCheck returns when the rig runs without what it
// checks, and why.
const Off = "off: "

// RigChecks are the rig's own rows.
var RigChecks = []RigCheck{
	{"the broker socket is root:thermite 0660 in a root:thermite 0710 folder", func(c *Context) string {
		gid := c.Table.Controller().GID
		return firstBad(
			ownerMode(c.Cfg.BrokerDir(), 0, gid, 0o710, unix.S_IFDIR),
			ownerMode(c.Cfg.BrokerSocket(), 0, gid, 0o660, unix.S_IFSOCK))
	}},
	{"the secret folder and its files are root's alone", func(c *Context) string {
		return secretsRootOnly(c.Cfg.SecretsDir)
	}},
	{"the closed temporary places are root's, 0700", func(c *Context) string {
		var bad []string
		for _, p := range c.Cfg.ClosedTmp {
			if s := ownerMode(p, 0, 0, 0o700, unix.S_IFDIR); s != "" && !strings.Contains(s, "no such file") {
				bad = append(bad, s)
			}
		}
		return strings.Join(bad, "; ")
	}},
	{"the broker's environment has no host variable", func(c *Context) string {
		var bad []string
		for _, kv := range os.Environ() {
			for _, p := range c.Cfg.StripEnvPrefixes {
				if strings.HasPrefix(kv, p) {
					n, _, _ := strings.Cut(kv, "=")
					bad = append(bad, n)
				}
			}
		}
		return strings.Join(bad, ",")
	}},
	{"control's key copy is root's, writable by nobody else, and matches its SHA-256", func(c *Context) string {
		if c.ControlKeySHA == "" {
			if c.Cfg.Image.OneContainer {
				// The supervisor shares the container: the key the harness
				// trusts must come from the launch, checked by root.
				return "no control key was named: the one-container image needs --control-key and --control-key-sha256"
			}
			return ""
		}
		p := c.Cfg.ControlKey()
		if bad := ownerMode(p, 0, c.Table.Controller().GID, 0o640, unix.S_IFREG); bad != "" {
			return bad
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err.Error()
		}
		sum := sha256.Sum256(data)
		if got := hex.EncodeToString(sum[:]); got != c.ControlKeySHA {
			return fmt.Sprintf("%s has SHA-256 %s, not %s", p, got, c.ControlKeySHA)
		}
		return ""
	}},
	{"no file in the image keeps a set-id bit", func(c *Context) string {
		if !c.Cfg.Image.OneContainer {
			return ""
		}
		return setIDFiles(c.Cfg.Image.ScanRoot)
	}},
	{"the state folders have their owners and modes", func(c *Context) string {
		ctl := c.Table.Controller()
		return firstBad(
			ownerMode(c.Cfg.StateDir, 0, 0, 0o755, unix.S_IFDIR),
			ownerMode(c.Cfg.ControllerDir(), ctl.UID, ctl.GID, 0o700, unix.S_IFDIR),
			ownerMode(c.Cfg.StoreDir(), ctl.UID, ctl.GID, 0o711, unix.S_IFDIR),
			ownerMode(c.Cfg.ScratchDir(), 0, 0, 0o755, unix.S_IFDIR),
			ownerMode(c.Cfg.ResearchDir(), ctl.UID, ctl.GID, 0o755, unix.S_IFDIR))
	}},
	{"every timed run's folder is the controller's, open to one timing user's group alone", runFoldersClosed},
	{"every trial's folder is the controller's, passable by its lane and that lane's agent alone, or retired", trialFoldersClosed},
	{"the running controller has a seccomp filter, Seccomp 2, and no_new_privs", func(c *Context) string {
		if c.LiveController <= 0 {
			return "" // not started yet: its probe's rows speak for it
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.LiveController))
		if err != nil {
			return err.Error()
		}
		return seccompFiltered(string(data))
	}},
	{"the controller's cgroup has its memory and pids limits, the running controller inside", controllerCgroupHolds},
	{"the controller daemon's and each of the rig's own roles' groups weigh as much CPU as every lane and agent together, lanes and agents alike: CPU weights as the kernel holds them, or off and said why", cpuWeightsHold},
	{"every stored build holds plain files and folders only", func(c *Context) string {
		return unplainStored(c.Cfg.StoreDir())
	}},
}

// runFoldersClosed checks each folder in scratch/runs: the controller's,
// either still private (0700, its own group: a run being set up) or 0750
// with a timing user's own group. Anything more open lets a role that
// learns the path read the kit's cases and the build's place in the store.
func runFoldersClosed(c *Context) string {
	ctl := c.Table.Controller()
	timing := map[int]bool{}
	for _, r := range c.Table.Roles {
		if r.Kind == roles.Timing {
			timing[r.GID] = true
		}
	}
	runs := filepath.Join(c.Cfg.ScratchDir(), "runs")
	names, _ := readNames(runs)
	var bad []string
	for _, n := range names {
		p := filepath.Join(runs, n)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			continue // gone since the listing: a run that ended
		}
		mode, gid := st.Mode&0o7777, int(st.Gid)
		private := mode == 0o700 && gid == ctl.GID
		open := mode == 0o750 && timing[gid]
		if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != ctl.UID || !private && !open {
			bad = append(bad, fmt.Sprintf("%s is %d:%d %04o, want %d:<a timing user's group> 0750", p, st.Uid, gid, mode, ctl.UID))
		}
		if len(bad) == 10 {
			break
		}
	}
	return strings.Join(bad, "; ")
}

// trialFoldersClosed checks each folder in scratch/trials: retired (root's,
// 0700, no ACL), still private (the controller's, 0700, no ACL: a trial
// being set up), or closed as TrialFolder closes it: the controller's,
// 0710, and an ACL that names exactly one lane and that lane's agent, with
// search only. Anything more open lets every role reach what a lane opens
// inside.
func trialFoldersClosed(c *Context) string {
	ctl := c.Table.Controller()
	trials := filepath.Join(c.Cfg.ScratchDir(), "trials")
	names, _ := readNames(trials)
	var bad []string
	for _, n := range names {
		p := filepath.Join(trials, n)
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // gone since the listing, or not a folder: retire's concern
		}
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		acl, aerr := posixacl.Get(fd)
		unix.Close(fd)
		if err != nil || aerr != nil {
			bad = append(bad, fmt.Sprintf("%s: %v %v", p, err, aerr))
			continue
		}
		if why := trialFolderWrong(c, ctl, st, acl); why != "" {
			bad = append(bad, p+" "+why)
		}
		if len(bad) == 10 {
			break
		}
	}
	return strings.Join(bad, "; ")
}

// trialFolderWrong says what is wrong with a trial folder's owner, mode
// and ACL, or "".
func trialFolderWrong(c *Context, ctl roles.Role, st unix.Stat_t, acl []posixacl.Entry) string {
	mode := st.Mode & 0o7777
	switch {
	case st.Uid == 0 && mode == 0o700 && acl == nil:
		return "" // retired
	case int(st.Uid) != ctl.UID:
		return fmt.Sprintf("is owned by uid %d", st.Uid)
	case mode == 0o700 && acl == nil:
		return "" // being set up
	case mode != 0o710:
		return fmt.Sprintf("is mode %04o, want 0710 with an ACL for its lane and agent", mode)
	}
	var named []uint32
	for _, e := range acl {
		switch {
		case e.Tag == posixacl.User && e.Perm == posixacl.Execute:
			named = append(named, e.ID)
		case e.Tag == posixacl.UserObj, e.Tag == posixacl.Mask && e.Perm == posixacl.Execute, (e.Tag == posixacl.GroupObj || e.Tag == posixacl.Other) && e.Perm == 0:
		default:
			return fmt.Sprintf("has ACL entry tag %#x perm %o id %d beyond its lane's and agent's search", e.Tag, e.Perm, e.ID)
		}
	}
	if len(named) == 2 {
		lane, ok1 := c.Table.ByUID(int(named[0]))
		agent, ok2 := c.Table.ByUID(int(named[1]))
		if ok1 && ok2 && lane.Kind == roles.Lane && agent.Kind == roles.Agent && lane.Index == agent.Index {
			return ""
		}
	}
	return fmt.Sprintf("lets users %v pass, want one lane and its agent", named)
}

// unplainStored lists what in the store is neither a folder nor a regular
// file with one link: a stored symlink runs whatever its target holds at
// the time, which no hash covers.
func unplainStored(store string) string {
	var bad []string
	filepath.WalkDir(store, func(p string, d fs.DirEntry, err error) error {
		if err != nil || len(bad) == 10 {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil {
			return nil
		}
		switch {
		case st.Mode&unix.S_IFMT == unix.S_IFDIR:
		case st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink == 1:
		case st.Mode&unix.S_IFMT == unix.S_IFREG:
			bad = append(bad, fmt.Sprintf("%s has %d links", p, st.Nlink))
		default:
			bad = append(bad, fmt.Sprintf("%s is not a file or folder (type %o)", p, st.Mode&unix.S_IFMT))
		}
		return nil
	})
	return strings.Join(bad, "; ")
}

// setIDFiles lists regular files with a set-user or set-group bit on the
// file system of root, which the one-container image must not have.
func setIDFiles(root string) string {
	return strings.Join(setIDFilesUnder([]string{root}, -1, 10), "; ")
}

// setIDFilesUnder lists up to max set-id regular files ("path mode") under
// each root, on the root's own file system, never following a symlink, and
// at most depth folders down (-1: any depth).
func setIDFilesUnder(roots []string, depth, max int) []string {
	var bad []string
	for _, root := range roots {
		var rst unix.Stat_t
		if err := unix.Lstat(root, &rst); err != nil {
			continue
		}
		base := strings.Count(filepath.Clean(root), "/")
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if len(bad) >= max {
				return filepath.SkipAll
			}
			if err != nil {
				return nil
			}
			var st unix.Stat_t
			if unix.Lstat(p, &st) != nil {
				return nil
			}
			if d.IsDir() && (st.Dev != rst.Dev || depth >= 0 && strings.Count(p, "/")-base >= depth) {
				return filepath.SkipDir // another file system (/proc, /sys, volumes), or deep enough
			}
			if st.Mode&unix.S_IFMT == unix.S_IFREG && st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
				bad = append(bad, fmt.Sprintf("%s %04o", p, st.Mode&0o7777))
			}
			return nil
		})
	}
	return bad
}

func firstBad(s ...string) string {
	var out []string
	for _, x := range s {
		if x != "" {
			out = append(out, x)
		}
	}
	return strings.Join(out, "; ")
}

func ownerMode(p string, uid, gid int, mode uint32, typ uint32) string {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return fmt.Sprintf("%s: %v", p, err)
	}
	if st.Mode&unix.S_IFMT != typ || int(st.Uid) != uid || int(st.Gid) != gid || st.Mode&0o7777 != mode {
		return fmt.Sprintf("%s is %d:%d %04o, want %d:%d %04o", p, st.Uid, st.Gid, st.Mode&0o7777, uid, gid, mode)
	}
	return ""
}

func secretsRootOnly(dir string) string {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return "" // no secrets folder: nothing to leak
	}
	var bad []string
	if st.Uid != 0 || st.Mode&0o077 != 0 || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		bad = append(bad, fmt.Sprintf("%s is uid %d mode %04o", dir, st.Uid, st.Mode&0o7777))
	}
	ents, _ := readNames(dir)
	for _, n := range ents {
		p := filepath.Join(dir, n)
		if err := unix.Lstat(p, &st); err != nil {
			continue
		}
		if st.Uid != 0 || st.Mode&0o077 != 0 || st.Mode&unix.S_IFMT != unix.S_IFREG {
			bad = append(bad, fmt.Sprintf("%s is uid %d mode %04o", p, st.Uid, st.Mode&0o7777))
		}
	}
	return strings.Join(bad, "; ")
}
