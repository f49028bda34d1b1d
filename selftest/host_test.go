package selftest

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"thermite/internal/cpuset"
)

// HostTree is a stand-in /proc and /sys with every setting as a careful
// operator leaves it; tests change one thing at a time.
type hostTree struct {
	t    *testing.T
	env  HostEnv
	root string
}

func newHostTree(t *testing.T) *hostTree {
	root := t.TempDir()
	h := &hostTree{t: t, root: root, env: HostEnv{
		ProcRoot: filepath.Join(root, "proc"), SysRoot: filepath.Join(root, "sys"),
		JudgeCPUs: cpuset.Set{2, 3}, SetIDDirs: []string{filepath.Join(root, "bin")},
		LandlockABI: 7, PolicyABI: 6, Cgroup: "v2 at /sys/fs/cgroup/thermite; per role: memory 4096 MiB (no swap), 1024 tasks",
		CPUWeights: "on: cgroup v2 cpu.weight 3200 for the controller daemon and each of the rig's own roles, 100 for each lane and agent (16 lanes)",
	}}
	for k, v := range map[string]string{
		"sys/kernel/kptr_restrict": "1", "sys/kernel/dmesg_restrict": "1",
		"sys/fs/protected_symlinks": "1", "sys/fs/protected_hardlinks": "1",
		"sys/fs/protected_fifos": "2", "sys/fs/protected_regular": "2",
		"sys/kernel/perf_event_paranoid": "3", "sys/kernel/yama/ptrace_scope": "1",
		"sys/user/max_user_namespaces": "0",
		"swaps":                        "Filename\tType\tSize\tUsed\tPriority\n",
		"self/mountinfo":               "22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw,hidepid=invisible",
	} {
		h.write("proc/"+k, v, 0o644)
	}
	for _, c := range []string{"2", "3"} {
		h.write("sys/devices/system/cpu/cpu"+c+"/topology/thread_siblings_list", "2-3", 0o644)
		h.write("sys/devices/system/cpu/cpu"+c+"/cpufreq/scaling_governor", "performance", 0o644)
	}
	h.write("sys/devices/system/cpu/intel_pstate/no_turbo", "1", 0o644)
	h.mkdir("sys/kernel/debug", 0o700)
	h.mkdir("sys/kernel/tracing", 0o700)
	h.mkdir("bin", 0o755)
	h.write("bin/ls", "", 0o755)
	return h
}

func (h *hostTree) write(p, v string, mode os.FileMode) {
	h.t.Helper()
	full := filepath.Join(h.root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(full, []byte(v+"\n"), 0o644); err != nil {
		h.t.Fatal(err)
	}
	// The raw mode, set-id bits included (os.Chmod wants os.ModeSetuid).
	if err := syscall.Chmod(full, uint32(mode)); err != nil {
		h.t.Fatal(err)
	}
}

func (h *hostTree) mkdir(p string, mode os.FileMode) {
	h.t.Helper()
	full := filepath.Join(h.root, p)
	if err := os.MkdirAll(full, 0o755); err != nil {
		h.t.Fatal(err)
	}
	os.Chmod(full, mode)
}

func rowOf(t *testing.T, v HostVerdict, name string) HostResult {
	t.Helper()
	for _, r := range v.Rows {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no row %q", name)
	return HostResult{}
}

func TestHostCheckCarefulHostHolds(t *testing.T) {
	v := CheckHost(newHostTree(t).env)
	if !v.Holds || strings.Contains(v.Sentence, "warning") {
		t.Fatalf("a careful host: %s", v.Sentence)
	}
	for _, r := range v.Rows {
		if !r.OK {
			t.Errorf("%s: %s", r.Name, r.Got)
		}
	}
	if len(v.Rows) != len(HostChecks) {
		t.Errorf("%d rows, want %d", len(v.Rows), len(HostChecks))
	}
}

// Each change an operator could make (or a host could come with), and what
// the check must say: the row, whether the verdict holds, and the fix.
func TestHostCheckNamesEachWeakness(t *testing.T) {
	cases := []struct {
		name    string
		change  func(h *hostTree)
		row     string
		holds   bool // warnings leave the verdict holding
		fixHas  string
		gotHas  string
		warning bool
	}{
		{"kallsyms shows addresses", func(h *hostTree) { h.write("proc/sys/kernel/kptr_restrict", "0", 0o644) }, "kernel.kptr_restrict", false, "sysctl -w kernel.kptr_restrict=1", "0", false},
		{"dmesg readable", func(h *hostTree) { h.write("proc/sys/kernel/dmesg_restrict", "0", 0o644) }, "kernel.dmesg_restrict", false, "sysctl -w kernel.dmesg_restrict=1", "0", false},
		{"symlinks unprotected", func(h *hostTree) { h.write("proc/sys/fs/protected_symlinks", "0", 0o644) }, "fs.protected_symlinks", false, "fs.protected_symlinks=1", "0", false},
		{"hardlinks unprotected", func(h *hostTree) { h.write("proc/sys/fs/protected_hardlinks", "0", 0o644) }, "fs.protected_hardlinks", false, "fs.protected_hardlinks=1", "0", false},
		{"fifos unprotected", func(h *hostTree) { h.write("proc/sys/fs/protected_fifos", "0", 0o644) }, "fs.protected_fifos", true, "fs.protected_fifos=1", "0", true},
		{"perf open", func(h *hostTree) { h.write("proc/sys/kernel/perf_event_paranoid", "1", 0o644) }, "kernel.perf_event_paranoid", false, "kernel.perf_event_paranoid=2", "1", false},
		{"ptrace scope 0", func(h *hostTree) { h.write("proc/sys/kernel/yama/ptrace_scope", "0", 0o644) }, "kernel.yama.ptrace_scope", true, "kernel.yama.ptrace_scope=1", "0", true},
		{"user namespaces for all", func(h *hostTree) { h.write("proc/sys/user/max_user_namespaces", "63000", 0o644) }, "unprivileged user namespaces", true, "user.max_user_namespaces=0", "63000", true},
		{"debugfs readable", func(h *hostTree) { h.mkdir("sys/kernel/debug", 0o755) }, "debugfs and tracefs", false, "chmod 0700", "mode 0755", false},
		{"tracefs readable", func(h *hostTree) { h.mkdir("sys/kernel/tracing", 0o555) }, "debugfs and tracefs", false, "chmod 0700", "tracing (mode 0555)", false},
		{"a set-uid file", func(h *hostTree) { h.write("bin/su", "", 0o4755) }, "set-id files reachable by roles", true, "chmod u-s,g-s", "bin/su 4755", true},
		{"a set-gid file two levels down", func(h *hostTree) { h.write("bin/lib/helper", "", 0o2755) }, "set-id files reachable by roles", true, "chmod u-s,g-s", "bin/lib/helper 2755", true},
		{"landlock too old", func(h *hostTree) { h.env.LandlockABI = 4 }, "landlock", false, "Landlock ABI 6", "ABI 4", false},
		{"no cgroups", func(h *hostTree) { h.env.Cgroup = "none: the cgroup tree is read-only (rlimits only)" }, "cgroups", false, "writable cgroup tree", "read-only", false},
		{"no CPU weights", func(h *hostTree) {
			h.env.CPUWeights = "off: no cgroup v1 cpu hierarchy is mounted"
		}, "CPU weights", true, "the cpu controller", "no cgroup v1 cpu hierarchy", true},
		{"swap on", func(h *hostTree) {
			h.write("proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n/swapfile file 1024 0 -2", 0o644)
		}, "swap", true, "swapoff -a", "/swapfile", true},
		{"judge CPU shares a core", func(h *hostTree) {
			h.write("sys/devices/system/cpu/cpu3/topology/thread_siblings_list", "1,3", 0o644)
		}, "SMT siblings of the judge CPUs", true, "whole cores", "cpu3~cpu1", true},
		{"ondemand governor", func(h *hostTree) {
			h.write("sys/devices/system/cpu/cpu2/cpufreq/scaling_governor", "ondemand", 0o644)
		}, "CPU frequency governor of the judge CPUs", true, "echo performance | tee", "cpu2 ondemand", true},
		{"roles see other users' processes in /proc", func(h *hostTree) {
			h.env.ProcView = "none: /proc shows every user's processes: its options rw have no hidepid"
		}, "other users' processes hidden in /proc", false, `accept_lost = ["proc-hidepid"]`, "its options rw have no hidepid", false},
		{"turbo on", func(h *hostTree) { h.write("sys/devices/system/cpu/intel_pstate/no_turbo", "0", 0o644) }, "turbo boost", true, "no_turbo", "no_turbo=0", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHostTree(t)
			c.change(h)
			v := CheckHost(h.env)
			r := rowOf(t, v, c.row)
			if r.OK {
				t.Fatalf("row %s holds after the change: %s", c.row, r.Got)
			}
			if v.Holds != c.holds {
				t.Errorf("verdict holds = %v, want %v: %s", v.Holds, c.holds, v.Sentence)
			}
			if !strings.Contains(v.Sentence, c.row) {
				t.Errorf("the verdict does not name %s: %s", c.row, v.Sentence)
			}
			if !strings.Contains(r.Fix, c.fixHas) || !strings.Contains(r.Got, c.gotHas) {
				t.Errorf("row %s: got %q fix %q; want got with %q, fix with %q", c.row, r.Got, r.Fix, c.gotHas, c.fixHas)
			}
			if (r.Severity == SevWarning) != c.warning {
				t.Errorf("row %s severity %s", c.row, r.Severity)
			}
			for _, o := range v.Rows {
				if o.Name != c.row && !o.OK {
					t.Errorf("row %s failed too: %s", o.Name, o.Got)
				}
			}
		})
	}
}

// The proc mount a path reaches is the last one stacked on /proc.
func TestProcHidesOthersReadsTheTopMount(t *testing.T) {
	h := newHostTree(t)
	if !ProcHidesOthers(h.env.ProcRoot) {
		t.Error("a careful host's /proc (hidepid=invisible) does not hide other users' processes")
	}
	h.write("proc/self/mountinfo", "22 1 0:21 / /proc rw - proc proc rw\n66 22 0:40 / /proc rw - proc proc rw,hidepid=2", 0o644)
	if !ProcHidesOthers(h.env.ProcRoot) {
		t.Error("hidepid=2 mounted over a plain /proc does not count")
	}
	h.write("proc/self/mountinfo", "22 1 0:21 / /proc rw - proc proc rw,hidepid=2\n66 22 0:40 / /proc rw - tmpfs none rw", 0o644)
	if ProcHidesOthers(h.env.ProcRoot) {
		t.Error("a tmpfs over a hidepid /proc counts as hiding")
	}
}
