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
	"path/filepath"
	"sync"
	"thermite/internal/peercred"
	"time"

	"golang.org/x/sys/unix"

	"thermite/controller/fetch"
	"thermite/controller/ledger"
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
	broker  *brokerClient
	ledger  *ledger.Ledger
	fetcher *fetch.Fetcher
	devnull *os.File
	// conns and bodies are the API's budgets of connections and of body
	// bytes held at once.
	conns  *connBudget
	bodies *byteBudget
	// runs are the commands each lane runs through the API at once.
	runs laneRuns
	// rates are each lane's and agent's request rate, by role (rates.go).
	rates map[string]*requestRate

	mu      sync.Mutex
	pruneMu sync.Mutex // one prune of ended trials at a time
	// ending are the trials whose end is under way (recorded, its roles
	// not yet stopped or its folder not yet retired): a prune passes them
	// over (c.mu).
	ending map[string]bool
	trials map[string]*trialRT
	// laneRuns are the running lane harness runs' tokens, by their hash
	// (ledger.HashToken), each its trial's (grantLaneRun; c.mu).
	laneRuns map[string]*trialRT
	apiAddr  string // the harness API's TCP address, once it listens
	apiTCP   string // the address of the listener the broker handed over
	// egressL are the egress proxy's listeners in the agents' network
	// namespaces, as the broker handed them over (egress.go).
	egressL []rpc.EgressListener
	lastST  string // the time of the last self-test recorded
	// newEvent rings at every event recorded (events.go).
	newEvent eventBell
}

// Main runs the controller as the broker starts it: its bootstrap on
// rpc.BootstrapFD, logs as JSON on stderr.
func Main() error {
	// Not dumpable: no other process, not even one of the controller's own
	// user such as a kit's check, may read its memory and so its secrets.
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	// The broker's umask is 077; the research folder the controller writes
	// is for every lane to read, and each mode below is given explicitly.
	unix.Umask(0o022)
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
	c := &Controller{
		cfg: cfg, table: table, log: log, secrets: b.Secrets, apiTCP: b.APITCP, egressL: b.Egress,
		broker:  &brokerClient{socket: cfg.BrokerSocket()},
		trials:  map[string]*trialRT{},
		fetcher: &fetch.Fetcher{MaxBytes: cfg.API.FetchMaxBytes, Timeout: cfg.API.FetchTimeout.Duration},
	}
	return c.serve()
}

func (c *Controller) serve() error {
	if _, err := rpc.Call(c.broker.socket, &rpc.Request{Op: rpc.OpPing}); err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	var err error
	if c.devnull, err = os.OpenFile("/dev/null", os.O_RDWR, 0); err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	if c.ledger, err = ledger.Open(filepath.Join(c.cfg.ControllerDir(), "ledger.db")); err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	defer c.ledger.Close()
	for _, d := range []string{filepath.Join(c.cfg.ControllerDir(), "projects")} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("controller: %w", err)
		}
	}

	opL, err := listenUnix(c.cfg.ControllerSocket(), 0o600)
	if err != nil {
		return err
	}
	// No WriteTimeout: an exec's answer streams for as long as it runs.
	opSrv := &http.Server{Handler: c.operatorRoutes(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
	opL = &peerListener{Listener: opL, allow: c.OperatorAllowed, log: c.log, name: "the operator socket"}

	c.makeBudgets()
	apiLs, err := c.listenAPI()
	if err != nil {
		return err
	}
	// No ReadTimeout: apiGate gives each body its own deadline, and an
	// exec's answer streams for as long as it runs. A connection that has
	// sent no complete header within header_timeout is closed.
	apiSrv := &http.Server{
		Handler:           c.apiGate(c.apiRoutes()),
		ReadHeaderTimeout: c.cfg.API.HeaderTimeout.Duration,
		IdleTimeout:       c.cfg.API.IdleTimeout.Duration,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(c.log.With("server", "api").Handler(), slog.LevelWarn),
		ConnContext:       apiConnContext,
	}
	tcpL, err := c.listenAPITCP()
	if err != nil {
		return err
	}
	egressSrv, egressLs, err := c.egressServers()
	if err != nil {
		return err
	}
	c.resumeTrials()
	go c.watchDisks()
	go c.watchRetention()
	// The self-test's record is asked for once the servers below serve:
	// the broker's status pings this controller's operator socket, which
	// until then would hold the answer a whole ping timeout (1 s).
	go func() {
		t := time.NewTicker(30 * time.Second)
		for ; ; <-t.C {
			c.recordSelftest()
		}
	}()

	errc := make(chan error, 2+len(apiLs)+len(egressLs))
	go func() { errc <- opSrv.Serve(opL) }()
	// Each socket's accepts in a goroutine of their own: one lane's flood
	// of connections waits on its own listener, not on another lane's.
	for _, l := range apiLs {
		go func() { errc <- apiSrv.Serve(l) }()
	}
	if tcpL != nil {
		go func() { errc <- apiSrv.Serve(tcpL) }()
	}
	for i, l := range egressLs {
		go func() { errc <- egressSrv[i].Serve(l) }()
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, unix.SIGTERM, unix.SIGINT)
	c.log.Info("controller serving", "socket", c.cfg.ControllerSocket(), "api", c.cfg.APISocket(), "api_tcp", c.apiAddr, "pid", os.Getpid(), "secrets", len(c.secrets))
	select {
	case <-sig:
	case err := <-errc:
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			c.log.Error("server", "err", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	opSrv.Shutdown(ctx)
	apiSrv.Shutdown(ctx)
	for _, s := range egressSrv {
		s.Shutdown(ctx)
	}
	c.mu.Lock()
	for _, rt := range c.trials {
		if rt.stopFS != nil {
			go rt.stopFS()
		}
	}
	c.mu.Unlock()
	return nil
}

// makeBudgets makes the API's budgets and rates from the configuration.
// Every peer the connection budget may see has its floor
// (config.APIPeers): when max_conns is lowered under the descriptor limit,
// a full lane still cannot take another's.
func (c *Controller) makeBudgets() {
	c.runs.max = c.cfg.API.MaxRunsPerLane
	c.conns = newConnBudget(c.apiMaxConns(), c.cfg.API.MaxConnsPerPeer, config.APIPeers(c.cfg.Lanes, len(c.cfg.Agent.Egress) > 0), c.log)
	c.rates = newRequestRates(c.table, c.cfg.API.RequestRate, c.cfg.API.RequestBurst, c.log)
	c.bodies = newByteBudget(c.cfg.API.MaxInflightBytes, c.cfg.API.MaxInflightBytesPerToken, c.cfg.API.MaxBodyBytes, c.cfg.Lanes)
}

// listenAPITCP serves the API's TCP listener where there is one (nil
// where there is none). The broker made it, so it knows the port for the
// lanes' rule sets; the controller only serves it.
func (c *Controller) listenAPITCP() (net.Listener, error) {
	if c.apiTCP == "" {
		return nil, nil
	}
	inherited := os.NewFile(rpc.APIListenerFD, "api-tcp")
	l, err := net.FileListener(inherited)
	// FileListener made its own descriptor; the inherited one goes, so no
	// command the controller starts (a kit's check) gets it.
	inherited.Close()
	if err != nil {
		return nil, fmt.Errorf("controller: api tcp %s: %w", c.apiTCP, err)
	}
	tcpL := &budgetListener{Listener: l, budget: c.conns}
	c.mu.Lock()
	c.apiAddr = tcpL.Addr().String()
	c.mu.Unlock()
	return tcpL, nil
}

// apiMaxConns is api.max_conns, lowered (loudly) to half the controller's
// descriptor limit when that is less: the API's peers must never take the
// descriptors the controller needs to measure disks and reach the broker.
func (c *Controller) apiMaxConns() int {
	n := c.cfg.API.MaxConns
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil && rl.Cur < uint64(2*n) {
		lowered := max(int(rl.Cur/2), 1)
		c.log.Warn("api.max_conns is more than half the controller's descriptor limit; lowered", "max_conns", n, "nofile", rl.Cur, "now", lowered)
		n = lowered
	}
	if c.cfg.API.MaxConnsPerPeer > n {
		c.log.Warn("api.max_conns_per_peer is over the lowered api.max_conns", "max_conns_per_peer", c.cfg.API.MaxConnsPerPeer, "max_conns", n)
	} else if peers := config.APIPeers(c.cfg.Lanes, len(c.cfg.Agent.Egress) > 0); n < peers*c.cfg.API.MaxConnsPerPeer {
		// The configuration's check (config.APIPeers) held for max_conns
		// as written, not as lowered.
		c.log.Warn("the lowered api.max_conns is less than api.max_conns_per_peer for each of the API's peers: lanes holding their shares could leave another lane none", "max_conns", n, "max_conns_per_peer", c.cfg.API.MaxConnsPerPeer, "peers", peers)
	}
	return n
}

func listenUnix(path string, mode os.FileMode) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("controller: %w", err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	if err := os.Chmod(path, mode); err != nil {
		l.Close()
		return nil, fmt.Errorf("controller: %w", err)
	}
	return l, nil
}

// OperatorAllowed decides who may use the controller's operator socket:
// root (the operator's commands) and the controller's own user.
func (c *Controller) OperatorAllowed(cred *unix.Ucred) bool {
	return cred.Uid == 0 || int(cred.Uid) == c.table.Controller().UID
}

// peerListener closes every connection whose peer allow refuses, by
// SO_PEERCRED, before a byte is read.
type peerListener struct {
	net.Listener
	allow func(*unix.Ucred) bool
	log   *slog.Logger
	name  string // the socket, as the log names it
	// warned is when each refused uid was last logged, and refused how
	// many were refused since: a role that reaches another's socket past
	// its folder (an O_PATH descriptor through /proc/self/fd) and
	// connects in a loop is one line every few seconds, not one per
	// connection. Accept runs on one goroutine per listener.
	warned  map[uint32]time.Time
	refused map[uint32]int
}

// logRefused logs a refused peer, at most once every 5 seconds for each
// uid, with how many were refused since the last line.
func (l *peerListener) logRefused(cred *unix.Ucred) {
	if l.warned == nil {
		l.warned, l.refused = map[uint32]time.Time{}, map[uint32]int{}
	}
	l.refused[cred.Uid]++
	if now := time.Now(); now.Sub(l.warned[cred.Uid]) > 5*time.Second {
		l.log.Warn("refused a peer on "+l.name, "uid", cred.Uid, "pid", cred.Pid, "refused_since_last", l.refused[cred.Uid])
		l.warned[cred.Uid] = now
		l.refused[cred.Uid] = 0
	}
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		uc, ok := conn.(*net.UnixConn)
		if !ok {
			conn.Close()
			continue
		}
		cred, err := peercred.Of(uc)
		if err != nil || !l.allow(cred) {
			if cred != nil {
				l.logRefused(cred)
			}
			conn.Close()
			continue
		}
		return conn, nil
	}
}

// recordSelftest copies a self-test result the broker has not yet had
// recorded into the ledger.
func (c *Controller) recordSelftest() {
	st, err := c.broker.status()
	if err != nil || st.Selftest == nil {
		return
	}
	c.mu.Lock()
	seen := c.lastST == st.Selftest.At
	c.lastST = st.Selftest.At
	c.mu.Unlock()
	if seen {
		return
	}
	raw, _ := json.Marshal(st.Selftest)
	at, _ := time.Parse(time.RFC3339, st.Selftest.At)
	if err := c.ledger.AddSelftest(raw, at); err != nil {
		c.log.Error("record self-test", "err", err)
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// writeError answers one line naming what is wrong, as a problem whose
// code its status gives.
func writeError(w http.ResponseWriter, code int, msg string) {
	writeProblem(w, code, statusCode(code), msg)
}
