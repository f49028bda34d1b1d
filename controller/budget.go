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
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/fairshare"
	"thermite/internal/peercred"
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

// apiGate is the first handler of every API request: on a role's own
// socket it refuses a request over the role's rate (requestRate.gate);
// it starts the body's read deadline and refuses a body over its route's
// size from its Content-Length, before a byte of it is read.
func (c *Controller) apiGate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if from, ok := r.Context().Value(apiConnKey{}).(apiConnFrom); ok && !from.rate.gate(w, r) {
			return
		}
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
// token's, and all tokens' together, shared fairly (fairshare.Share):
// every lane's trial is guaranteed its floor of the total, so lanes that
// hold all they may leave the others theirs.
type byteBudget struct {
	mu    sync.Mutex
	share *fairshare.Share
}

// newByteBudget divides all among the trials of lanes lanes (one open
// trial each), each at most perToken; unit is the largest body.
func newByteBudget(all, perToken, unit int64, lanes int) *byteBudget {
	return &byteBudget{share: fairshare.New(all, perToken, unit, lanes)}
}

// reserveBody decides whether a trial's request may hold n more bytes of
// body: within api.max_inflight_bytes_per_token for its token and its
// fair share of api.max_inflight_bytes. It returns the release, or the
// HTTP status and the one line that refuse it.
func (b *byteBudget) reserveBody(trial string, n int64) (release func(), code int, msg string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f := b.share
	if ok, own := f.Admit(trial, n); !ok {
		if own {
			return nil, http.StatusTooManyRequests, fmt.Sprintf("this token already holds %d bytes of request bodies; %d more is over its %d-byte limit", f.Held(trial), n, f.PerHolder())
		}
		return nil, http.StatusServiceUnavailable, fmt.Sprintf("this token holds %d bytes of request bodies; %d more is over its guaranteed %d bytes, and the %d bytes the API's tokens share above theirs are in use (the API holds %d of its %d-byte limit): try again", f.Held(trial), n, f.Floor(), f.Pool(), f.Sum(), f.Max())
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.share.Release(trial, n)
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
// shared fairly (fairshare.Share): every role that may connect is
// guaranteed its floor of the total, so roles that hold all they may
// leave the others (and the operator) theirs.
type connBudget struct {
	mu    sync.Mutex
	share *fairshare.Share
	// warned is when each refused peer was last logged, so a flood is one
	// line per peer every few seconds, not one per connection.
	warned  map[string]time.Time
	refused map[string]int
	log     *slog.Logger
	// overOwn and overAll are the whole answers a refused connection gets
	// (overConnAnswer), made once: a flood of refused connects costs a
	// write each, never a formatting.
	overOwn, overAll []byte
}

// newConnBudget divides all among peers peers, each at most perPeer.
func newConnBudget(all, perPeer, peers int, log *slog.Logger) *connBudget {
	share := fairshare.New(int64(all), int64(perPeer), 1, peers)
	return &connBudget{share: share, warned: map[string]time.Time{}, refused: map[string]int{}, log: log,
		overOwn: overConnAnswer(fmt.Sprintf("this peer already holds its api.max_conns_per_peer of %d open connections to the API; this one is closed: close one of yours first", perPeer)),
		overAll: overConnAnswer(fmt.Sprintf("the API's connections above each peer's guaranteed %d are all in use (api.max_conns is %d); this one is closed: try again", share.Floor(), all)),
	}
}

// overConnAnswer is the one HTTP answer a connection refused at accept
// gets: a 503 whose problem names the limit and its value, then the
// close.
func overConnAnswer(detail string) []byte {
	body, _ := json.Marshal(Problem{Type: problemType + CodeBusy, Title: http.StatusText(http.StatusServiceUnavailable), Status: http.StatusServiceUnavailable, Detail: detail, Code: CodeBusy})
	body = append(body, '\n')
	head := fmt.Sprintf("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/problem+json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n", len(body))
	return append([]byte(head), body...)
}

// admitConn decides whether a new connection from peer may be served:
// within api.max_conns_per_peer for that peer and its fair share of
// api.max_conns. A refusal returns the answer the connection gets.
func (b *connBudget) admitConn(peer string) (ok bool, refusal []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f := b.share
	ok, own := f.Admit(peer, 1)
	if ok {
		return true, nil
	}
	b.refused[peer]++
	if now := time.Now(); now.Sub(b.warned[peer]) > 5*time.Second {
		b.log.Warn("API connection refused: over its budget", "peer", peer, "open", f.Held(peer), "max_conns_per_peer", f.PerHolder(), "guaranteed", f.Floor(), "open_all", f.Sum(), "max_conns", f.Max(), "refused_since_last", b.refused[peer])
		b.warned[peer] = now
		b.refused[peer] = 0
	}
	if own {
		return false, b.overOwn
	}
	return false, b.overAll
}

func (b *connBudget) release(peer string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.share.Release(peer, 1)
}

// refuseConn answers a connection refused at accept with its one line and
// closes it, without ever waiting: the answer goes only where the
// socket's buffer takes it at once (a fresh connection's always does),
// and what the peer already sent is read and dropped once, so that the
// close does not turn into a reset that discards the answer before the
// peer reads it (TCP). It costs the accept loop two system calls more
// than a bare close, and holds nothing after.
func refuseConn(conn net.Conn, answer []byte) {
	defer conn.Close()
	sc, ok := conn.(syscall.Conn)
	if !ok || answer == nil {
		return
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return
	}
	raw.Control(func(fd uintptr) {
		unix.Sendto(int(fd), answer, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, nil)
		buf := drainBufs.Get().(*[]byte)
		unix.Recvfrom(int(fd), *buf, unix.MSG_DONTWAIT)
		drainBufs.Put(buf)
	})
}

// drainBufs are refuseConn's buffers for what a refused peer sent.
var drainBufs = sync.Pool{New: func() any { b := make([]byte, 4096); return &b }}

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
// others get one line (refuseConn) and are closed at once, before a
// request is parsed.
type budgetListener struct {
	net.Listener
	budget *connBudget
	// peer, when set, is every connection's peer: a listener only one
	// role reaches (an agent's egress proxy, whose peers are all
	// 127.0.0.1 of that role's own namespace) is budgeted as that role.
	peer string
	// from, on the API's unix listeners, is what the socket allows; each
	// connection carries it (apiConnContext).
	from apiConnFrom
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
		if peer == "" {
			conn.Close()
			continue
		}
		if ok, refusal := l.budget.admitConn(peer); !ok {
			refuseConn(conn, refusal)
			continue
		}
		return &budgetConn{Conn: conn, release: sync.OnceFunc(func() { l.budget.release(peer) }), from: l.from}, nil
	}
}

// budgetConn gives its place in the budget back when it closes.
type budgetConn struct {
	net.Conn
	release func()
	from    apiConnFrom
}

func (c *budgetConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}
