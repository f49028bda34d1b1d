package broker

import (
	"bytes"
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
	"thermite/internal/procs"
	"thermite/internal/rpc"
	"thermite/roles"
)

// SelftestFunc runs the isolation self-test against this broker. The
// command wires the selftest package in, so that the broker does not
// import it: the self-test sees the broker only through its Host methods.
type SelftestFunc func() *rpc.SelftestResult

// SetSelftest installs the self-test.
func (b *Broker) SetSelftest(f SelftestFunc) { b.selftestFn = f }

// Selftest runs the isolation self-test. It refuses a busy rig unless
// forced, because each probe stops its role's processes. A running
// controller is stopped cleanly first (the probe as its user would end it
// anyway) and started again once the self-test is done; the result says so.
func (b *Broker) Selftest(force, startup bool) (*rpc.SelftestResult, error) {
	if b.selftestFn == nil {
		return nil, fmt.Errorf("selftest: this broker has no self-test")
	}
	res, bounced, err := b.selftestLocked(force, startup)
	if err != nil {
		return nil, err
	}
	if bounced {
		if err := b.waitController(20 * time.Second); err != nil {
			res.Controller += "; " + err.Error()
		}
	}
	return res, nil
}

func (b *Broker) selftestLocked(force, startup bool) (*rpc.SelftestResult, bool, error) {
	b.selftestMu.Lock()
	defer b.selftestMu.Unlock()
	if !force {
		if why := b.busy(); why != "" {
			return nil, false, fmt.Errorf("selftest: the rig is busy: %s (--force runs it anyway: each probe stops its role's processes)", why)
		}
	}
	bounced := false
	if !startup && b.ControllerPID() != 0 {
		if err := b.stopControllerForSelftest(10 * time.Second); err != nil {
			return nil, false, fmt.Errorf("selftest: %w", err)
		}
		bounced = true
	}
	res := b.selftestFn()
	res.Background = startup
	if bounced {
		res.Controller = "the controller was stopped for the self-test and is started again"
	}
	b.mu.Lock()
	b.selftest = res
	b.mu.Unlock()
	b.log.Info("isolation self-test", "holds", res.Holds, "sentence", res.Sentence, "wall_ms", res.WallMS, "controller", res.Controller)
	return res, bounced, nil
}

// stopControllerForSelftest asks the supervisor to stop the controller
// cleanly and waits until it is gone. The supervisor starts it again only
// once the self-test lets go of selftestMu.
func (b *Broker) stopControllerForSelftest(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for asked := false; !asked && b.ControllerPID() != 0; {
		select {
		case b.ctlBounce <- struct{}{}:
			asked = true
		case <-time.After(10 * time.Millisecond):
			// It may have exited on its own meanwhile.
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the controller's supervisor did not take the stop request in %s", limit)
		}
	}
	for b.ControllerPID() != 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("the controller did not stop in %s", limit)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// waitController waits until a controller answers again.
func (b *Broker) waitController(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for pingController(b.cfg.ControllerSocket()) != nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("the controller did not answer again within %s", limit)
		}
		time.Sleep(25 * time.Millisecond)
	}
	return nil
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
	return b.ctlPID
}

// SecretValues are the secrets the broker read.
func (b *Broker) SecretValues() map[string]string { return b.secrets }

// EnvAllowed names every variable a role's command may have when its
// request asks for none: the broker's five and the fence's.
func (b *Broker) EnvAllowed() []string {
	return []string{"HOME", "TMPDIR", "PATH", "USER", "LOGNAME", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"}
}

// LandlockABI is the kernel's Landlock ABI, 0 without Landlock.
func (b *Broker) LandlockABI() int { return landlockABI() }

// RunProbe runs `thermite __probe` as a role through exactly the path a
// real command of that role takes (prepareRun, then execute), with the
// plan on stdin, and returns what it wrote.
func (b *Broker) RunProbe(r roles.Role, gpus []int, stdin []byte) ([]byte, []byte, *rpc.RunResult, error) {
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
	req := &rpc.RunRequest{Role: r.Name, Argv: []string{"/proc/self/exe", "__probe"}, GPUs: gpus}
	cmd, timeout, err := b.prepareRun(req, []*os.File{inR, outW, errW})
	if err != nil {
		for _, f := range []*os.File{inR, inW, outR, outW, errR, errW} {
			f.Close()
		}
		return nil, nil, nil, err
	}
	defer cmd.release()
	var wg sync.WaitGroup
	var stdout, stderr bytes.Buffer
	wg.Add(3)
	go func() { defer wg.Done(); inW.Write(stdin); inW.Close() }()
	go func() { defer wg.Done(); io.Copy(&stdout, io.LimitReader(outR, 8<<20)); outR.Close() }()
	go func() { defer wg.Done(); io.Copy(&stderr, io.LimitReader(errR, 1<<20)); errR.Close() }()
	res, runErr := b.execute(cmd, timeout, nil)
	inR.Close()
	outW.Close()
	errW.Close()
	wg.Wait()
	return stdout.Bytes(), stderr.Bytes(), res, runErr
}

// StartCanary starts a long-lived process as a role through the ordinary
// spawn path, for probes to aim at. stop ends it.
func (b *Broker) StartCanary(r roles.Role) (int, func(), error) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return 0, nil, err
	}
	req := &rpc.RunRequest{Role: r.Name, Argv: []string{"/proc/self/exe", "__probe", "canary"}}
	cmd, _, err := b.prepareRun(req, []*os.File{inR, b.devnull, b.devnull})
	if err != nil {
		inR.Close()
		inW.Close()
		return 0, nil, err
	}
	ch, err := b.startShim(cmd, b.execSpec(cmd))
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
	stop := func() {
		inW.Close()
		unix.PidfdSendSignal(ch.pidfd, unix.SIGKILL, nil, 0)
		<-ch.exited
		ch.close()
	}
	return ch.pid, stop, nil
}

// APIPort is the harness API's TCP port, 0 without one.
func (b *Broker) APIPort() int { return b.apiPort }

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
