package controller

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"thermite/controller/fetch"
)

// The egress proxy: HTTP CONNECT, for a trial's agent to reach its model
// provider without an open network. It is served on two kinds of
// listener:
//   - each agent's own (and each lane's, for the lane harness), on
//     127.0.0.1:agent.egress_port inside that role's network namespace,
//     which the broker made and handed over (rpc.Bootstrap.Egress): the
//     listener says whose trial it is, the open trial of the role's lane,
//     so no token is needed (one given must be that trial's);
//   - the harness API's own listeners, with the trial's token
//     (Proxy-Authorization, Basic with the token as password, as a proxy
//     URL http://trial:TOKEN@host:port gives it, or Bearer).
// A tunnel goes only to a host:port of agent.egress, to an address that
// passes the fetcher's checks at dial time, and is recorded per trial.

// CodeEgressRefused is a tunnel the proxy will not make.
const CodeEgressRefused = "egress_refused"

// proxyToken is the token a CONNECT carries, or "".
func proxyToken(r *http.Request) string {
	h := strings.TrimSpace(r.Header.Get("Proxy-Authorization"))
	scheme, cred, _ := strings.Cut(h, " ")
	cred = strings.TrimSpace(cred)
	switch {
	case strings.EqualFold(scheme, "Bearer"):
		return cred
	case strings.EqualFold(scheme, "Basic"):
		raw, err := base64.StdEncoding.DecodeString(cred)
		if err != nil {
			return ""
		}
		_, pass, _ := strings.Cut(string(raw), ":")
		return pass
	}
	return ""
}

// egressAllowed decides whether a trial's agent may tunnel to hostport:
// only an entry of agent.egress, the host in any case. It reports whether
// the entry names an IP literal (the operator's own choice of address).
func (c *Controller) egressAllowed(hostport string) (allowed, literal bool) {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false, false
	}
	for _, e := range c.cfg.Agent.Egress {
		if strings.EqualFold(e, hostport) {
			_, perr := netip.ParseAddr(strings.Trim(host, "[]"))
			return true, perr == nil
		}
	}
	return false, false
}

// egressDialTimeout bounds the dial of a tunnel's target.
const egressDialTimeout = 10 * time.Second

// egressDialer dials an allowed host, checking each address it resolves to
// as the fetcher does (no loopback, private, link-local... address) at
// connect time, so no DNS answer can point it inward; an IP literal the
// operator listed is taken as it is.
func egressDialer(literal bool) *net.Dialer {
	d := &net.Dialer{Timeout: egressDialTimeout}
	if !literal {
		d.Control = func(network, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("egress: %s is not an address", address)
			}
			if class, refused := fetch.Classify(ap.Addr().Unmap()); refused {
				return fmt.Errorf("egress: %s is %s address, refused", ap.Addr(), class)
			}
			return nil
		}
	}
	return d
}

// egress serves one CONNECT on the API's listeners: the trial by its
// token, then the tunnel.
func (c *Controller) egress(w http.ResponseWriter, r *http.Request) {
	rt, kind := c.trialOnListener(r, "Bearer "+proxyToken(r))
	// A lane harness run tunnels through its own proxy (HTTPS_PROXY in its
	// network namespace); its token opens no tunnel here, where any
	// command of the lane could use it.
	if rt == nil || kind == laneRunToken || rt.closing.Load() {
		w.Header().Set("Proxy-Authenticate", `Basic realm="thermite"`)
		refuse(w, r, http.StatusProxyAuthRequired, "the egress proxy takes the trial's token (a proxy URL http://trial:TOKEN@host:port)")
		return
	}
	c.tunnel(w, r, rt, "api")
}

// egressOn is the egress proxy on a role's own listener, inside its
// network namespace: only that role's commands can connect to it, so the
// trial is the open trial of the role's lane. A token, where one is given,
// must be that trial's: no command of another lane speaks for it, and
// this one speaks for no other.
func (c *Controller) egressOn(role string) http.Handler {
	r0, _ := c.table.Role(role)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			w.Header().Set("Allow", http.MethodConnect)
			writeProblem(w, http.StatusMethodNotAllowed, CodeMethodNotAllowed, "this is the trial's egress proxy: it takes CONNECT host:port (HTTPS_PROXY) only")
			return
		}
		rt := c.openTrialOf(r0.Index)
		if rt == nil {
			refuseEgress(w, r, http.StatusForbidden, fmt.Sprintf("egress: %s has no open trial", role))
			return
		}
		if tok := proxyToken(r); tok != "" {
			if other := c.TrialForToken("Bearer " + tok); other != rt {
				c.agentEvent(rt, "egress.refused", map[string]any{"target": r.Host, "via": role, "why": "the token given is not this trial's"})
				w.Header().Set("Proxy-Authenticate", `Basic realm="thermite"`)
				refuse(w, r, http.StatusProxyAuthRequired, fmt.Sprintf("the token given is not the token of %s's trial: this proxy speaks for that trial alone", role))
				return
			}
		}
		c.tunnel(w, r, rt, role)
	})
}

// openTrialOf is the open trial of lane n, or nil.
func (c *Controller) openTrialOf(lane int) *trialRT {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rt := range c.trials {
		if rt.t.Lane == lane && !rt.closing.Load() {
			return rt
		}
	}
	return nil
}

// tunnel serves one CONNECT for a trial: the target by agent.egress, the
// decoy guard, the dial, then bytes both ways until either side closes or
// the trial ends. via is the listener: "api", or the role whose own it is.
func (c *Controller) tunnel(w http.ResponseWriter, r *http.Request, rt *trialRT, via string) {
	if n := rt.inflight.Add(1); n > int64(c.cfg.API.MaxConnsPerToken) {
		rt.inflight.Add(-1)
		c.agentEvent(rt, "egress.refused", map[string]any{"target": r.Host, "via": via, "why": fmt.Sprintf("more than %d requests and tunnels at once (api.max_conns_per_token)", c.cfg.API.MaxConnsPerToken)})
		refuse(w, r, http.StatusTooManyRequests, fmt.Sprintf("more than %d requests and tunnels at once on this token", c.cfg.API.MaxConnsPerToken))
		return
	}
	defer rt.inflight.Add(-1)
	// The target is where a decoy would show in a tunnel's request: as a
	// name (a DNS label) or in a header.
	seen := r.Clone(r.Context())
	seen.URL = &url.URL{Path: r.Host}
	if !c.guardDecoy(w, seen, rt, nil) {
		return
	}
	target := r.Host
	allowed, literal := c.egressAllowed(target)
	if !allowed {
		c.agentEvent(rt, "egress.refused", map[string]any{"target": target, "via": via, "why": "not in agent.egress"})
		refuseEgress(w, r, http.StatusForbidden, fmt.Sprintf("egress to %s refused: it is not in the rig's agent.egress", target))
		return
	}
	ctx, cancel := rt.within(r.Context())
	defer cancel()
	up, err := egressDialer(literal).DialContext(ctx, "tcp", target)
	if err != nil {
		c.agentEvent(rt, "egress.refused", map[string]any{"target": target, "via": via, "why": dialReason(err)})
		code := http.StatusBadGateway
		var oe *net.OpError
		if errors.As(err, &oe) && strings.Contains(err.Error(), "egress: ") {
			code = http.StatusForbidden
		}
		refuseEgress(w, r, code, fmt.Sprintf("egress to %s: %s", target, dialReason(err)))
		return
	}
	defer up.Close()
	down, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		writeProblem(w, http.StatusInternalServerError, CodeInternal, "the tunnel could not be made")
		return
	}
	defer down.Close()
	down.SetDeadline(time.Time{})
	io.WriteString(down, "HTTP/1.1 200 Connection established\r\n\r\n")
	start := time.Now()
	// Recorded as it opens too: a tunnel may last the agent's whole run.
	c.agentEvent(rt, "egress.open", map[string]any{"target": target, "via": via, "address": up.RemoteAddr().String()})
	// The trial's end cuts its tunnels.
	stop := context.AfterFunc(rt.ctx, func() { up.Close(); down.Close() })
	defer stop()
	var sent, received atomic.Int64
	done := make(chan struct{}, 2)
	go func() {
		// What the client sent after its CONNECT, already buffered, first.
		n, _ := io.Copy(up, io.MultiReader(io.LimitReader(buf.Reader, int64(buf.Reader.Buffered())), down))
		sent.Store(n)
		if tc, ok := up.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		n, _ := io.Copy(down, up)
		received.Store(n)
		done <- struct{}{}
	}()
	<-done
	up.Close()
	down.Close()
	<-done
	c.agentEvent(rt, "egress", map[string]any{"target": target, "via": via, "address": up.RemoteAddr().String(), "bytes_sent": sent.Load(), "bytes_received": received.Load(), "ms": time.Since(start).Milliseconds()})
}

// dialReason is a dial's failure in one line, without the dialer's
// wrapping.
func dialReason(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "egress: "); i >= 0 {
		return msg[i+len("egress: "):]
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Sprintf("no answer within %s (the proxy's dial timeout)", egressDialTimeout)
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Err.Error()
	}
	return msg
}

// refuseEgress answers a tunnel refused (403) or failed (502), code
// egress_refused, and closes the connection.
func refuseEgress(w http.ResponseWriter, r *http.Request, status int, msg string) {
	http.NewResponseController(w).SetReadDeadline(time.Now())
	w.Header().Set("Connection", "close")
	writeProblem(w, status, CodeEgressRefused, msg)
}

// egressServers serves the egress proxy on each listener the broker made
// in a role's network namespace, with that role's handler.
func (c *Controller) egressServers() ([]*http.Server, []net.Listener, error) {
	var srvs []*http.Server
	var ls []net.Listener
	for _, e := range c.egressL {
		f := os.NewFile(uintptr(e.FD), "egress-"+e.Role)
		l, err := net.FileListener(f)
		// FileListener made its own descriptor; the inherited one goes, so
		// no command the controller starts gets it.
		f.Close()
		if err != nil {
			return nil, nil, fmt.Errorf("controller: egress proxy of %s: %w", e.Role, err)
		}
		// The role's own listener: accepted on at its rate, its CONNECTs
		// served at its request rate (with its API socket's).
		rl, err := newRateListener(l, c.cfg.API.AcceptRate, c.cfg.API.AcceptBurst, "the egress proxy of "+e.Role, c.log)
		if err != nil {
			l.Close()
			return nil, nil, err
		}
		ls = append(ls, &budgetListener{Listener: rl, budget: c.conns, peer: "role " + e.Role})
		srvs = append(srvs, &http.Server{
			Handler:           rateGated(c.rates[e.Role], c.egressOn(e.Role)),
			ReadHeaderTimeout: c.cfg.API.HeaderTimeout.Duration,
			MaxHeaderBytes:    64 << 10,
			ErrorLog:          slog.NewLogLogger(c.log.With("server", "egress", "role", e.Role).Handler(), slog.LevelWarn),
		})
	}
	return srvs, ls, nil
}

// egressProxyEnv is what points an agent's HTTP clients at its egress
// proxy, in every spelling they read: the proxy inside its namespace for
// every host (NO_PROXY empty; the proxy itself refuses what is not
// listed). None where the rig lists no provider.
func (c *Controller) egressProxyEnv() []string {
	if len(c.cfg.Agent.Egress) == 0 {
		return nil
	}
	u := fmt.Sprintf("http://127.0.0.1:%d", c.cfg.Agent.EgressPort)
	return []string{"HTTPS_PROXY=" + u, "HTTP_PROXY=" + u, "https_proxy=" + u, "http_proxy=" + u, "NO_PROXY=", "no_proxy="}
}
