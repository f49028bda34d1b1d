package hostpolicy

import (
	"errors"
	"os"
	"strings"
	"testing"
)

func names(ms []Missing) string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return strings.Join(out, ",")
}

// The table per ABI: what is lost on each kernel an operator may meet.
func TestEachABILosesExactlyWhatItLacks(t *testing.T) {
	cases := map[int]struct{ covered, lost string }{
		0: {"landlock-refer,landlock-truncate,landlock-net", "landlock-fs,gpu-ioctl-fence,landlock-scope"},
		1: {"landlock-refer,landlock-truncate,landlock-net", "gpu-ioctl-fence,landlock-scope"},
		2: {"landlock-truncate,landlock-net", "gpu-ioctl-fence,landlock-scope"}, // Debian 12's 6.1
		4: {"", "gpu-ioctl-fence,landlock-scope"},                               // Ubuntu 24.04's 6.8
		5: {"", "landlock-scope"},
		6: {"", ""}, // 6.12
		7: {"", ""},
		9: {"", ""}, // newer than this table
	}
	for abi, want := range cases {
		v := Evaluate(Host{ABI: abi, FenceABI: 5})
		if got := names(v.Covered); got != want.covered {
			t.Errorf("ABI %d covered: %q, want %q", abi, got, want.covered)
		}
		if got := names(v.Lost); got != want.lost {
			t.Errorf("ABI %d lost: %q, want %q", abi, got, want.lost)
		}
	}
}

func TestOldKernelRefusedInOneLineNamingTheSetting(t *testing.T) {
	err := Decide(Host{ABI: 2, FenceABI: 5}, nil)
	if err == nil {
		t.Fatal("ABI 2 with nothing accepted: started")
	}
	msg := err.Error()
	for _, w := range []string{"landlock ABI 2 (needs 6)", "landlock-scope is lost", `[host] accept_lost = ["landlock-scope"]`} {
		if !strings.Contains(msg, w) {
			t.Errorf("refusal %q lacks %q", msg, w)
		}
	}
	if strings.Contains(msg, "\n") || strings.Contains(msg, "IOCTL_DEV") {
		t.Errorf("refusal is not one line naming the missing feature: %q", msg)
	}
	// Accepted, it runs, the GPU lock being GPU work's own matter; TCP is
	// covered by seccomp, so nothing about it is named.
	acc := []string{LandlockScope}
	if err := Decide(Host{ABI: 2, FenceABI: 5}, acc); err != nil {
		t.Errorf("ABI 2, landlock-scope accepted: %v", err)
	}
	w := strings.Join(Without(Host{ABI: 2, FenceABI: 5}, acc), "; ")
	if w != "landlock-scope (landlock ABI 2 (needs 6))" {
		t.Errorf("without: %q", w)
	}
	// With no Landlock at all, the first loss named is the file rules'.
	if err := Decide(Host{ABI: 0, FenceABI: 5}, nil); err == nil || !strings.Contains(err.Error(), "landlock-fs is lost") {
		t.Errorf("ABI 0: %v", err)
	}
}

// Judge CPUs without a writable cpuset never refuse the start: they refuse
// timed runs, in one line naming the setting, unless the loss is accepted,
// and then it is named.
func TestTimedRunsRefusedWithoutCPUSetUnlessAccepted(t *testing.T) {
	h := Host{ABI: 6, FenceABI: 5, CPUSet: "the cpuset hierarchy is mounted read-only"}
	if err := Decide(h, nil); err != nil {
		t.Fatalf("the start refused for judge CPUs: %v", err)
	}
	adv, err := TimedRunDecision(h, nil)
	if adv || err == nil || !strings.Contains(err.Error(), "mounted read-only") || !strings.Contains(err.Error(), `accept_lost = ["judge-cpuset"]`) {
		t.Fatalf("timed runs without cpuset: %v %v", adv, err)
	}
	if adv, err := TimedRunDecision(h, []string{JudgeCPUSet}); !adv || err != nil {
		t.Fatalf("accepted: %v %v", adv, err)
	}
	if w := Without(h, []string{JudgeCPUSet}); len(w) != 1 || !strings.HasPrefix(w[0], "judge-cpuset (the cpuset") {
		t.Fatalf("without: %q", w)
	}
	if adv, err := TimedRunDecision(Host{ABI: 6}, nil); adv || err != nil {
		t.Fatalf("with a cpuset: %v %v", adv, err)
	}
}

func TestReadOnlyCgroupTreeRefusedUnlessAccepted(t *testing.T) {
	h := Host{ABI: 6, FenceABI: 5, Cgroups: "no writable cgroup tree: cgroup: /sys/fs/cgroup: cgroup v2 is mounted read-only"}
	err := Decide(h, nil)
	if err == nil || !strings.Contains(err.Error(), "cgroup-limits is lost") || !strings.Contains(err.Error(), "mounted read-only") {
		t.Fatalf("read-only tree: %v", err)
	}
	if err := Decide(h, []string{CgroupLimits}); err != nil {
		t.Fatalf("accepted: %v", err)
	}
	if w := Without(h, []string{CgroupLimits}); len(w) != 1 || !strings.HasPrefix(w[0], "cgroup-limits (no writable cgroup tree") {
		t.Fatalf("without: %q", w)
	}
	// cgroup.enabled = false is the operator's own word: runs, named.
	off := Host{ABI: 6, FenceABI: 5, Cgroups: "cgroups are off in the configuration", CgroupsOff: true}
	if err := Decide(off, nil); err != nil {
		t.Fatalf("cgroups off: %v", err)
	}
	if w := Without(off, nil); len(w) != 1 {
		t.Fatalf("cgroups off not named: %q", w)
	}
}

func TestGPUWorkRefusedOnlyWhereNeitherLockHolds(t *testing.T) {
	noFence := errors.New("fence: landlock ABI 4 lacks IOCTL_DEV (need 5)")
	if why := GPUDecision(true, "", nil, nil); why != "" {
		t.Errorf("both locks: %q", why)
	}
	if why := GPUDecision(false, "not root", nil, nil); why != "" {
		t.Errorf("fence alone: %q", why)
	}
	if why := GPUDecision(true, "", noFence, nil); !strings.Contains(why, `accept_lost = ["gpu-ioctl-fence"]`) {
		t.Errorf("permissions alone, not accepted: %q", why)
	}
	if why := GPUDecision(true, "", noFence, []string{GPUIoctlFence}); why != "" {
		t.Errorf("permissions alone, accepted: %q", why)
	}
	if why := GPUDecision(false, "not root", noFence, []string{GPUIoctlFence}); !strings.Contains(why, "neither GPU lock holds") {
		t.Errorf("neither lock, accepted anyway: %q", why)
	}
	// A missing non-GPU feature never refuses GPU work by itself.
	if err := Decide(Host{ABI: 4, FenceABI: 5}, []string{LandlockScope}); err != nil {
		t.Errorf("ABI 4, scope accepted: %v", err)
	}
}

func TestAcceptLostNamesAreChecked(t *testing.T) {
	if err := Validate([]string{"landlock-net", "cgroup-limits", "judge-cpuset"}); err != nil {
		t.Fatal(err)
	}
	if err := Validate([]string{"landlock"}); err == nil || !strings.Contains(err.Error(), "host.accept_lost") {
		t.Fatalf("a wrong name: %v", err)
	}
}

// The README's table is this table: an operator reads what the rig does.
func TestREADMEKernelTableIsCurrent(t *testing.T) {
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), Table()) {
		t.Errorf("README.md lacks the kernel policy table as it is now; paste this under \"Kernels, cgroups and what holds\":\n%s", Table())
	}
}

// TestProcHiddenReadsTheMountRolesReach: /proc hides other users'
// processes only where the proc mount a path reaches (the last stacked on
// /proc) has hidepid invisible or ptraceable; noaccess still lists them,
// and a mount without hidepid over one with it shows everything.
func TestProcHiddenReadsTheMountRolesReach(t *testing.T) {
	for _, c := range []struct {
		what, mountinfo string
		hides           bool
	}{
		{"invisible", "22 1 0:21 / /proc rw - proc proc rw,hidepid=invisible,gid=0", true},
		{"ptraceable", "22 1 0:21 / /proc rw - proc proc rw,hidepid=ptraceable", true},
		{"noaccess still lists them", "22 1 0:21 / /proc rw - proc proc rw,hidepid=noaccess", false},
		{"none", "22 1 0:21 / /proc rw,nosuid - proc proc rw\n23 22 0:22 / /proc/sys/fs/binfmt_misc rw - binfmt_misc binfmt_misc rw", false},
		{"one without over one with", "22 1 0:21 / /proc rw - proc proc rw,hidepid=invisible\n66 22 0:40 / /proc rw - proc proc rw,hidepid=off", false},
		{"one with over one without", "22 1 0:21 / /proc rw - proc proc rw\n66 22 0:40 / /proc rw - proc proc rw,hidepid=invisible,gid=0", true},
		{"no proc at /proc", "22 1 0:21 / /sys rw - sysfs sysfs rw", false},
	} {
		why := ProcHidden(c.mountinfo)
		if (why == "") != c.hides {
			t.Errorf("%s: ProcHidden = %q, want hidden %v", c.what, why, c.hides)
		}
	}
	// Lost, it refuses the start naming the setting; accepted, it runs.
	h := Host{ABI: 6, FenceABI: 5, ProcHidepid: "/proc shows every user's processes: its options rw have no hidepid"}
	if err := Decide(h, nil); err == nil || !strings.Contains(err.Error(), `[host] accept_lost = ["proc-hidepid"]`) {
		t.Errorf("no hidepid, nothing accepted: %v", err)
	}
	if err := Decide(h, []string{ProcHidepid}); err != nil {
		t.Errorf("no hidepid, accepted: %v", err)
	}
	if w := Without(h, []string{ProcHidepid}); len(w) != 1 || !strings.HasPrefix(w[0], "proc-hidepid (") {
		t.Errorf("Without: %v", w)
	}
}
