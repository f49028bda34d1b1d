// Package hostpolicy is the kernel policy an operator reasons about: for
// each Landlock ABI (none, 1 … 7 and newer) and each cgroup setup, which of
// the rig's protections hold, which another mechanism covers, and which are
// lost. A lost protection refuses the rig's start unless the operator names
// it in `[host] accept_lost`; an accepted one is named in `thermite status`
// and in the self-test's verdict. The broker and the controller share this
// table; the decision is Decide.
package hostpolicy

import (
	"fmt"
	"sort"
	"strings"
)

// The names an operator writes in `[host] accept_lost`.
const (
	LandlockFS       = "landlock-fs"
	LandlockRefer    = "landlock-refer"
	LandlockTruncate = "landlock-truncate"
	LandlockNet      = "landlock-net"
	GPUIoctlFence    = "gpu-ioctl-fence"
	LandlockScope    = "landlock-scope"
	CgroupLimits     = "cgroup-limits"
	JudgeCPUSet      = "judge-cpuset"
	ProcHidepid      = "proc-hidepid"
)

// Protection is one thing the rig relies on the kernel for.
type Protection struct {
	Name string
	// ABI is the first Landlock ABI that has it; 0 for a non-Landlock one.
	ABI int
	// What it keeps a role from doing.
	What string
	// Covered says what holds the line without it, all of it; "" when
	// something is lost.
	Covered string
	// Lost says what a role may do without it that it may not with it.
	Lost string
	// GPU marks the fence's second lock: its loss is a matter for GPU work
	// alone, never for the rig's start.
	GPU bool
	// Judge marks what only timed runs rely on: its loss refuses timed
	// runs (unless accepted), never the rig's start.
	Judge bool
}

// Protections is the table, in ABI order.
var Protections = []Protection{
	{Name: LandlockFS, ABI: 1,
		What: "file writes only in the role's own places; GPU device files it was not given stay unopened",
		Lost: "writes wherever file modes let any user write (world-writable places that are not closed); GPU files are held by their modes alone"},
	{Name: LandlockRefer, ABI: 2,
		What:    "links and renames across folders only within what a role may write",
		Covered: "ABI 1 refuses every link or rename into another folder under the rule set (stricter); without Landlock, file modes alone, as for landlock-fs"},
	{Name: LandlockTruncate, ABI: 3,
		What:    "truncating only files the role may write",
		Covered: "truncate needs write permission on the file, and opening for write is Landlock's WRITE_FILE"},
	{Name: LandlockNet, ABI: 4,
		What:    "TCP bind and connect for roles whose network policy is none or api (a second lock)",
		Covered: "seccomp gives roles with network none or api no AF_INET or AF_INET6 socket at all (api roles reach the harness API through its unix socket); an agent in egress mode is in a network namespace whose one listener is its proxy and which routes nothing beyond lo; roles with network open reach any port either way"},
	{Name: GPUIoctlFence, ABI: 5, GPU: true,
		What: "ioctl on GPU device files a role was not given, even opened with access mode 3",
		Lost: "GPU device files are held by their owners and modes alone (the first lock); GPU work is refused where those cannot be fixed either"},
	{Name: LandlockScope, ABI: 6,
		What: "abstract unix sockets and signals scoped to the command's own domain",
		Lost: "a role may connect to another role's (or the broker's) abstract unix sockets; signals stay held by the users (kill across users needs CAP_KILL), and the filter refuses every stop signal, so none reaches the broker's starts or helpers of the role's own user"},
	{Name: CgroupLimits,
		What: "per-role memory (no swap) and task limits over everything a role's user runs, and the OOM report",
		Lost: "memory is bounded only per process (RLIMIT_AS) and tasks per user (RLIMIT_NPROC): a role's processes together may take the host's memory"},
	{Name: ProcHidepid,
		What: "other roles' processes hidden in /proc (hidepid=invisible): no role reads stat, status, schedstat, cmdline or io of the timing user's or another lane's processes",
		Lost: "every role reads stat, status, schedstat and cmdline of every other role's processes (file modes and Landlock guard only the ptrace-checked files): when the judge runs, what, for how long and on which CPUs"},
	{Name: JudgeCPUSet, Judge: true,
		What: "a timed run's judge CPUs its own in the kernel (cpuset): no other role's process runs on them, started before the hold or after, and the candidate cannot leave them",
		Lost: "judge CPUs set by sched_setaffinity at the command's start only: another role's process may move onto them and the candidate may widen its affinity (timing noise, not access); timed runs are refused unless accepted"},
}

// Lookup finds a protection by name.
func Lookup(name string) (Protection, bool) {
	for _, p := range Protections {
		if p.Name == name {
			return p, true
		}
	}
	return Protection{}, false
}

// Names lists every name accept_lost takes.
func Names() []string {
	out := make([]string, 0, len(Protections))
	for _, p := range Protections {
		out = append(out, p.Name)
	}
	return out
}

// Host is what the kernel and the cgroup tree give this rig.
type Host struct {
	ABI int // Landlock ABI, 0 without Landlock
	// FenceABI is the ABI the GPU fence insists on (gpu.fence_min_abi).
	FenceABI int
	// Cgroups is "" when per-role cgroups are in force, else why not.
	Cgroups string
	// CgroupsOff is true when the configuration turned cgroups off: the
	// operator has said so, which is acceptance enough.
	CgroupsOff bool
	// CPUSet is "" when a writable cpuset holds judge CPUs, else why not.
	CPUSet string
	// ProcHidepid is "" when /proc, as role commands see it, hides other
	// users' processes, else why not (ProcHidden).
	ProcHidepid string
}

// Missing is one protection this host lacks, and why.
type Missing struct {
	Protection
	Why string // "landlock ABI 2 (needs 4)", "no writable cgroup tree: …"
}

// Verdict is the policy's decision for one host.
type Verdict struct {
	Holds   []string  // protections that hold
	Covered []Missing // missing, another mechanism holds the line
	Lost    []Missing // missing and not covered
}

// Evaluate sorts every protection into holds, covered and lost.
func Evaluate(h Host) Verdict {
	var v Verdict
	for _, p := range Protections {
		need := p.ABI
		if p.Name == GPUIoctlFence && h.FenceABI > need {
			need = h.FenceABI
		}
		why := ""
		switch {
		case p.Name == CgroupLimits:
			why = h.Cgroups
		case p.Name == JudgeCPUSet:
			why = h.CPUSet
		case p.Name == ProcHidepid:
			why = h.ProcHidepid
		case h.ABI == 0:
			why = "no Landlock in this kernel (ABI 0: landlock missing from CONFIG_LSM or lsm=)"
		case h.ABI < need:
			why = fmt.Sprintf("landlock ABI %d (needs %d)", h.ABI, need)
		}
		switch {
		case why == "":
			v.Holds = append(v.Holds, p.Name)
		case p.Covered != "":
			v.Covered = append(v.Covered, Missing{p, why})
		default:
			v.Lost = append(v.Lost, Missing{p, why})
		}
	}
	return v
}

// Decide is the rig's kernel policy: the start is refused, in one line
// naming the kernel, the protection and the setting that accepts it, for
// the first lost protection the operator has not accepted. The GPU fence's
// second lock is left to the GPU work (see GPUDecision), and cgroups the
// configuration turned off count as accepted.
func Decide(h Host, accepted []string) error {
	acc := set(accepted)
	for _, m := range Evaluate(h).Lost {
		if m.GPU || m.Judge || acc[m.Name] || (m.Name == CgroupLimits && h.CgroupsOff) {
			continue
		}
		return fmt.Errorf("host: %s: %s is lost (%s); [host] accept_lost = [%q] runs without it", m.Why, m.Name, m.What, m.Name)
	}
	return nil
}

// GPUDecision decides GPU work from its two locks: the device files' owners
// and modes (permsFixed) and the IOCTL_DEV fence (fenceErr nil). Neither:
// refused. Permissions alone: refused unless accepted. "" runs it.
func GPUDecision(permsFixed bool, permsNote string, fenceErr error, accepted []string) string {
	if fenceErr == nil {
		return ""
	}
	if !permsFixed {
		return fmt.Sprintf("neither GPU lock holds: %v, and the device files' permissions cannot be fixed (%s)", fenceErr, permsNote)
	}
	if set(accepted)[GPUIoctlFence] {
		return ""
	}
	return fmt.Sprintf("%v: the GPU fence's second lock is lost; [host] accept_lost = [%q] runs GPU work on the device files' permissions alone", fenceErr, GPUIoctlFence)
}

// TimedRunDecision decides timed runs: where judge CPUs cannot be held in
// the kernel they are refused, naming why and the setting, unless the
// operator accepted judge-cpuset (then advisory is true: the CPUs are set
// by affinity alone, and status and the verdict name the loss).
func TimedRunDecision(h Host, accepted []string) (advisory bool, err error) {
	if h.CPUSet == "" {
		return false, nil
	}
	if set(accepted)[JudgeCPUSet] {
		return true, nil
	}
	return false, fmt.Errorf("judge CPUs cannot be held in the kernel: %s; timed runs need a writable cpuset (a cgroup v1 cpuset hierarchy, or cgroup v2 with cpuset delegated to the broker's group), or [host] accept_lost = [%q] to run them on affinity alone", h.CPUSet, JudgeCPUSet)
}

// Without names the accepted losses for status and the verdict, in table
// order: "landlock-net (landlock ABI 2 (needs 4))".
func Without(h Host, accepted []string) []string {
	acc := set(accepted)
	var out []string
	for _, m := range Evaluate(h).Lost {
		if acc[m.Name] || (m.Name == CgroupLimits && h.CgroupsOff) {
			out = append(out, fmt.Sprintf("%s (%s)", m.Name, m.Why))
		}
	}
	return out
}

// Validate checks accept_lost's names.
func Validate(names []string) error {
	for _, n := range names {
		if _, ok := Lookup(n); !ok {
			return fmt.Errorf("host.accept_lost: %q is not a protection (one of %s)", n, strings.Join(Names(), ", "))
		}
	}
	return nil
}

// Table spells the policy for the documentation: every protection, what
// it keeps a role from, and what is left without it; then, per Landlock
// ABI, which hold, which are covered and which are lost.
func Table() string {
	var b strings.Builder
	b.WriteString("| protection (`accept_lost` name) | needs | keeps a role from | without it |\n|---|---|---|---|\n")
	for _, p := range Protections {
		need := fmt.Sprintf("Landlock ABI %d", p.ABI)
		switch {
		case p.Judge:
			need = "a writable cpuset (v1 hierarchy, or v2 delegated)"
		case p.Name == ProcHidepid:
			need = "/proc with hidepid as roles see it (`thermite serve` mounts one of its own where it holds CAP_SYS_ADMIN)"
		case p.ABI == 0:
			need = "a writable cgroup tree (memory, pids)"
		}
		without := "lost: " + p.Lost
		if p.Covered != "" {
			without = "covered: " + p.Covered
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", p.Name, need, p.What, without)
	}
	b.WriteString("\n| Landlock ABI | holds | covered by another mechanism | lost (needs accept_lost) |\n|---|---|---|---|\n")
	for abi := 0; abi <= 7; abi++ {
		v := Evaluate(Host{ABI: abi, FenceABI: 5})
		var holds, cov, lost []string
		for _, n := range v.Holds {
			if n != CgroupLimits && n != JudgeCPUSet && n != ProcHidepid {
				holds = append(holds, n)
			}
		}
		for _, m := range v.Covered {
			cov = append(cov, m.Name)
		}
		for _, m := range v.Lost {
			lost = append(lost, m.Name)
		}
		label := fmt.Sprint(abi)
		if abi == 0 {
			label = "none"
		} else if abi == 7 {
			label = "7 and newer"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", label, dash(holds), dash(cov), dash(lost))
	}
	return b.String()
}

func dash(xs []string) string {
	if len(xs) == 0 {
		return "–"
	}
	sort.Strings(xs)
	return strings.Join(xs, ", ")
}

func set(xs []string) map[string]bool {
	m := map[string]bool{}
	for _, x := range xs {
		m[x] = true
	}
	return m
}

// ProcHidden decides, from a mountinfo (/proc/self/mountinfo of the
// process whose view counts), whether the proc file system mounted at
// /proc hides other users' processes: "" when it does, else why not.
// Of mounts stacked on /proc the last is the one a path reaches. Hidepid
// invisible (2) hides them; ptraceable (4) shows only what the caller may
// trace, which for a role is nothing of another's; noaccess (1) still
// lists them and shows their owners.
func ProcHidden(mountinfo string) string {
	opts, ok := ProcMountOptions(mountinfo)
	if !ok {
		return "no proc file system mounted at /proc"
	}
	if HidepidOf(opts) != "" {
		return ""
	}
	return "/proc shows every user's processes: its options " + opts + " have no hidepid"
}

// ProcMountOptions finds the proc file system mounted at /proc in a
// mountinfo and returns its super options, where hidepid is.
func ProcMountOptions(mountinfo string) (opts string, ok bool) {
	for _, l := range strings.Split(mountinfo, "\n") {
		pre, post, found := strings.Cut(l, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if found && len(f) >= 5 && f[4] == "/proc" {
			opts, ok = "", false
			if len(g) >= 3 && g[0] == "proc" {
				opts, ok = g[2], true
			}
		}
	}
	return opts, ok
}

// HidepidOf is the hidepid option among a proc mount's options that hides
// other users' processes, or "".
func HidepidOf(opts string) string {
	for _, o := range strings.Split(opts, ",") {
		switch o {
		case "hidepid=invisible", "hidepid=2", "hidepid=ptraceable", "hidepid=4":
			return o
		}
	}
	return ""
}
