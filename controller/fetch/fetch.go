package fetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"syscall"
	"time"
)

// Defaults for a Fetcher's zero fields.
const (
	DefaultMaxBytes     = 5 << 20
	DefaultTimeout      = 20 * time.Second
	DefaultMaxRedirects = 5
	DefaultUserAgent    = "thermite-fetch/1"
)

// Fetcher fetches pages for agents. The zero value is ready to use; its
// fields are read at each Fetch.
type Fetcher struct {
	// MaxBytes is the most body bytes read; 0 means DefaultMaxBytes.
	MaxBytes int64
	// Truncate chooses what a longer body does: false (the default) fails
	// the fetch with a *TooLargeError; true keeps the first MaxBytes bytes
	// and sets Page.Truncated.
	Truncate bool
	// Timeout bounds the whole fetch: every hop, every dial, the body;
	// 0 means DefaultTimeout.
	Timeout time.Duration
	// MaxRedirects is the most redirects followed; 0 means
	// DefaultMaxRedirects, negative means none (the first is an error).
	MaxRedirects int
	// UserAgent is sent with every request; "" means DefaultUserAgent.
	UserAgent string
	// Resolver looks up host names; nil means net.DefaultResolver. Whatever
	// it answers, each address is checked again when the socket is dialed.
	Resolver *net.Resolver
}

// Page is one fetched page.
type Page struct {
	URL         string // the final URL, after redirects
	Requested   string // the URL asked for
	Status      int
	ContentType string
	FetchedAt   time.Time // when the final response's headers arrived (UTC)
	Body        []byte
	Truncated   bool // the body was cut at MaxBytes (only with Fetcher.Truncate)
}

func (f *Fetcher) maxBytes() int64 {
	if f.MaxBytes > 0 {
		return f.MaxBytes
	}
	return DefaultMaxBytes
}

func (f *Fetcher) timeout() time.Duration {
	if f.Timeout > 0 {
		return f.Timeout
	}
	return DefaultTimeout
}

func (f *Fetcher) maxRedirects() int {
	switch {
	case f.MaxRedirects > 0:
		return f.MaxRedirects
	case f.MaxRedirects < 0:
		return 0
	}
	return DefaultMaxRedirects
}

func (f *Fetcher) userAgent() string {
	if f.UserAgent != "" {
		return f.UserAgent
	}
	return DefaultUserAgent
}

// Fetch GETs rawURL and returns the page, whatever its status. It refuses
// (without connecting) any URL that is not http or https, carries userinfo,
// or leads, directly or through a redirect, to an address Classify refuses.
func (f *Fetcher) Fetch(ctx context.Context, rawURL string) (*Page, error) {
	u, err := checkURL(rawURL)
	if err != nil {
		return nil, err
	}
	requested := u.String()
	limit := f.timeout()
	fctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()

	// A transport per fetch: no connection outlives the fetch, and the
	// fields are read afresh each time.
	tr := f.transport()
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, CheckRedirect: f.checkRedirect}

	req, err := http.NewRequestWithContext(fctx, http.MethodGet, requested, nil)
	if err != nil {
		return nil, &BadURLError{URL: rawURL, Reason: "not a request URL", Err: err}
	}
	req.Header.Set("User-Agent", f.userAgent())
	req.Header.Set("Accept", "*/*")

	resp, err := client.Do(req)
	if err != nil {
		return nil, f.fetchError(ctx, fctx, requested, err)
	}
	defer resp.Body.Close()
	page := &Page{
		URL:         resp.Request.URL.String(),
		Requested:   requested,
		Status:      resp.StatusCode,
		ContentType: resp.Header.Get("Content-Type"),
		FetchedAt:   time.Now().UTC(),
	}

	limitBytes := f.maxBytes()
	if !f.Truncate && resp.ContentLength > limitBytes {
		return nil, &TooLargeError{URL: page.URL, Limit: limitBytes}
	}
	// One byte past the limit tells "exactly MaxBytes" from "more".
	body, err := io.ReadAll(io.LimitReader(resp.Body, limitBytes+1))
	if err != nil {
		return nil, f.fetchError(ctx, fctx, page.URL, fmt.Errorf("reading the body: %w", err))
	}
	if int64(len(body)) > limitBytes {
		if !f.Truncate {
			return nil, &TooLargeError{URL: page.URL, Limit: limitBytes}
		}
		body, page.Truncated = body[:limitBytes], true
	}
	page.Body = body
	return page, nil
}

// fetchError turns what the client returned into one of the package's
// errors, naming the hop it happened at.
func (f *Fetcher) fetchError(parent, fctx context.Context, at string, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		at, err = ue.URL, ue.Err
	}
	var refused *RefusedError
	if errors.As(err, &refused) {
		r := *refused
		r.URL = at
		return &r
	}
	var badURL *BadURLError
	if errors.As(err, &badURL) {
		return badURL
	}
	if errors.Is(err, ErrTooManyRedirects) {
		return err
	}
	// Our deadline (or a timeout below it), not the caller's cancellation.
	var ne net.Error
	timedOut := errors.Is(fctx.Err(), context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
	if timedOut && parent.Err() == nil {
		return &TimeoutError{URL: at, Limit: f.timeout()}
	}
	return fmt.Errorf("fetch: %s: %w", at, err)
}

// checkURL refuses what the fetcher never speaks to; it runs on the URL
// asked for and on every redirect's target.
func checkURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, &BadURLError{URL: raw, Reason: "not a URL", Err: err}
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, &BadURLError{URL: raw, Reason: fmt.Sprintf("scheme %q is not allowed (only http and https)", u.Scheme)}
	}
	if u.User != nil {
		return nil, &BadURLError{URL: u.Redacted(), Reason: "userinfo in the URL is not allowed"}
	}
	if u.Hostname() == "" {
		return nil, &BadURLError{URL: raw, Reason: "no host"}
	}
	return u, nil
}

func (f *Fetcher) checkRedirect(req *http.Request, via []*http.Request) error {
	if n := f.maxRedirects(); len(via) > n {
		return fmt.Errorf("fetch: %s: %w (MaxRedirects %d)", via[0].URL, ErrTooManyRedirects, n)
	}
	_, err := checkURL(req.URL.String())
	return err
}

func (f *Fetcher) transport() *http.Transport {
	// No per-phase timeouts: the fetch's context bounds every phase, and
	// one clock makes one kind of timeout error.
	return &http.Transport{
		// Never from the environment: a proxy would connect for us, to
		// addresses the dial check never sees.
		Proxy:                  nil,
		DialContext:            f.dial,
		ForceAttemptHTTP2:      true,
		MaxResponseHeaderBytes: 1 << 20,
	}
}

// dial is the transport's only way out. A host that is an address literal
// (in any form a browser reads as one) is classified as written: the
// dialer would see ::ffff:127.0.0.1 as plain 127.0.0.1, and 127.1 as a name.
// Every socket, literal or resolved, then passes dialControl.
func (f *Fetcher) dial(ctx context.Context, network, address string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, fmt.Errorf("fetch: dial %s: %w", address, err)
	}
	target := address
	if a, ok := parseHostAddr(host); ok {
		if err := checkAddr(a); err != nil {
			return nil, withHost(err, host)
		}
		target = net.JoinHostPort(a.String(), port)
	}
	d := &net.Dialer{Resolver: f.Resolver, Control: dialControl}
	c, err := d.DialContext(ctx, network, target)
	if err != nil {
		return nil, withHost(err, host)
	}
	return c, nil
}

// dialControl runs for every socket just before connect(2), with the
// address the socket is about to reach: whatever a resolver answered, this
// is where the connection would go.
func dialControl(network, address string, _ syscall.RawConn) error {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return fmt.Errorf("fetch: dial %s %s: only tcp is allowed", network, address)
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("fetch: dial %s: not an address: %w", address, err)
	}
	return checkAddr(ap.Addr())
}

// checkAddr is the fetcher's decision on one address: refused if Classify
// refuses its class, or if it is an address of this host (HostAddress),
// whatever its range; refused too when that cannot be told.
func checkAddr(a netip.Addr) error {
	if class, refused := Classify(a); refused {
		return &RefusedError{Addr: a, Class: class}
	}
	own, err := HostAddress(a)
	if err != nil {
		return fmt.Errorf("fetch: %s: refused, since whether it is an address of this host cannot be told: %w", a, err)
	}
	if own {
		return &RefusedError{Addr: a, Class: ClassHost}
	}
	return nil
}

// withHost returns a refusal on its own (dropping the dialer's wrapping),
// with the host it was dialed for; any other error as it is.
func withHost(err error, host string) error {
	var refused *RefusedError
	if errors.As(err, &refused) {
		r := *refused
		r.Host = host
		return &r
	}
	return err
}
