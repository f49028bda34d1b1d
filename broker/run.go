package broker

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/confined"
	"thermite/internal/rpc"
	"thermite/roles"
)

// Run runs one command as a role for a caller on c, and answers how it
// ended. The caller going away cancels the command.
func (b *Broker) Run(c *rpc.Conn, req *rpc.RunRequest, files []*os.File) (*rpc.RunResult, error) {
	if len(files) != 0 && len(files) != 3 {
		return nil, fmt.Errorf("run: %d descriptors: give stdin, stdout and stderr, or none", len(files))
	}
	cmd, timeout, err := b.prepareRun(req, files)
	if err != nil {
		return nil, fmt.Errorf("run: %w", err)
	}
	defer cmd.release()
	cancel := make(chan struct{})
	go func() {
		// The caller sends nothing more during a Run: a read returns only
		// when it goes away, and then the command goes too. After the Run
		// the handler closes the connection, which ends this read.
		var extra rpc.Request
		files, _ := c.Recv(&extra)
		for _, f := range files {
			f.Close()
		}
		close(cancel)
	}()
	return b.execute(cmd, timeout, cancel)
}

// prepareRun checks a request and turns it into a command: the role, its
// environment, limits, CPUs, fence and working folder. Every command of a
// role, the self-test's probes included, is made here.
func (b *Broker) prepareRun(req *rpc.RunRequest, stdio []*os.File) (*command, time.Duration, error) {
	r, err := b.role(req.Role)
	if err != nil {
		return nil, 0, err
	}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return nil, 0, fmt.Errorf("argv is empty")
	}
	for _, a := range req.Argv {
		if strings.ContainsRune(a, 0) {
			return nil, 0, fmt.Errorf("argv holds a NUL byte")
		}
	}
	cmd := &command{role: r, argv: req.Argv, groups: r.Groups}
	if len(stdio) == 3 {
		copy(cmd.stdio[:], stdio)
	} else {
		cmd.stdio = [3]*os.File{b.devnull, b.devnull, b.devnull}
	}
	home, err := b.HomeFor(r, req.Home)
	if err != nil {
		return nil, 0, err
	}
	if cmd.env, err = b.EnvFor(r, home, req.Env); err != nil {
		return nil, 0, err
	}
	rl, timeout, err := b.LimitsFor(req.Limits)
	if err != nil {
		return nil, 0, err
	}
	if req.NoTimeout {
		if r.Kind != roles.Lane && r.Kind != roles.Agent {
			return nil, 0, fmt.Errorf("no_timeout: only a lane's or an agent's helper may run without a timeout, not %s", r.Name)
		}
		timeout = 100 * 365 * 24 * time.Hour
	}
	cmd.rlimits = rl
	if cmd.cpus, err = b.CPUsFor(r, req.CPUs); err != nil {
		return nil, 0, err
	}
	netns, egressPort, err := b.egressFor(r, req.Egress)
	if err != nil {
		return nil, 0, err
	}
	conf, err := b.ConfineFor(r, req.Argv, req.GPUs, home, egressPort)
	if err != nil {
		return nil, 0, err
	}
	cmd.netns = netns
	cmd.landlock, cmd.unland, cmd.groups, cmd.seccomp = conf.ruleSet, conf.release, conf.groups, conf.seccomp
	cmd.env = append(cmd.env, conf.env...)
	if cmd.cgroup, err = b.groupFor(r); err != nil {
		cmd.release()
		return nil, 0, err
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = home
	}
	if cmd.cwd, err = confined.Open(b.cfg.ScratchDir(), cwd, unix.O_PATH|unix.O_DIRECTORY); err != nil {
		cmd.release()
		return nil, 0, fmt.Errorf("cwd %w", err)
	}
	if r.Kind == roles.Timing {
		if cmd.unhold, cmd.cardStops, err = b.hold(r, cmd.cpus, req.GPUs); err != nil {
			cmd.release()
			return nil, 0, err
		}
	}
	return cmd, timeout, nil
}

// HomeFor is a command's HOME: the role's own folder in scratch, or a
// folder in scratch/trials that the role's user owns.
func (b *Broker) HomeFor(r roles.Role, requested string) (string, error) {
	if requested == "" {
		return b.homeOf(r), nil
	}
	trials := filepath.Join(b.cfg.ScratchDir(), "trials")
	f, err := confined.Open(trials, requested, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW)
	if err != nil {
		return "", fmt.Errorf("home %w", err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return "", fmt.Errorf("home %s: %w", requested, err)
	}
	if int(st.Uid) != r.UID {
		return "", fmt.Errorf("home %s: owned by uid %d, not %s", requested, st.Uid, r.Name)
	}
	return requested, nil
}

// execute runs a prepared command and cleans up after it: for every role
// but a lane (and the controller), whatever its user still runs is stopped;
// for every role, set-id bits go from the folders it owns in scratch.
func (b *Broker) execute(cmd *command, timeout time.Duration, cancel <-chan struct{}) (*rpc.RunResult, error) {
	r := cmd.role
	// A role whose leftovers are stopped after each command runs one
	// command at a time, so one command's cleanup never kills another's.
	if r.StopsAfterEachCommand() {
		lk := b.userLock(r.UID)
		lk.Lock()
		defer lk.Unlock()
	}
	res, runErr := b.runCommand(cmd, timeout, b.cancelOr(cancel))
	if res != nil {
		if r.StopsAfterEachCommand() {
			n, err := b.StopUser(r)
			if err != nil {
				return res, fmt.Errorf("run: cleanup: %w", err)
			}
			res.Leftovers = n
		}
		res.SetID = b.ClearSetID(r)
	}
	return res, runErr
}
