package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/rpc"
	"thermite/internal/spawn"
)

// ctlState is the controller daemon's supervision.
type ctlState struct {
	pid    int // the running controller's, 0 when none; under b.mu
	starts int // how many times it was started; under b.mu
	// keyPath and keySHA are control's key, when the launch names one.
	keyPath, keySHA string
}

// ControllerArg is the hidden subcommand the controller runs as.
const ControllerArg = "__controller"

// startController starts `thermite __controller` as the controller's user
// through spawn.Start, as every role command, confined as confineController decides (its rule set,
// its filter, its cgroup, no_new_privs and no capability), and hands it
// the configuration and the secrets on a pipe.
func (b *Broker) startController() (int, int, <-chan exit, error) {
	bootR, bootW, err := os.Pipe()
	if err != nil {
		return 0, -1, nil, err
	}
	defer bootR.Close()
	defer bootW.Close()
	c, err := b.confineController([]string{b.exe, ControllerArg}, [3]*os.File{b.devnull, os.Stderr, os.Stderr})
	if err != nil {
		return 0, -1, nil, err
	}
	defer c.release()
	c.slots = []spawn.Slot{{Name: "bootstrap", FD: rpc.BootstrapFD, File: bootR}}
	apiAddr := ""
	if b.listeners.api != nil {
		lf, err := b.listeners.api.File()
		if err != nil {
			return 0, -1, nil, fmt.Errorf("controller: api listener: %w", err)
		}
		defer lf.Close()
		c.slots = append(c.slots, spawn.Slot{Name: "api-tcp", FD: rpc.APIListenerFD, File: lf})
		apiAddr = b.listeners.api.Addr().String()
	}
	egressSlots, egress := b.egressListeners()
	c.slots = append(c.slots, egressSlots...)
	ch, err := b.startCommand(c)
	if err != nil {
		return 0, -1, nil, fmt.Errorf("controller: start: %w", err)
	}
	if ch.execErr != "" {
		<-ch.exited
		ch.close()
		return 0, -1, nil, fmt.Errorf("controller: start: %s", ch.execErr)
	}
	bootR.Close()
	cfg, _ := json.Marshal(b.cfg)
	boot, _ := json.Marshal(rpc.Bootstrap{Config: cfg, Secrets: b.secrets, BrokerPID: os.Getpid(), APITCP: apiAddr, Egress: egress})
	if _, err := bootW.Write(boot); err != nil {
		unix.PidfdSendSignal(ch.pidfd, unix.SIGKILL, nil, 0)
		<-ch.exited
		ch.close()
		return 0, -1, nil, fmt.Errorf("controller: bootstrap: %w", err)
	}
	return ch.pid, ch.pidfd, ch.exited, nil
}

// superviseController keeps the controller running. When it exits, every
// role's processes are stopped before it starts again, with backoff. When
// the broker stops, it gets SIGTERM, then SIGKILL after 5 s.
func (b *Broker) superviseController() {
	backoff := time.Second
	for {
		pid, pidfd, exited, err := b.startController()
		if err != nil {
			b.log.Error("controller did not start", "err", err)
		} else {
			b.mu.Lock()
			b.ctl.pid = pid
			b.ctl.starts++
			b.mu.Unlock()
			b.log.Info("controller started", "pid", pid)
			began := time.Now()
			var e exit
			select {
			case e = <-exited:
			case <-b.life.stopCh:
				e = stopGently(pidfd, exited)
			}
			unix.Close(pidfd)
			b.mu.Lock()
			b.ctl.pid = 0
			b.mu.Unlock()
			b.log.Info("controller exited", "pid", pid, "status", describe(e.ws))
			if time.Since(began) > time.Minute {
				backoff = time.Second
			}
		}
		// Nothing a role runs outlives the controller that asked for it.
		if err := b.stopAllRoles(); err != nil {
			b.log.Error("stop roles after controller exit", "err", err)
		}
		if b.life.stopping.Load() {
			return
		}
		select {
		case <-time.After(backoff):
		case <-b.life.stopCh:
			return
		}
		if backoff < 30*time.Second {
			backoff *= 2
		}
	}
}

// stopGently ends the controller with SIGTERM, then SIGKILL after 5 s.
func stopGently(pidfd int, exited <-chan exit) exit {
	unix.PidfdSendSignal(pidfd, unix.SIGTERM, nil, 0)
	select {
	case e := <-exited:
		return e
	case <-time.After(5 * time.Second):
		unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
		return <-exited
	}
}

// pingController asks the controller's socket whether it answers.
func pingController(socket string) error {
	c := &http.Client{
		Timeout: time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}},
	}
	resp, err := c.Get("http://controller" + rpc.ControllerPing)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("controller ping: %s", resp.Status)
	}
	return nil
}
