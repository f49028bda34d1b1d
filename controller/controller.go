// Package controller is the unprivileged daemon, user thermite: it holds
// the rig's secrets, the ledger, the judge and the harness API, and asks
// the broker for everything it does as another user.
package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/config"
	"thermite/internal/rpc"
	"thermite/roles"
)

// Controller is the running daemon.
type Controller struct {
	cfg     config.Config
	table   *roles.Table
	log     *slog.Logger
	secrets map[string]string
	broker  string
}

// Main runs the controller as the broker starts it: its bootstrap on
// descriptor 3, logs as JSON on stderr.
func Main() error {
	// Not dumpable: no other process, not even one of the controller's own
	// user such as a kit's check, may read its memory and so its secrets.
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("proc", "controller")
	boot := os.NewFile(rpc.BootstrapFD, "bootstrap")
	data, err := io.ReadAll(io.LimitReader(boot, 16<<20))
	boot.Close()
	if err != nil {
		return fmt.Errorf("controller: bootstrap: %w", err)
	}
	var b rpc.Bootstrap
	if err := json.Unmarshal(data, &b); err != nil {
		return fmt.Errorf("controller: bootstrap: %w", err)
	}
	var cfg config.Config
	if err := json.Unmarshal(b.Config, &cfg); err != nil {
		return fmt.Errorf("controller: bootstrap config: %w", err)
	}
	table, err := roles.FromConfig(cfg)
	if err != nil {
		return err
	}
	c := &Controller{cfg: cfg, table: table, log: log, secrets: b.Secrets, broker: cfg.BrokerSocket()}
	return c.serve()
}

func (c *Controller) serve() error {
	if _, err := rpc.Call(c.broker, &rpc.Request{Op: rpc.OpPing}); err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	path := c.cfg.ControllerSocket()
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("controller: %w", err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+rpc.ControllerPing, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"ok": true, "pid": os.Getpid(), "secrets": len(c.secrets)})
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, unix.SIGTERM, unix.SIGINT)
		<-sig
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()
	c.log.Info("controller serving", "socket", path, "pid", os.Getpid(), "secrets", len(c.secrets))
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("controller: %w", err)
	}
	return nil
}
