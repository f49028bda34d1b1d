package controller

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"thermite/controller/ledger"
	"thermite/roles"
)

// The harness API's unix sockets: one for each lane and each agent, and
// the operator's. Each is a listener of its own, accepted on in its own
// goroutine, so one role's flood of connections fills only its own
// backlog and its own share of the budget, never another lane's.

// apiSocket is one of the API's unix listeners and who may use it.
type apiSocket struct {
	path string
	// mode is the socket file's: 0666 for a role's, whose folder (0710,
	// the role's group) is what keeps the other roles out; 0600 for the
	// operator's, which only root passes.
	mode os.FileMode
	// who names the listener in the log: a role's name, or "operator".
	who string
	// uid is the one peer the listener serves (SO_PEERCRED).
	uid int
	// lane is the lane whose trials' tokens it takes; 0 takes any open
	// trial's (the operator's).
	lane int
	// laneSocket: the lane's own (lane-N's), where only a lane harness
	// run's token is served (tokenServes).
	laneSocket bool
}

// apiSockets are the operator's socket (root's) and every lane's and
// agent's own.
func (c *Controller) apiSockets() []apiSocket {
	out := []apiSocket{{path: c.cfg.APISocket(), mode: 0o600, who: "operator", uid: 0}}
	for _, r := range c.table.Roles {
		if r.Kind == roles.Lane || r.Kind == roles.Agent {
			out = append(out, apiSocket{path: c.cfg.RoleAPISocket(r.Name), mode: 0o666, who: r.Name, uid: r.UID, lane: r.Index, laneSocket: r.Kind == roles.Lane})
		}
	}
	return out
}

// listenAPI makes each of the API's unix listeners, each refusing every
// peer but its one uid before a byte is read, then counting what it keeps
// against the connection budget; a role's own is accepted on at
// api.accept_rate (rateListener). The connections it hands over carry
// what their socket allows (apiConnFrom): the lane whose tokens they may
// use and the role's request rate. Any that cannot be made refuses the
// start: no lane falls back to a socket it shares.
func (c *Controller) listenAPI() (out []net.Listener, err error) {
	defer func() {
		if err != nil {
			for _, o := range out {
				o.Close()
			}
			out = nil
		}
	}()
	for _, s := range c.apiSockets() {
		l, err := listenUnix(s.path, s.mode)
		if err != nil {
			return out, fmt.Errorf("controller: the API's socket for %s: %w", s.who, err)
		}
		var rate *requestRate
		if s.uid != 0 {
			// A role's own: accepted on at its rate, its requests served
			// at theirs; the operator's socket at neither.
			rl, err := newRateListener(l, c.cfg.API.AcceptRate, c.cfg.API.AcceptBurst, "the API socket of "+s.who, c.log)
			if err != nil {
				l.Close()
				return out, err
			}
			l, rate = rl, c.rates[s.who]
		}
		uid := uint32(s.uid)
		l = &peerListener{Listener: l, allow: func(cred *unix.Ucred) bool { return cred.Uid == uid }, log: c.log, name: "the API socket of " + s.who}
		out = append(out, &budgetListener{Listener: l, budget: c.conns, from: apiConnFrom{socket: s.path, lane: s.lane, laneSocket: s.laneSocket, rate: rate}})
	}
	return out, nil
}

// apiConnKey is the context key of the listener a request came in on.
type apiConnKey struct{}

// apiConnFrom is what a connection's listener allows: the socket it came
// in on, the lane whose tokens it takes (0: any), and whether it is the
// lane's own socket (lane-N's, not agent-N's).
type apiConnFrom struct {
	socket     string
	lane       int
	laneSocket bool
	// rate is the socket's role's request rate; nil on the operator's.
	rate *requestRate
}

// apiConnContext tags each connection's requests with its listener, for
// the API's http.Server's ConnContext.
func apiConnContext(ctx context.Context, conn net.Conn) context.Context {
	if bc, ok := conn.(*budgetConn); ok && bc.from.socket != "" {
		return context.WithValue(ctx, apiConnKey{}, bc.from)
	}
	return ctx
}

// tokenKind is what a token speaks for.
type tokenKind int

const (
	// trialToken is the trial's own: the agent's (its folder's token
	// file), and the operator's or a supervisor's.
	trialToken tokenKind = iota
	// laneRunToken is one lane harness run's, minted for that run and
	// revoked at its end (laneRunGrant).
	laneRunToken
)

// tokenServes decides whether a token of kind, of a trial on lane, is
// served on the listener a request came in on (from; has is false for
// the API's TCP listener). A lane harness run's token only on its own
// lane's socket. The trial's token on its agent's socket, the operator's
// and TCP, and never on a lane's socket: every command of the lane
// reaches that one, and only while a lane harness runs may any of them
// speak for the trial. Another lane's token on a lane's or an agent's
// socket is refused as a wrong one.
func tokenServes(from apiConnFrom, has bool, kind tokenKind, lane int) bool {
	switch {
	case kind == laneRunToken:
		return has && from.laneSocket && from.lane == lane
	case has && from.laneSocket:
		return false
	case has && from.lane != 0:
		return from.lane == lane
	}
	return true
}

// trialForRequest is the open trial of a request's token, nil when there
// is none or when tokenServes refuses it on the listener the request came
// in on: every such refusal is the same 401 as a wrong token's.
func (c *Controller) trialForRequest(r *http.Request) *trialRT {
	rt, _ := c.trialOnListener(r, r.Header.Get("Authorization"))
	return rt
}

// trialOnListener is the open trial of an Authorization header's token
// and what kind of token it is, where tokenServes serves it on r's
// listener; nil otherwise.
func (c *Controller) trialOnListener(r *http.Request, header string) (*trialRT, tokenKind) {
	rt, kind := c.tokenTrial(header)
	if rt == nil {
		return nil, kind
	}
	from, has := r.Context().Value(apiConnKey{}).(apiConnFrom)
	if !tokenServes(from, has, kind, rt.t.Lane) {
		return nil, kind
	}
	return rt, kind
}

// infoOn is a trial's details as a request sees them: the socket named is
// the one it came in on (the lane's own for the lane, the agent's for the
// agent), and on the lane's the token file is the lane harness run's.
func (c *Controller) infoOn(r *http.Request, t ledger.Trial) TrialInfo {
	i := c.info(t)
	if from, ok := r.Context().Value(apiConnKey{}).(apiConnFrom); ok {
		i.APISocket = from.socket
		if from.laneSocket {
			i.TokenFile = filepath.Join(c.laneTokenDir(t.ID), "token")
		}
	}
	return i
}
