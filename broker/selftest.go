package broker

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/config"
	"thermite/internal/confined"
	"thermite/internal/procs"
	"thermite/internal/rpc"
	"thermite/roles"
)

// selftestState is the self-test's: its last result, the function that
// runs it, and the lock that runs one at a time.
type selftestState struct {
	result *rpc.SelftestResult
	fn     SelftestFunc
	mu     sync.Mutex
}

// SelftestFunc runs the isolation self-test against this broker. The
// command wires the selftest package in, so that the broker does not
// import it: the self-test sees the broker only through its Host methods.
type SelftestFunc func() *rpc.SelftestResult

// SetSelftest installs the self-test.
func (b *Broker) SetSelftest(f SelftestFunc) { b.self.fn = f }

// Selftest runs the isolation self-test. It refuses a busy rig unless
// forced, because each probe stops its role's processes. The controller's
// user is the one it leaves running: its probe stops nothing (StopUser
// refuses that user while a controller runs), so a self-test on a live rig
// keeps the controller, and the result says so.
func (b *Broker) Selftest(force, startup bool) (*rpc.SelftestResult, error) {
	if b.self.fn == nil {
		return nil, fmt.Errorf("selftest: this broker has no self-test")
	}
	b.self.mu.Lock()
	defer b.self.mu.Unlock()
	if !force {
		if why := b.busy(); why != "" {
			return nil, fmt.Errorf("selftest: the rig is busy: %s (--force runs it anyway: each probe stops its role's processes)", why)
		}
	}
	ctl := b.ControllerPID()
	res := b.self.fn()
	res.Background = startup
	if ctl != 0 {
		res.Controller = fmt.Sprintf("the controller (pid %d) was left running: the probe as its user stops nothing", ctl)
	}
	b.mu.Lock()
	b.self.result = res
	b.mu.Unlock()
	b.log.Info("isolation self-test", "holds", res.Holds, "sentence", res.Sentence, "wall_ms", res.WallMS, "controller", res.Controller)
	return res, nil
}

// busy says what makes the rig busy: a role's user with processes (the
// controller's own user aside), or a folder handed to a lane for a trial.
func (b *Broker) busy() string {
	counts, _ := procs.CountByUID("/proc", b.uidSet())
	var busy []string
	for _, r := range b.table.Roles {
		if r.Kind == roles.Controller {
			continue
		}
		if n := len(counts[r.UID]); n > 0 {
			busy = append(busy, fmt.Sprintf("%s runs %d processes", r.Name, n))
		}
	}
	b.mu.Lock()
	for uid, m := range b.handed {
		r, _ := b.table.ByUID(uid)
		for p := range m {
			if r.Kind == roles.Lane && strings.HasPrefix(p, b.cfg.ScratchDir()+"/trials/") {
				busy = append(busy, fmt.Sprintf("%s holds a trial (%s)", r.Name, p))
			}
		}
	}
	b.mu.Unlock()
	sort.Strings(busy)
	return strings.Join(busy, ", ")
}

// startupSelftest runs the self-test before the controller starts, while
// nothing else runs. When isolation does not hold the broker refuses to
// start the controller, unless startup_selftest is "warn".
func (b *Broker) startupSelftest() error {
	res, err := b.Selftest(true, true)
	if err != nil {
		return err
	}
	if !res.Holds {
		if b.cfg.StartupSelftest == "warn" {
			b.log.Warn("isolation does not hold; starting anyway (startup_selftest = warn)", "sentence", res.Sentence)
			return nil
		}
		return fmt.Errorf("selftest: %s (startup_selftest = refuse)", res.Sentence)
	}
	return nil
}

// The self-test's view of the broker (selftest.Host).

// Config is the rig's configuration.
func (b *Broker) Config() config.Config { return b.cfg }

// Table is the role table.
func (b *Broker) Table() *roles.Table { return b.table }

// BrokerPID is this process.
func (b *Broker) BrokerPID() int { return os.Getpid() }

// ControllerPID is the running controller, or 0.
func (b *Broker) ControllerPID() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ctl.pid
}

// SecretValues are the secrets the broker read.
func (b *Broker) SecretValues() map[string]string { return b.secrets }

// EnvAllowed names every variable a role's command may have when its
// request asks for none: the broker's five and the fence's.
func (b *Broker) EnvAllowed() []string {
	return append([]string{"PATH"}, fixedEnv...)
}

// LandlockABI is the kernel's Landlock ABI, 0 without Landlock.
func (b *Broker) LandlockABI() int { return landlockABI() }

// RunProbe runs `thermite __probe` as a role through exactly the path a
// real command of that role takes (prepareRun, then execute), with the
// plan on stdin, and returns what it wrote.
func (b *Broker) RunProbe(r roles.Role, gpus []int, stdin []byte) ([]byte, []byte, *rpc.RunResult, error) {
	return b.runProbe(r, gpus, stdin, false)
}

// RunEgressProbe is RunProbe in the role's egress mode, as the lane
// harness runs an agent program (rpc.RunRequest.Egress).
func (b *Broker) RunEgressProbe(r roles.Role, gpus []int, stdin []byte) ([]byte, []byte, *rpc.RunResult, error) {
	return b.runProbe(r, gpus, stdin, true)
}

func (b *Broker) runProbe(r roles.Role, gpus []int, stdin []byte, egress bool) ([]byte, []byte, *rpc.RunResult, error) {
	return probeWith(stdin, func(stdio []*os.File) (*rpc.RunResult, error) {
		req := &rpc.RunRequest{Role: r.Name, Argv: []string{ownExe, "__probe"}, GPUs: gpus, Egress: egress}
		cmd, timeout, err := b.prepareRun(req, stdio)
		if err != nil {
			return nil, err
		}
		defer cmd.release()
		return b.execute(cmd, timeout, nil)
	})
}

// RunControllerProbe runs `thermite __probe` confined exactly as the
// controller daemon is (confineController: its rule set, its filter, its
// cgroup), with the plan on stdin, and returns what it wrote.
func (b *Broker) RunControllerProbe(stdin []byte) ([]byte, []byte, *rpc.RunResult, error) {
	return probeWith(stdin, func(stdio []*os.File) (*rpc.RunResult, error) {
		cmd, err := b.confineController([]string{ownExe, "__probe"}, [3]*os.File{stdio[0], stdio[1], stdio[2]})
		if err != nil {
			return nil, err
		}
		defer cmd.release()
		return b.runCommand(cmd, time.Minute, nil)
	})
}

// probeWith gives run a probe's stdin, stdout and stderr, feeds it stdin
// and collects what it writes.
func probeWith(stdin []byte, run func(stdio []*os.File) (*rpc.RunResult, error)) ([]byte, []byte, *rpc.RunResult, error) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, nil, nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, nil, nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		outR.Close()
		outW.Close()
		return nil, nil, nil, err
	}
	var wg sync.WaitGroup
	var stdout, stderr bytes.Buffer
	wg.Add(3)
	go func() { defer wg.Done(); inW.Write(stdin); inW.Close() }()
	go func() { defer wg.Done(); io.Copy(&stdout, io.LimitReader(outR, 8<<20)); outR.Close() }()
	go func() { defer wg.Done(); io.Copy(&stderr, io.LimitReader(errR, 1<<20)); errR.Close() }()
	res, runErr := run([]*os.File{inR, outW, errW})
	inR.Close()
	outW.Close()
	errW.Close()
	wg.Wait()
	return stdout.Bytes(), stderr.Bytes(), res, runErr
}

// StartCanary starts a long-lived process as a role through the ordinary
// spawn path, for probes to aim at. stop ends it.
func (b *Broker) StartCanary(r roles.Role, gpus []int) (int, func(), error) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return 0, nil, err
	}
	req := &rpc.RunRequest{Role: r.Name, Argv: []string{ownExe, "__probe", "canary"}, GPUs: gpus}
	cmd, _, err := b.prepareRun(req, []*os.File{inR, b.devnull, b.devnull})
	if err != nil {
		inR.Close()
		inW.Close()
		return 0, nil, err
	}
	ch, err := b.startCommand(cmd)
	cmd.release()
	inR.Close()
	if err != nil {
		inW.Close()
		return 0, nil, err
	}
	if ch.execErr != "" {
		<-ch.exited
		ch.close()
		inW.Close()
		return 0, nil, fmt.Errorf("canary as %s: %s", r.Name, ch.execErr)
	}
	b.mu.Lock()
	b.measure.ownExec[ch.pid] = true
	b.mu.Unlock()
	stop := func() {
		inW.Close()
		unix.PidfdSendSignal(ch.pidfd, unix.SIGKILL, nil, 0)
		<-ch.exited
		b.mu.Lock()
		delete(b.measure.ownExec, ch.pid)
		b.mu.Unlock()
		ch.close()
	}
	return ch.pid, stop, nil
}

// APIPort is the harness API's TCP port, 0 without one.
func (b *Broker) APIPort() int { return b.listeners.apiPort }

// CgroupOf is the end of a role's cgroup path ("<parent>/<role>") as
// /proc/<pid>/cgroup shows it, or "" without cgroups.
func (b *Broker) CgroupOf(r roles.Role) string {
	g, err := b.groupFor(r)
	if err != nil || g == nil {
		return ""
	}
	p := g.Path()
	return filepath.Base(filepath.Dir(p)) + "/" + filepath.Base(p)
}

// CgroupStatus says where role commands' cgroups are, or why there are none.
func (b *Broker) CgroupStatus() string { return b.cgroupStatus() }

// CPUWeights are the CPU weights the kernel holds for the rig's groups
// made so far, by group (a role's name, or the controller daemon's
// group), and whether the weights are on, and what they are, or "off:
// <why>".
func (b *Broker) CPUWeights() (map[string]int64, string, error) {
	w, err := b.cpuWeights()
	return w, b.cpuWeightsStatus(), err
}

// HoldAsTimedRun holds a timing user's judge CPUs and cards exactly as a
// timed run's command does (prepareRun's hold), for the self-test's Held
// rows.
func (b *Broker) HoldAsTimedRun(r roles.Role, cards []int) (string, func(), error) {
	if r.Kind != roles.Timing {
		return "", nil, fmt.Errorf("hold: %s is not a timing user", r.Name)
	}
	if _, err := b.groupFor(r); err != nil {
		return "", nil, err
	}
	now := b.snapshot()
	cpus, err := planCPUs(&b.cfg, r, "", now)
	if err != nil {
		return "", nil, err
	}
	advisory, err := timedRunHold(&b.cfg, now)
	if err != nil {
		return "", nil, fmt.Errorf("judge CPUs %s: %w", cpus, err)
	}
	release, _, err := b.hold(r, &Hold{CPUs: cpus, Cards: cards, Advisory: advisory})
	if err != nil {
		return "", nil, err
	}
	return cpus.String(), release, nil
}

// JudgeCPUsWhy says why judge CPUs cannot be held in the kernel here, ""
// when they can.
func (b *Broker) JudgeCPUsWhy() string {
	// Held in the kernel, or by affinity alone with the loss accepted:
	// the rows run, and record the loss as accepted where they fail.
	if _, err := timedRunHold(&b.cfg, &Snapshot{Kernel: b.kernel, Weakened: weakenedNow()}); err != nil {
		return err.Error()
	}
	return ""
}

// ControllerCgroup is the controller daemon's cgroup: the end of its path
// ("<parent>/controller.daemon") as /proc/<pid>/cgroup shows it, its
// folders, and the limits it must have; "" without cgroups.
func (b *Broker) ControllerCgroup() (tail string, dirs []string, memoryBytes, pids int64) {
	g, err := b.controllerGroupFor()
	if err != nil || g == nil {
		return "", nil, 0, 0
	}
	p := g.Path()
	return filepath.Base(filepath.Dir(p)) + "/" + filepath.Base(p), g.Paths(), b.cfg.Cgroup.ControllerMemoryMB << 20, b.cfg.Cgroup.ControllerPids
}

// MeasureDisk is the role's disk check as a trial's runs it (DiskUsage,
// less what its processes hold unlinked) and a full walk of the same
// folders, for the self-test's disk row.
func (b *Broker) MeasureDisk(r roles.Role) (counted, walked int64, err error) {
	u, err := b.DiskUsage(r, false)
	if err != nil {
		return 0, 0, err
	}
	var errs []error
	b.eachOwnedFolder(r, func(top *os.File) {
		n, _, err := confined.Usage(top)
		walked += n
		if err != nil {
			errs = append(errs, err)
		}
	}, func(err error) { errs = append(errs, err) })
	return u.Bytes - u.Unlinked, walked, errors.Join(errs...)
}
