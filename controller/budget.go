package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"thermite/internal/peercred"
	"time"
)

// The harness API's budgets: what one peer, one token and the whole API
// may hold of the controller's descriptors and memory, enforced before a
// request's body is read. One lane at its limits costs only itself.

// smallBody is the body limit of every route that carries only a path, a
// pattern or a URL.
const smallBody = 64 << 10

// bodyLimit decides how large a request's body may be, by its route:
// writes, edits and execs up to api.max_body_bytes, steps and notes up to
// api.max_step_bytes and a little for their JSON, every other route 64 KiB.
func (c *Controller) bodyLimit(r *http.Request) int64 {
	switch r.URL.Path {
	case "/v1/fs/write", "/v1/fs/edit", "/v1/exec":
		return c.cfg.API.MaxBodyBytes
	case "/v1/steps", "/v1/research/note":
		return c.cfg.API.MaxStepBytes + 4096
	}
	return smallBody
}

// apiGate is the first handler of every API request: it starts the body's
// read deadline and refuses a body over its route's size from its
// Content-Length, before a byte of it is read.
func (c *Controller) apiGate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		rc.SetReadDeadline(time.Now().Add(c.cfg.API.BodyTimeout.Duration))
		if limit := c.bodyLimit(r); r.ContentLength > limit {
			refuse(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("a body of %d bytes is over the %d-byte limit of %s %s", r.ContentLength, limit, r.Method, r.URL.Path))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// refuse answers one line and closes the connection without reading
// what is left of the request: a refused peer holds nothing of ours.
func refuse(w http.ResponseWriter, r *http.Request, code int, msg string) {
	http.NewResponseController(w).SetReadDeadline(time.Now())
	w.Header().Set("Connection", "close")
	if code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="thermite"`)
	}
	writeError(w, code, msg)
}

// byteBudget bounds the bytes of request bodies held at once: each
// token's, and all tokens' together, shared fairly (fairShare): every
// lane's trial is guaranteed its floor of the total, so lanes that hold
// all they may leave the others theirs.
type byteBudget struct {
	mu    sync.Mutex
	share *fairShare
}

// newByteBudget divides all among the trials of lanes lanes (one open
// trial each), each at most perToken; unit is the largest body.
func newByteBudget(all, perToken, unit int64, lanes int) *byteBudget {
	return &byteBudget{share: newFairShare(all, perToken, unit, lanes)}
}

// reserveBody decides whether a trial's request may hold n more bytes of
// body: within api.max_inflight_bytes_per_token for its token and its
// fair share of api.max_inflight_bytes. It returns the release, or the
// HTTP status and the one line that refuse it.
func (b *byteBudget) reserveBody(trial string, n int64) (release func(), code int, msg string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f := b.share
	if ok, own := f.admitShare(trial, n); !ok {
		if own {
			return nil, http.StatusTooManyRequests, fmt.Sprintf("this token already holds %d bytes of request bodies; %d more is over its %d-byte limit", f.held[trial], n, f.perHolder)
		}
		return nil, http.StatusServiceUnavailable, fmt.Sprintf("this token holds %d bytes of request bodies; %d more is over its guaranteed %d bytes, and the %d bytes the API's tokens share above theirs are in use (the API holds %d of its %d-byte limit): try again", f.held[trial], n, f.floor, f.pool, f.sum, f.max)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.share.releaseShare(trial, n)
		})
	}, 0, ""
}

// readBody reads a request's body, at most limit bytes, within the body
// deadline apiGate started; a trial that ends meanwhile cuts the read
// short. It clears the deadline after, so that a long answer (an exec's
// stream) is not cut by it.
func readBody(w http.ResponseWriter, r *http.Request, rt *trialRT, limit int64) ([]byte, int, string) {
	rc := http.NewResponseController(w)
	stop := context.AfterFunc(rt.ctx, func() { rc.SetReadDeadline(time.Now()) })
	defer stop()
	var body []byte
	var err error
	if n := r.ContentLength; n >= 0 && n <= limit {
		// Its size is known: one buffer of exactly that, never doubled.
		body = make([]byte, n)
		_, err = io.ReadFull(r.Body, body)
	} else {
		body, err = io.ReadAll(io.LimitReader(r.Body, limit+1))
	}
	var ne net.Error
	switch {
	case err != nil && rt.closing.Load():
		return nil, http.StatusUnauthorized, unauthorized
	case errors.As(err, &ne) && ne.Timeout():
		return nil, http.StatusRequestTimeout, "the body did not arrive within the API's body_timeout"
	case err != nil:
		return nil, http.StatusBadRequest, "reading the body: " + err.Error()
	case int64(len(body)) > limit:
		return nil, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is over the %d-byte limit of %s %s", limit, r.Method, r.URL.Path)
	}
	rc.SetReadDeadline(time.Time{})
	return body, 0, ""
}

// connBudget counts the API's open connections, per peer and in all,
// shared fairly (fairShare): every role that may connect is guaranteed
// its floor of the total, so roles that hold all they may leave the
// others (and the operator) theirs.
type connBudget struct {
	mu    sync.Mutex
	share *fairShare
	// warned is when each refused peer was last logged, so a flood is one
	// line per peer every few seconds, not one per connection.
	warned  map[string]time.Time
	refused map[string]int
	log     *slog.Logger
}

// newConnBudget divides all among peers peers, each at most perPeer.
func newConnBudget(all, perPeer, peers int, log *slog.Logger) *connBudget {
	return &connBudget{share: newFairShare(int64(all), int64(perPeer), 1, peers), warned: map[string]time.Time{}, refused: map[string]int{}, log: log}
}

// admitConn decides whether a new connection from peer may be served:
// within api.max_conns_per_peer for that peer and its fair share of
// api.max_conns.
func (b *connBudget) admitConn(peer string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ok, _ := b.share.admitShare(peer, 1); ok {
		return true
	}
	b.refused[peer]++
	if now := time.Now(); now.Sub(b.warned[peer]) > 5*time.Second {
		f := b.share
		b.log.Warn("API connection refused: over its budget", "peer", peer, "open", f.held[peer], "max_conns_per_peer", f.perHolder, "guaranteed", f.floor, "open_all", f.sum, "max_conns", f.max, "refused_since_last", b.refused[peer])
		b.warned[peer] = now
		b.refused[peer] = 0
	}
	return false
}

func (b *connBudget) release(peer string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.share.releaseShare(peer, 1)
}

// peerKey names who is at the other end of an API connection: the uid
// the kernel gives by SO_PEERCRED on the unix socket, the remote address
// on TCP. "" when it cannot tell: such a connection is not served.
func peerKey(conn net.Conn) string {
	switch c := conn.(type) {
	case *net.UnixConn:
		cred, err := peercred.Of(c)
		if err != nil {
			return ""
		}
		return fmt.Sprintf("uid %d", cred.Uid)
	case *net.TCPConn:
		if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			return "addr " + a.IP.String()
		}
	}
	return ""
}

// budgetListener serves only the connections its budget admits; the
// others are closed at once, before a byte is read.
type budgetListener struct {
	net.Listener
	budget *connBudget
	// peer, when set, is every connection's peer: a listener only one
	// role reaches (an agent's egress proxy, whose peers are all
	// 127.0.0.1 of that role's own namespace) is budgeted as that role.
	peer string
	// socket and lane, on the API's unix listeners, are the socket's path
	// and the lane whose tokens it takes (0: any); each connection
	// carries them (apiConnContext).
	socket     string
	lane       int
	laneSocket bool
}

func (l *budgetListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		peer := l.peer
		if peer == "" {
			peer = peerKey(conn)
		}
		if peer == "" || !l.budget.admitConn(peer) {
			conn.Close()
			continue
		}
		return &budgetConn{Conn: conn, release: sync.OnceFunc(func() { l.budget.release(peer) }), socket: l.socket, lane: l.lane, laneSocket: l.laneSocket}, nil
	}
}

// budgetConn gives its place in the budget back when it closes.
type budgetConn struct {
	net.Conn
	release    func()
	socket     string
	lane       int
	laneSocket bool
}

func (c *budgetConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}
