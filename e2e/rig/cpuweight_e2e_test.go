package rig

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"thermite/broker"
	"thermite/internal/cgroup"
	"thermite/internal/mountinfo"
	"thermite/internal/testrig"
	"thermite/roles"
)

// TestLanesSpinningLeaveTheJudgeItsCPU: 8 lanes each start nproc×4
// processes that spin forever, each in a session of its own (setsid),
// through their trials' exec; then the judge's builder runs one busy
// loop through the broker. Where every session was weighed alike
// (autogroup), the builder's one session got about one part in 65 of the
// CPUs. With the weights, the kernel's own accounting shows the builder's
// loop got at least a quarter of all the CPU time the builder and the
// spinners used while they used 2 s of it (its weight, 1600, is every lane's
// and agent's together; one thread can use one CPU of the two, so about
// half is expected). It asserts first where the kernel holds each
// process: every spinner in its lane's cpu group, the builder's loop in
// the builder's, the controller daemon in its own, each group with the
// weight broker.CPUWeight plans, as cpu.shares (v1) or cpu.weight (v2).
func TestLanesSpinningLeaveTheJudgeItsCPU(t *testing.T) {
	const lanes = 8
	r := testrig.New(t, testrig.Options{Lanes: lanes})
	if st := r.Status().CPUWeights; !strings.HasPrefix(st, "on:") {
		t.Skipf("needs the cpu controller in the rig's cgroup tree: cpu weights %s", st)
	}
	p := makeProject(t, r)
	spinners := runtime.NumCPU() * 4
	for lane := 1; lane <= lanes; lane++ {
		_, a := startTrial(t, r, lane, p)
		// Each spinner its own session, its output nowhere, so the exec
		// ends at once and leaves them running (a lane's leftovers live
		// until its trial ends).
		script := fmt.Sprintf(`for i in $(seq %d); do setsid sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 & done`, spinners)
		code, _, raw := a.do("POST", "/v1/exec", map[string]any{"argv": []string{"sh", "-c", script}})
		if _, final := frames(t, raw); code != 200 || final.ExitCode != 0 {
			t.Fatalf("lane %d's exec: %d %s", lane, code, raw)
		}
	}
	var spinning [][]int
	for lane := 1; lane <= lanes; lane++ {
		role := "lane-" + strconv.Itoa(lane)
		var pids []int
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
			// The lane's own shells (its file helper runs as it too); a
			// subshell the exec forked for `&` is a shell too until it
			// execs setsid, in the exec's session: wait for them all to
			// be spinners in sessions of their own.
			pids = pids[:0]
			own := 0
			for _, pid := range r.Procs(role) {
				comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
				f, err := statFields(pid)
				if strings.TrimSpace(string(comm)) != "sh" || err != nil {
					continue // not a shell, or gone
				}
				pids = append(pids, pid)
				if f[3] == strconv.Itoa(pid) {
					own++
				}
			}
			if own >= spinners && own == len(pids) {
				break
			}
			if time.Now().After(deadline) {
				if len(pids) < spinners {
					t.Fatalf("%s runs %d processes, want its %d spinners", role, len(pids), spinners)
				}
				for _, pid := range pids {
					if sid := sessionOf(t, pid); sid != pid {
						t.Errorf("%s's spinner %d is in session %d, not one of its own", role, pid, sid)
					}
				}
				break
			}
		}
		spinning = append(spinning, pids)
	}
	busy := exec.Command(r.Bin, "--config", r.Config, "run-as", "builder", "--timeout", "2m", "--", "sh", "-c", "while :; do :; done")
	var stderr bytes.Buffer
	busy.Stderr = &stderr
	if err := busy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		busy.Process.Kill()
		busy.Wait()
	})
	var loop int
	for deadline := time.Now().Add(time.Minute); loop == 0; time.Sleep(50 * time.Millisecond) {
		if pids := r.Procs("builder"); len(pids) > 0 {
			loop = pids[0]
		} else if time.Now().After(deadline) {
			t.Fatalf("the builder's loop never ran: %s", stderr.String())
		}
	}

	// Where the kernel holds each, and with what weight.
	for lane := 1; lane <= lanes; lane++ {
		for _, pid := range spinning[lane-1] {
			requireCPUGroup(t, pid, "lane-"+strconv.Itoa(lane), broker.CPUWeight(lanes, roles.Lane))
		}
	}
	requireCPUGroup(t, loop, "builder", broker.CPUWeight(lanes, roles.Builder))
	requireCPUGroup(t, r.Status().ControllerPID, "controller.daemon", broker.CPUWeight(lanes, roles.Controller))

	// The share, from the kernel's own accounting of each process, over
	// as long as the builder and the spinners take to use 2 s of CPU
	// together (however busy the machine is otherwise).
	var all []int
	for _, pids := range spinning {
		all = append(all, pids...)
	}
	b0, s0 := cpuTime(t, []int{loop}), cpuTime(t, all)
	start := time.Now()
	var builder, lanesCPU time.Duration
	for builder+lanesCPU < 2*time.Second {
		if time.Since(start) > 2*time.Minute {
			t.Fatalf("in %v the builder and the spinners used only %v and %v of CPU", time.Since(start), builder, lanesCPU)
		}
		time.Sleep(100 * time.Millisecond)
		builder, lanesCPU = cpuTime(t, []int{loop})-b0, cpuTime(t, all)-s0
	}
	share := builder.Seconds() / (builder + lanesCPU).Seconds()
	t.Logf("in %v the builder's loop ran %v, the %d spinners of %d lanes %v together: the builder's share %.2f", time.Since(start).Round(time.Millisecond), builder, len(all), lanes, lanesCPU, share)
	if share < 0.25 {
		t.Errorf("the builder's loop got %.2f of the CPU the builder and the lanes' spinners used (%v against %v), want at least 0.25: the lanes' sessions took the judge's CPU", share, builder, lanesCPU)
	}
}

// sessionOf is a process's session id, from /proc/<pid>/stat.
func sessionOf(t *testing.T, pid int) int {
	t.Helper()
	f := procStatFields(t, pid)
	sid, err := strconv.Atoi(f[3])
	if err != nil {
		t.Fatalf("/proc/%d/stat: session %q", pid, f[3])
	}
	return sid
}

// statFields are the fields of /proc/<pid>/stat after its command's
// name, which may hold spaces and parentheses itself: state first.
func statFields(pid int) ([]string, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 > len(stat) {
		return nil, fmt.Errorf("/proc/%d/stat: no command name in %q", pid, stat)
	}
	f := strings.Fields(string(stat[i+2:]))
	if len(f) < 22 {
		return nil, fmt.Errorf("/proc/%d/stat: %d fields after the command name", pid, len(f))
	}
	return f, nil
}

// procStatFields is statFields, failing the test where it cannot be read.
func procStatFields(t *testing.T, pid int) []string {
	t.Helper()
	f, err := statFields(pid)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// cpuTime is the CPU time (user and system) the kernel has charged the
// processes pids, all of their threads, in clock ticks of 10 ms.
func cpuTime(t *testing.T, pids []int) time.Duration {
	t.Helper()
	var ticks int64
	for _, pid := range pids {
		f := procStatFields(t, pid)
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += ut + st
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// requireCPUGroup checks that the kernel holds pid in the cpu group named
// group under the rig's parent, and that the group's weight (cpu.shares
// on v1, cpu.weight on v2) is weight on v2's scale.
func requireCPUGroup(t *testing.T, pid int, group string, weight int64) {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		v1 := false
		for _, c := range strings.Split(f[1], ",") {
			v1 = v1 || c == "cpu"
		}
		file, want, mount := "cpu.shares", strconv.FormatInt(cgroup.SharesOf(weight), 10), ""
		for _, m := range mountinfo.Parse(string(mi)) {
			switch {
			case v1 && m.Type == "cgroup" && contains(m.Super, "cpu"):
				mount = m.Point
			case f[1] == "" && m.Type == "cgroup2" && m.Point == "/sys/fs/cgroup":
				mount = m.Point
				file, want = "cpu.weight", strconv.FormatInt(weight, 10)
			}
		}
		if mount == "" {
			continue
		}
		dir := filepath.Join(mount, f[2])
		if _, err := os.Stat(filepath.Join(dir, file)); err != nil {
			continue // v2's line on a v1 host: its unified tree has no cpu
		}
		if filepath.Base(f[2]) != group {
			t.Errorf("pid %d is in cpu group %s, not %s", pid, f[2], group)
			return
		}
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(b)); got != want {
			t.Errorf("%s/%s = %s, want %s (weight %d)", dir, file, got, want, weight)
		}
		return
	}
	t.Errorf("pid %d is in no cpu group: %s", pid, data)
}
