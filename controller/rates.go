package controller

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/tokenbucket"
	"thermite/roles"
)

// The rates a lane or an agent may make the controller work at: each
// listener it owns is accepted on no faster than api.accept_rate, and its
// requests there are served no faster than api.request_rate. What it asks
// beyond them costs it (its own backlog, its own 429), not the
// controller, so the lane beside it is served as if the flood were not
// there. The operator's socket and the API's TCP listener have no rate.

// rateListener is a listener that a lane or an agent owns, accepted on at
// most its bucket's rate: the accept loop waits for a token before it
// accepts, so the connections past the rate wait in the kernel's backlog
// of this listener alone, and past that backlog the role's own connect
// fails (EAGAIN on a unix socket). The controller spends nothing on them.
type rateListener struct {
	net.Listener
	who   string // the listener, as the log names it
	log   *slog.Logger
	paced pacedBucket

	done      chan struct{}
	closeOnce sync.Once
}

// newRateListener accepts on l at most rate a second after burst at once,
// and makes l's backlog burst long (listen(2) again on the listening
// socket): a flood past its rate then fails at its own connect within a
// burst's worth of connections, and its socket is its own again a
// burst's worth of accepts after the flood stops, not somaxconn's.
func newRateListener(l net.Listener, rate, burst int, who string, log *slog.Logger) (*rateListener, error) {
	sc, ok := l.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("controller: %s: its backlog cannot be set on a %T", who, l)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("controller: %s: %w", who, err)
	}
	var lerr error
	if err := raw.Control(func(fd uintptr) { lerr = unix.Listen(int(fd), burst) }); err != nil || lerr != nil {
		return nil, fmt.Errorf("controller: %s: its backlog of api.accept_burst %d: %w", who, burst, errors.Join(err, lerr))
	}
	return &rateListener{Listener: l, who: who, log: log, paced: pacedBucket{bucket: tokenbucket.New(rate, burst)}, done: make(chan struct{})}, nil
}

// Accept waits for the listener's turn, then accepts. A close while it
// waits ends the wait.
func (l *rateListener) Accept() (net.Conn, error) {
	for {
		wait, ok := l.turn()
		if ok {
			return l.Listener.Accept()
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-l.done:
			t.Stop()
			return nil, net.ErrClosed
		}
	}
}

// turn takes a token, or says how long until one is there, logging a
// listener that waits at most once every 5 seconds.
func (l *rateListener) turn() (time.Duration, bool) {
	return l.paced.take(func(b *tokenbucket.Bucket, waits int) {
		l.log.Warn("a role's listener is at its accept rate: its connections wait in its own backlog", "listener", l.who, "accept_rate", b.Rate(), "accept_burst", b.Burst(), "waits_since_last", waits)
	})
}

// pacedBucket is a token bucket behind a lock of its own, which says how
// many events it turned away at most once every 5 seconds: a flood is one
// line every few seconds.
type pacedBucket struct {
	mu     sync.Mutex
	bucket *tokenbucket.Bucket
	over   int       // events turned away since the last line
	warned time.Time // when that line was
}

// take takes a token, or says how long until one is there; when it turns
// one away and 5 seconds have passed since the last line, it calls warn
// with the bucket and the events turned away since.
func (p *pacedBucket) take(warn func(b *tokenbucket.Bucket, over int)) (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	ok, wait := p.bucket.Take(now)
	if ok {
		return 0, true
	}
	p.over++
	if now.Sub(p.warned) > 5*time.Second {
		warn(p.bucket, p.over)
		p.warned, p.over = now, 0
	}
	return wait, false
}

func (l *rateListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// requestRate is one lane's or agent's rate of requests, on its own API
// socket and its egress proxy together.
type requestRate struct {
	role     string
	log      *slog.Logger
	paced    pacedBucket
	detailAt string // the refusal's detail without its wait, made once
}

// newRequestRates are a request rate for each lane and each agent, by
// role name.
func newRequestRates(table *roles.Table, rate, burst int, log *slog.Logger) map[string]*requestRate {
	out := map[string]*requestRate{}
	for _, r := range table.Roles {
		if r.Kind == roles.Lane || r.Kind == roles.Agent {
			out[r.Name] = &requestRate{role: r.Name, log: log, paced: pacedBucket{bucket: tokenbucket.New(rate, burst)},
				detailAt: fmt.Sprintf("%s made more requests than its api.request_rate of %d a second (api.request_burst %d at once); this one is refused before it is read", r.Name, rate, burst)}
		}
	}
	return out
}

// admit takes the role's turn for one request, or says how long until it
// has one.
func (q *requestRate) admit() (time.Duration, bool) {
	return q.paced.take(func(b *tokenbucket.Bucket, refused int) {
		q.log.Warn("a role's requests are over its request rate: refused with 429", "role", q.role, "request_rate", b.Rate(), "request_burst", b.Burst(), "refused_since_last", refused)
	})
}

// gate answers a request over the role's rate with 429 and closes its
// connection, before its token is looked up or a byte of its body read;
// it reports whether the request may go on. A nil rate (the operator's
// socket, TCP) admits everything.
func (q *requestRate) gate(w http.ResponseWriter, r *http.Request) bool {
	if q == nil {
		return true
	}
	wait, ok := q.admit()
	if ok {
		return true
	}
	w.Header().Set("Retry-After", strconv.Itoa(int((wait+time.Second-1)/time.Second)))
	refuse(w, r, http.StatusTooManyRequests, fmt.Sprintf("%s: try again in %s", q.detailAt, wait.Round(time.Millisecond)))
	return false
}

// rateGated serves next only within rate (an egress proxy's listener).
func rateGated(rate *requestRate, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rate.gate(w, r) {
			next.ServeHTTP(w, r)
		}
	})
}
