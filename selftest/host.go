package selftest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"thermite/internal/cpuset"
	"thermite/internal/hostpolicy"
)

// The rig check: the host's own hygiene, which thermite relies on or which
// skews what the judge measures, but does not set itself. Each row reads
// the kernel's settings under the configured proc and sys roots (stand-in
// trees in tests) and says what to change, with the exact setting.

// Severities of a host row.
const (
	// SevIsolation rows weaken isolation when they fail: the verdict says so.
	SevIsolation = "isolation"
	// SevWarning rows are hardening beyond what thermite needs, or timing
	// hygiene: a failure is a warning.
	SevWarning = "warning"
)

// HostEnv is what the host rows look at.
type HostEnv struct {
	ProcRoot, SysRoot string
	JudgeCPUs         cpuset.Set
	SetIDDirs         []string
	LandlockABI       int
	PolicyABI         int    // the ABI the role policy needs
	Cgroup            string // the broker's cgroup status; "" when no broker answers
	// ProcView is the broker's word on /proc as roles see it: the hidepid
	// option in force there, or "none: why"; "" when no broker answers.
	ProcView string
	// CPUWeights is the broker's word on the roles' CPU weights ("on:
	// ..." or "off: <why>"); "" when no broker answers.
	CPUWeights string
}

// HostResult is one row's outcome.
type HostResult struct {
	Name     string `json:"name"`
	Severity string `json:"severity"`
	OK       bool   `json:"ok"`
	Got      string `json:"got"`
	Want     string `json:"want"`
	Fix      string `json:"fix,omitempty"`
}

// HostRow is one host check: what it is for, and how to read it.
type HostRow struct {
	Name     string
	Severity string
	Why      string // one sentence: what a failure lets through, for docs/rig-checks.md
	Want     string
	Check    func(e HostEnv) (got string, ok bool, fix string)
}

// sysctlRow checks a /proc/sys value is at least min.
func sysctlRow(name, sev, why string, min int) HostRow {
	want := fmt.Sprintf(">= %d", min)
	return HostRow{Name: name, Severity: sev, Why: why, Want: want, Check: func(e HostEnv) (string, bool, string) {
		p := filepath.Join(e.ProcRoot, "sys", strings.ReplaceAll(name, ".", "/"))
		fix := fmt.Sprintf("sysctl -w %s=%d (and %s = %d in /etc/sysctl.d/90-thermite.conf)", name, min, name, min)
		data, err := os.ReadFile(p)
		if err != nil {
			return "unreadable: " + err.Error(), false, fix
		}
		v, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil {
			return fmt.Sprintf("%q", strings.TrimSpace(string(data))), false, fix
		}
		return strconv.Itoa(v), v >= min, fix
	}}
}

// HostChecks are the rig check's rows, in the order they print.
var HostChecks = []HostRow{
	sysctlRow("kernel.kptr_restrict", SevIsolation, "with 0, /proc/kallsyms and other files show kernel addresses to every role, which undoes KASLR for an exploit", 1),
	sysctlRow("kernel.dmesg_restrict", SevIsolation, "with 0, every role reads the kernel log: addresses, other roles' crashes, device paths", 1),
	sysctlRow("fs.protected_symlinks", SevIsolation, "with 0, a role's symlink in a shared sticky folder redirects another user's open", 1),
	sysctlRow("fs.protected_hardlinks", SevIsolation, "with 0, a role may hard-link files it cannot write (another role's, root's set-id files) into its own folders", 1),
	sysctlRow("fs.protected_fifos", SevWarning, "with 0, a FIFO planted in a sticky folder is opened by another user's O_CREAT", 1),
	sysctlRow("fs.protected_regular", SevWarning, "with 0, a file planted in a sticky folder is opened by another user's O_CREAT", 1),
	sysctlRow("kernel.perf_event_paranoid", SevIsolation, "below 2, roles allowed perf_event_open see kernel profiling of the whole machine", 2),
	sysctlRow("kernel.yama.ptrace_scope", SevWarning, "with 0, a process may trace any other of its own user (roles never share a user, so this is defence in depth)", 1),
	{
		Name: "unprivileged user namespaces", Severity: SevWarning, Want: "off",
		Why: "role commands cannot make namespaces (the seccomp filter), but any other user on the host can, and with them reach more of the kernel",
		Check: func(e HostEnv) (string, bool, string) {
			fix := "sysctl -w user.max_user_namespaces=0 (or kernel.unprivileged_userns_clone=0 on Debian's kernels)"
			if v, err := readInt(filepath.Join(e.ProcRoot, "sys/kernel/unprivileged_userns_clone")); err == nil && v == 0 {
				return "kernel.unprivileged_userns_clone=0", true, ""
			}
			if v, err := readInt(filepath.Join(e.ProcRoot, "sys/user/max_user_namespaces")); err == nil {
				return fmt.Sprintf("user.max_user_namespaces=%d", v), v == 0, fix
			}
			return "no user namespace setting found", true, ""
		},
	},
	{
		Name: "debugfs and tracefs", Severity: SevIsolation, Want: "closed to others",
		Why: "a readable debugfs or tracefs shows kernel state and other users' activity to every role",
		Check: func(e HostEnv) (string, bool, string) {
			var open []string
			for _, d := range []string{"kernel/debug", "kernel/tracing"} {
				p := filepath.Join(e.SysRoot, d)
				st, err := os.Stat(p)
				if err != nil {
					continue
				}
				if st.Mode().Perm()&0o005 != 0 {
					open = append(open, fmt.Sprintf("%s (mode %04o)", p, st.Mode().Perm()))
				}
			}
			if len(open) > 0 {
				return strings.Join(open, ", "), false, "chmod 0700 " + filepath.Join(e.SysRoot, "kernel/debug") + " " + filepath.Join(e.SysRoot, "kernel/tracing") + " (or mount debugfs with mode=0700)"
			}
			return "closed", true, ""
		},
	},
	{
		Name: "set-id files reachable by roles", Severity: SevWarning, Want: "none",
		Why: "no_new_privs disarms set-id programs for every role command, so each one left is surface that only that one setting keeps shut",
		Check: func(e HostEnv) (string, bool, string) {
			found := setIDFilesUnder(e.SetIDDirs, 2, 20)
			if len(found) == 0 {
				return "none in " + strings.Join(e.SetIDDirs, " "), true, ""
			}
			return strings.Join(found, " "), false, "chmod u-s,g-s on each (the harness images do it at build time), or uninstall them"
		},
	},
	{
		Name: "landlock", Severity: SevIsolation, Want: "",
		Why: "the role policy (write places, TCP, scoped signals and sockets) is a Landlock rule set; on an older ABI the broker refuses to start unless [host] accept_lost names each protection it lacks, and then names them in its status and verdict",
		Check: func(e HostEnv) (string, bool, string) {
			return fmt.Sprintf("ABI %d", e.LandlockABI), e.LandlockABI >= e.PolicyABI, fmt.Sprintf("a kernel with Landlock ABI %d or newer (Linux 6.12+), landlock in CONFIG_LSM or lsm= on the kernel command line; or run with less: [host] accept_lost (README: Kernels, cgroups and what holds)", e.PolicyABI)
		},
	},
	{
		Name: "cgroups", Severity: SevIsolation, Want: "per-role groups with memory and pids limits",
		Why: "without a writable cgroup tree a role's memory is not limited and its fork loop is held only by RLIMIT_NPROC",
		Check: func(e HostEnv) (string, bool, string) {
			switch {
			case e.Cgroup == "":
				return "unknown: no broker answers (the broker decides at its start)", true, ""
			case strings.HasPrefix(e.Cgroup, "none"):
				return e.Cgroup, false, "give the rig a writable cgroup tree (docs/container.md says how for Docker, podman and Kubernetes); without one it runs only with [host] accept_lost = [\"cgroup-limits\"]"
			}
			return e.Cgroup, true, ""
		},
	},
	{
		Name: "CPU weights", Severity: SevWarning, Want: "on: the rig's own work weighs more than every lane and agent together",
		Why: "without the cpu controller each role command's session is weighed alone (autogroup), so lanes running many processes leave the controller and the judge's builds a sliver of the CPUs: lanes' calls slow, builds and timed runs take longer (isolation holds)",
		Check: func(e HostEnv) (string, bool, string) {
			switch {
			case e.CPUWeights == "":
				return "unknown: no broker answers (the broker decides at its start)", true, ""
			case strings.HasPrefix(e.CPUWeights, "off"):
				return e.CPUWeights, false, "give the rig's cgroup tree the cpu controller: on cgroup v1 a writable cpu hierarchy under /sys/fs/cgroup; on cgroup v2 cpu in the broker's group's cgroup.controllers (a systemd unit with Delegate=yes, a container with its own cgroup namespace: docs/container.md); cgroup.enabled = true"
			}
			return e.CPUWeights, true, ""
		},
	},
	{
		Name: "swap", Severity: SevWarning, Want: "no swap",
		Why: "a timed run whose pages go to swap is measured with the disk's speed, and memory limits count swap only where the kernel accounts it",
		Check: func(e HostEnv) (string, bool, string) {
			data, err := os.ReadFile(filepath.Join(e.ProcRoot, "swaps"))
			if err != nil {
				return "unreadable: " + err.Error(), false, ""
			}
			lines := strings.Split(strings.TrimSpace(string(data)), "\n")
			if len(lines) <= 1 {
				return "none", true, ""
			}
			var devs []string
			for _, l := range lines[1:] {
				if f := strings.Fields(l); len(f) > 0 {
					devs = append(devs, f[0])
				}
			}
			return strings.Join(devs, " "), false, "swapoff -a (and remove the swap lines of /etc/fstab)"
		},
	},
	{
		Name: "SMT siblings of the judge CPUs", Severity: SevWarning, Want: "no sibling outside the judge CPUs",
		Why: "a judge CPU whose hyper-thread sibling runs other work is slowed by it: timings vary with what the lanes do",
		Check: func(e HostEnv) (string, bool, string) {
			var shared []string
			for _, c := range e.JudgeCPUs {
				data, err := os.ReadFile(filepath.Join(e.SysRoot, fmt.Sprintf("devices/system/cpu/cpu%d/topology/thread_siblings_list", c)))
				if err != nil {
					continue
				}
				sib, err := cpuset.Parse(strings.TrimSpace(string(data)))
				if err != nil {
					continue
				}
				for _, s := range sib {
					if !e.JudgeCPUs.Contains(cpuset.Set{s}) {
						shared = append(shared, fmt.Sprintf("cpu%d~cpu%d", c, s))
					}
				}
			}
			if len(shared) > 0 {
				return strings.Join(shared, " "), false, "give judge_cpus whole cores (both siblings), or echo off > " + filepath.Join(e.SysRoot, "devices/system/cpu/smt/control")
			}
			return "none", true, ""
		},
	},
	{
		Name: "CPU frequency governor of the judge CPUs", Severity: SevWarning, Want: "performance",
		Why: "a governor that changes the clock with load makes the same program's time vary between repeats",
		Check: func(e HostEnv) (string, bool, string) {
			var bad, seen []string
			for _, c := range e.JudgeCPUs {
				p := filepath.Join(e.SysRoot, fmt.Sprintf("devices/system/cpu/cpu%d/cpufreq/scaling_governor", c))
				data, err := os.ReadFile(p)
				if err != nil {
					continue
				}
				g := strings.TrimSpace(string(data))
				seen = append(seen, fmt.Sprintf("cpu%d %s", c, g))
				if g != "performance" {
					bad = append(bad, p)
				}
			}
			if len(seen) == 0 {
				return "no cpufreq control (a virtual machine, or the firmware's)", true, ""
			}
			if len(bad) > 0 {
				return strings.Join(seen, ", "), false, "echo performance | tee " + strings.Join(bad, " ")
			}
			return strings.Join(seen, ", "), true, ""
		},
	},
	{
		Name: "turbo boost", Severity: SevWarning, Want: "off",
		Why: "turbo raises the clock by temperature and by how many cores are busy: a timed run's speed then depends on the lanes",
		Check: func(e HostEnv) (string, bool, string) {
			if v, err := readInt(filepath.Join(e.SysRoot, "devices/system/cpu/intel_pstate/no_turbo")); err == nil {
				return fmt.Sprintf("intel_pstate no_turbo=%d", v), v == 1, "echo 1 > " + filepath.Join(e.SysRoot, "devices/system/cpu/intel_pstate/no_turbo")
			}
			if v, err := readInt(filepath.Join(e.SysRoot, "devices/system/cpu/cpufreq/boost")); err == nil {
				return fmt.Sprintf("cpufreq boost=%d", v), v == 0, "echo 0 > " + filepath.Join(e.SysRoot, "devices/system/cpu/cpufreq/boost")
			}
			return "no turbo control", true, ""
		},
	},
	{
		Name: "other users' processes hidden in /proc", Severity: SevIsolation, Want: "hidepid=invisible",
		Why: "without hidepid, every role reads stat, status, schedstat and cmdline of the timing user's processes (file modes and Landlock guard only the ptrace-checked files): when the judge runs, what, and for how long",
		Check: func(e HostEnv) (string, bool, string) {
			fix := "start the rig with `thermite serve` as root holding CAP_SYS_ADMIN: it mounts a /proc of its own with hidepid=invisible that every role sees; or mount the host's /proc with hidepid=invisible; otherwise the rig runs only with [host] accept_lost = [\"proc-hidepid\"]"
			switch {
			case strings.HasPrefix(e.ProcView, "none"):
				return e.ProcView, false, fix
			case e.ProcView != "":
				return e.ProcView, true, ""
			}
			// No broker answers: the host's own /proc says no more than
			// that, as the broker decides at its start.
			data, _ := os.ReadFile(filepath.Join(e.ProcRoot, "self", "mountinfo"))
			if opts, ok := procMountOptions(string(data)); ok && hidepidOf(opts) != "" {
				return hidepidOf(opts) + " on the host's /proc", true, ""
			}
			return "unknown: no broker answers (at its start it mounts a /proc of its own with hidepid, or refuses unless [host] accept_lost names proc-hidepid)", true, ""
		},
	},
}

// procMountOptions and hidepidOf are hostpolicy's: the broker decides by
// the same reading.
var (
	procMountOptions = hostpolicy.ProcMountOptions
	hidepidOf        = hostpolicy.HidepidOf
)

// ProcHidesOthers says whether the proc file system at /proc, as the
// caller's mount namespace has it under procRoot, hides other users'
// processes: a role then finds no /proc/PID of another role's process.
func ProcHidesOthers(procRoot string) bool {
	data, err := os.ReadFile(filepath.Join(procRoot, "self", "mountinfo"))
	if err != nil {
		return false
	}
	opts, ok := procMountOptions(string(data))
	return ok && hidepidOf(opts) != ""
}

func readInt(p string) (int, error) {
	data, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(data)))
}

// HostVerdict is the rig check's result: every row, and one sentence.
type HostVerdict struct {
	Holds    bool         `json:"holds"`
	Sentence string       `json:"sentence"`
	Rows     []HostResult `json:"rows"`
}

// CheckHost runs every host row.
func CheckHost(e HostEnv) HostVerdict {
	var v HostVerdict
	var weak, warn []string
	for _, row := range HostChecks {
		got, ok, fix := row.Check(e)
		r := HostResult{Name: row.Name, Severity: row.Severity, OK: ok, Got: got, Want: row.Want}
		if !ok {
			r.Fix = fix
			if row.Severity == SevIsolation {
				weak = append(weak, row.Name)
			} else {
				warn = append(warn, row.Name)
			}
		}
		v.Rows = append(v.Rows, r)
	}
	v.Holds = len(weak) == 0
	if v.Holds {
		v.Sentence = fmt.Sprintf("the host holds: %d checks, none weakens isolation", len(v.Rows))
	} else {
		v.Sentence = "the host weakens isolation: " + strings.Join(weak, ", ")
	}
	if len(warn) > 0 {
		v.Sentence += fmt.Sprintf("; %d warnings: %s", len(warn), strings.Join(warn, ", "))
	}
	return v
}
