//go:build linux

// Command riginit is PID 1 of the virtual machines e2e/vm/kernels.sh boots
// with a Debian root file system: it mounts cgroup2 read-write or read-only
// (thermite.cgroup=rw|ro), brings the loopback up, and runs the rig as an
// operator would: the broker's start with the default configuration, then
// with the losses this kernel needs accepted (thermite.accept=a,b), the
// status and the self-test, a command as a lane in its cgroup, a memory
// bomb, a fork bomb, the lane's stop, and a trial. It prints one line
// "THERMITE-VM: RESULT {json}" that the Go test reads, and powers off.
//
// Run as `riginit membomb MB` it allocates and touches MB MiB, as the lane's
// memory bomb.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"thermite/e2e/vm/vminit"
)

// Lines the script and the test match; keep them in step with kernels.sh
// and kernels_test.go.
const (
	markResult = "THERMITE-VM: RESULT"
	bin        = "/usr/local/bin/thermite"
	cfgPath    = "/etc/thermite/rig.toml"
	memoryMB   = 128
	pidsMax    = 64
)

// Result is what one setup measured; kernels_test.go asserts on it.
type Result struct {
	Kernel        string   `json:"kernel"`
	Cgroup        string   `json:"cgroup"` // rw or ro, as mounted
	LandlockABI   int      `json:"landlock_abi"`
	DefaultStart  string   `json:"default_start"` // "ready" or the refusal line
	AcceptedStart string   `json:"accepted_start,omitempty"`
	StartSeconds  float64  `json:"start_seconds"`
	Without       []string `json:"without"`
	CgroupStatus  string   `json:"cgroup_status"`
	CPUWeights    string   `json:"cpu_weights"`
	Sentence      string   `json:"sentence"`
	LaneCgroup    string   `json:"lane_cgroup"`
	MemoryBomb    string   `json:"memory_bomb"` // the run's stop reason and exit code
	ForkBombMax   int      `json:"fork_bomb_max"`
	StopSeconds   float64  `json:"stop_seconds"`
	StopOutput    string   `json:"stop_output"`
	LeftAfterStop int      `json:"left_after_stop"`
	Trial         string   `json:"trial"`
	// StopCgroupMS and StopHelperMS are `thermite stop lane-1` of 50
	// sleeping processes, with the role's cgroup (cgroup.kill, then the
	// helper) and with cgroups off (the helper alone), in milliseconds.
	StopCgroupMS []float64 `json:"stop_cgroup_ms,omitempty"`
	StopHelperMS []float64 `json:"stop_helper_ms,omitempty"`
	// Quota is the quota path's case (thermite.quota=1): scratch on an
	// ext4 with user quotas, one more start of the rig.
	Quota          *QuotaResult `json:"quota,omitempty"`
	Errors         []string     `json:"errors,omitempty"`
	ScenarioSecond float64      `json:"scenario_seconds"`
}

func main() {
	if len(os.Args) == 3 && os.Args[1] == "membomb" {
		os.Exit(membomb(os.Args[2]))
	}
	defer vminit.PowerOff()
	mountAll()
	// The command line is read from /proc, mounted just now.
	ro := vminit.Param("thermite.cgroup", "rw") == "ro"
	mountCgroup(ro)
	fmt.Printf("%s %s s after boot; kernel %s\n", vminit.MarkInit, vminit.Uptime(), vminit.KernelRelease())
	os.Setenv("PATH", "/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	os.Setenv("HOME", "/root")
	if err := loopbackUp(); err != nil {
		fmt.Printf("THERMITE-VM: loopback: %v\n", err)
	}
	start := time.Now()
	res := scenario(ro)
	res.ScenarioSecond = time.Since(start).Seconds()
	data, _ := json.Marshal(res)
	fmt.Printf("%s %s\n", markResult, data)
	fmt.Printf("%s PASS: scenario ran (%d errors)\n", vminit.MarkVerdict, len(res.Errors))
}

func scenario(ro bool) *Result {
	s := &rigScenario{
		r:    &Result{Kernel: vminit.KernelRelease(), Cgroup: map[bool]string{true: "ro", false: "rw"}[ro]},
		base: fmt.Sprintf("lanes = 1\ntiming_users = 1\n[cgroup]\nenabled = true\nmemory_mb = %d\npids = %d\n[limits]\nprocesses = 512\n", memoryMB, pidsMax),
	}
	if !s.start() {
		return s.r
	}
	defer s.stopBroker()
	s.status()
	s.laneCgroup()
	s.memoryBomb()
	uid := laneUID()
	s.forkBomb(uid)
	if !s.trial() {
		return s.r
	}
	if vminit.Param("thermite.stopbench", "") == "1" && !s.stopBench(uid) {
		return s.r
	}
	if vminit.Param("thermite.quota", "") == "1" {
		s.broker.Process.Signal(unix.SIGTERM)
		s.broker.Wait()
		s.r.Quota, s.broker = quotaCase(s.base, s.errf)
	}
	return s.r
}

// rigScenario is one run of the scenario: what it measured, the rig's
// base configuration and the broker now running.
type rigScenario struct {
	r      *Result
	base   string
	broker *exec.Cmd
}

// errf records an error in the result and prints it.
func (s *rigScenario) errf(f string, a ...any) {
	e := fmt.Sprintf(f, a...)
	s.r.Errors = append(s.r.Errors, e)
	fmt.Printf("RIG: error: %s\n", e)
}

// start writes the configuration, the role users, and starts the broker:
// with the defaults, then, when refused, with the losses thermite.accept
// names accepted. It says whether the rig is ready.
func (s *rigScenario) start() bool {
	r := s.r
	os.MkdirAll("/etc/thermite", 0o755)
	os.WriteFile(cfgPath, []byte(s.base), 0o644)
	if out, err := run(bin, "roles", "ensure"); err != nil {
		s.errf("roles ensure: %v: %s", err, out)
		return false
	}
	t0 := time.Now()
	var state string
	s.broker, state = startBroker()
	r.DefaultStart = state
	fmt.Printf("RIG: default start: %s (%.1f s)\n", state, time.Since(t0).Seconds())
	if state != "ready" {
		accept := vminit.Param("thermite.accept", "")
		if accept == "" {
			s.errf("refused with nothing to accept: %s", state)
			return false
		}
		var names []string
		for _, n := range strings.Split(accept, ",") {
			names = append(names, strconv.Quote(n))
		}
		os.WriteFile(cfgPath, []byte(s.base+"[host]\naccept_lost = ["+strings.Join(names, ", ")+"]\n"), 0o644)
		t0 = time.Now()
		s.broker, state = startBroker()
		r.AcceptedStart = state
		fmt.Printf("RIG: start with accept_lost = [%s]: %s (%.1f s)\n", strings.Join(names, ", "), state, time.Since(t0).Seconds())
		if state != "ready" {
			s.errf("accepted start: %s", state)
			return false
		}
	}
	r.StartSeconds = time.Since(t0).Seconds()
	return true
}

// stopBroker stops the broker now running, if any, as the scenario ends.
func (s *rigScenario) stopBroker() {
	if s.broker == nil {
		return
	}
	s.broker.Process.Signal(unix.SIGTERM)
	done := make(chan struct{})
	go func() { s.broker.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		s.errf("the broker did not stop in 30 s after SIGTERM")
	}
}

// status records status's Landlock ABI, cgroup line, losses and the
// self-test's sentence.
func (s *rigScenario) status() {
	r := s.r
	var st struct {
		LandlockABI int      `json:"landlock_abi"`
		Cgroup      string   `json:"cgroup"`
		CPUWeights  string   `json:"cpu_weights"`
		Without     []string `json:"without"`
		Selftest    *struct {
			Sentence string `json:"sentence"`
		} `json:"selftest"`
	}
	if out, err := run(bin, "status", "--json"); err != nil || json.Unmarshal(out, &st) != nil {
		s.errf("status: %v: %s", err, out)
	}
	r.LandlockABI, r.CgroupStatus, r.CPUWeights, r.Without = st.LandlockABI, st.Cgroup, st.CPUWeights, st.Without
	if st.Selftest != nil {
		r.Sentence = st.Selftest.Sentence
	}
	fmt.Printf("RIG: status: ABI %d, cgroup %s, cpu weights %s, without %q\nRIG: self-test: %s\n", r.LandlockABI, r.CgroupStatus, r.CPUWeights, r.Without, r.Sentence)
}

// laneCgroup records the cgroup a lane's command runs in.
func (s *rigScenario) laneCgroup() {
	out, err := run(bin, "run-as", "lane-1", "--", "cat", "/proc/self/cgroup")
	if err != nil {
		s.errf("run-as cat /proc/self/cgroup: %v: %s", err, out)
	}
	s.r.LaneCgroup = strings.TrimSpace(string(out))
	fmt.Printf("RIG: lane-1's cgroup: %s\n", s.r.LaneCgroup)
}

// memoryBomb runs 4x the role's memory limit, touched page by page, and
// records how the run was stopped.
func (s *rigScenario) memoryBomb() {
	cmd := exec.Command(bin, "run-as", "lane-1", "--json", "--", "/init", "membomb", strconv.Itoa(memoryMB*4))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.Run()
	var rr struct {
		ExitCode int    `json:"exit_code"`
		Signal   int    `json:"signal"`
		Stopped  string `json:"stopped"`
	}
	found := false
	for _, l := range bytes.Split(stderr.Bytes(), []byte("\n")) {
		if bytes.HasPrefix(l, []byte("{")) && json.Unmarshal(l, &rr) == nil {
			found = true
		}
	}
	if !found {
		s.errf("memory bomb: no JSON result: %s", stderr.String())
	}
	s.r.MemoryBomb = fmt.Sprintf("stopped=%s exit=%d signal=%d", rr.Stopped, rr.ExitCode, rr.Signal)
	fmt.Printf("RIG: memory bomb (%d MiB under %d MiB): %s\n", memoryMB*4, memoryMB, s.r.MemoryBomb)
}

// forkBomb forks sleepers as the lane until something stops it, counted
// from here, then stops the lane and counts what is left.
func (s *rigScenario) forkBomb(uid int) {
	r := s.r
	bomb := exec.Command(bin, "run-as", "lane-1", "--timeout", "5m", "--", "/bin/sh", "-c",
		"exec >/dev/null 2>&1; while :; do sleep 600 & done")
	bomb.Start()
	deadline := time.Now().Add(40 * time.Second)
	last, stableSince := 0, time.Now()
	for time.Now().Before(deadline) {
		n := countUID(uid)
		if n > r.ForkBombMax {
			r.ForkBombMax = n
		}
		if n != last {
			last, stableSince = n, time.Now()
		} else if n > 0 && time.Since(stableSince) > 3*time.Second {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Printf("RIG: fork bomb: at most %d processes of lane-1 (pids limit %d)\n", r.ForkBombMax, pidsMax)
	t0 := time.Now()
	so, err := run(bin, "stop", "lane-1")
	r.StopSeconds = time.Since(t0).Seconds()
	r.StopOutput = strings.TrimSpace(string(so))
	if err != nil {
		s.errf("stop lane-1: %v: %s", err, so)
	}
	bomb.Wait()
	r.LeftAfterStop = countUID(uid)
	fmt.Printf("RIG: stop lane-1 (%.2f s): %s; %d left\n", r.StopSeconds, r.StopOutput, r.LeftAfterStop)
}

// trial starts a trial on a fresh copy of the example project, runs a
// command in it and ends it; it says whether all three worked.
func (s *rigScenario) trial() bool {
	out, err := run(bin, "trial", "start", "--lane", "1", "--project", "/opt/thermite/examples/projects/sum", "--json")
	var tr struct {
		ID string `json:"id"`
	}
	if err != nil || json.Unmarshal(out, &tr) != nil || tr.ID == "" {
		s.errf("trial start: %v: %s", err, out)
		s.r.Trial = "start failed"
		return false
	}
	if out, err := run(bin, "trial", "exec", tr.ID, "--", "ls"); err != nil {
		s.errf("trial exec: %v: %s", err, out)
		s.r.Trial = "exec failed"
		return false
	}
	if out, err := run(bin, "trial", "end", tr.ID); err != nil {
		s.errf("trial end: %v: %s", err, out)
		s.r.Trial = "end failed"
		return false
	}
	s.r.Trial = "ok"
	fmt.Printf("RIG: trial %s: started, ran a command, ended\n", tr.ID)
	return true
}

// stopBench times the lane's stop with the role's cgroup, then with
// cgroups off (the rig started again); it says whether the second start
// was ready.
func (s *rigScenario) stopBench(uid int) bool {
	r := s.r
	r.StopCgroupMS = stopTimes(uid, s.errf)
	s.broker.Process.Signal(unix.SIGTERM)
	s.broker.Wait()
	os.WriteFile(cfgPath, []byte(strings.Replace(s.base, "enabled = true", "enabled = false", 1)), 0o644)
	var state string
	if s.broker, state = startBroker(); state != "ready" {
		s.errf("start with cgroups off: %s", state)
		return false
	}
	r.StopHelperMS = stopTimes(uid, s.errf)
	fmt.Printf("RIG: stop of 50 sleepers: with the role's cgroup %v ms, the helper alone %v ms\n", r.StopCgroupMS, r.StopHelperMS)
	return true
}

// stopTimes times `thermite stop lane-1` of 50 sleeping processes, 5 times.
func stopTimes(uid int, errf func(string, ...any)) []float64 {
	var out []float64
	for range 5 {
		c := exec.Command(bin, "run-as", "lane-1", "--", "/bin/sh", "-c",
			"exec >/dev/null 2>&1 </dev/null; i=0; while [ $i -lt 50 ]; do setsid sleep 600 & i=$((i+1)); done")
		c.Start()
		deadline := time.Now().Add(30 * time.Second)
		for countUID(uid) < 50 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		c.Wait()
		if n := countUID(uid); n < 50 {
			errf("only %d sleepers started", n)
			return out
		}
		t0 := time.Now()
		if o, err := run(bin, "stop", "lane-1"); err != nil {
			errf("stop: %v: %s", err, o)
		}
		out = append(out, float64(time.Since(t0).Microseconds())/1000)
		if n := countUID(uid); n != 0 {
			errf("%d left after stop", n)
		}
	}
	return out
}

// startBroker starts `thermite serve` and waits until it is ready or has
// exited; a refused start returns its last log line.
func startBroker() (*exec.Cmd, string) {
	logf, _ := os.Create("/tmp/broker.log")
	cmd := exec.Command(bin, "serve")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err.Error()
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return nil, refusal()
		default:
		}
		if _, err := run(bin, "status"); err == nil {
			return cmd, "ready"
		}
		time.Sleep(200 * time.Millisecond)
	}
	cmd.Process.Kill()
	<-exited
	return nil, "not ready in 3 minutes: " + refusal()
}

// refusal is the broker's refusal from its log: the line that says why.
func refusal() string {
	data, _ := os.ReadFile("/tmp/broker.log")
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], "host:") || strings.Contains(lines[i], "refus") {
			return strings.TrimSpace(lines[i])
		}
	}
	if len(lines) > 0 {
		return strings.TrimSpace(lines[len(lines)-1])
	}
	return "exited with no log"
}

func run(name string, args ...string) ([]byte, error) {
	return exec.Command(name, args...).CombinedOutput()
}

func laneUID() int {
	data, _ := os.ReadFile("/etc/passwd")
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Split(l, ":")
		if len(f) > 2 && f[0] == "lane-1" {
			n, _ := strconv.Atoi(f[2])
			return n
		}
	}
	return -1
}

// countUID counts the processes whose real uid is uid.
func countUID(uid int) int {
	ents, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(filepath.Join("/proc", e.Name()), &st) == nil && int(st.Uid) == uid {
			n++
		}
	}
	return n
}

func membomb(arg string) int {
	mb, _ := strconv.Atoi(arg)
	var keep [][]byte
	for i := 0; i < mb; i++ {
		b := make([]byte, 1<<20)
		for j := 0; j < len(b); j += 4096 {
			b[j] = 1
		}
		keep = append(keep, b)
	}
	fmt.Printf("allocated %d MiB\n", len(keep))
	return 0
}

// loopbackUp sets IFF_UP on lo: the harness API listens on 127.0.0.1.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var ifr [40]byte
	copy(ifr[:], "lo")
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCGIFFLAGS, uintptr(unsafe.Pointer(&ifr[0]))); e != 0 {
		return e
	}
	*(*uint16)(unsafe.Pointer(&ifr[16])) |= unix.IFF_UP
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCSIFFLAGS, uintptr(unsafe.Pointer(&ifr[0]))); e != 0 {
		return e
	}
	return nil
}

// mountAll mounts what the rig expects but the cgroup tree.
func mountAll() {
	vminit.MountAll([]vminit.FS{
		{Dir: "/proc", Type: "proc"}, {Dir: "/sys", Type: "sysfs"}, {Dir: "/dev", Type: "devtmpfs"}, {Dir: "/tmp", Type: "tmpfs"}, {Dir: "/run", Type: "tmpfs"}, {Dir: "/dev/shm", Type: "tmpfs"}, {Dir: "/var/tmp", Type: "tmpfs"},
	}, []string{"/tmp", "/var/tmp", "/dev/shm"})
}

// mountCgroup mounts cgroup2, read-only where asked, as an unprivileged
// container gets it.
func mountCgroup(ro bool) {
	var flags uintptr
	if ro {
		flags = unix.MS_RDONLY
	}
	if err := unix.Mount("cgroup2", "/sys/fs/cgroup", "cgroup2", flags, ""); err != nil {
		fmt.Printf("THERMITE-VM: mount /sys/fs/cgroup: %v\n", err)
	}
}
