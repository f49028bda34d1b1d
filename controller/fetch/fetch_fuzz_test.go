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
	"strings"
	"sync"
	"testing"
)

// ipv4Forms are the ways a URL's host can write the IPv4 address a, every
// one of which a browser (and inet_aton) reads as a: dotted quad, the
// short forms, one number, hex and octal parts, a trailing dot.
func ipv4Forms(a netip.Addr) []string {
	b := a.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	forms := []string{
		a.String(),
		fmt.Sprintf("%d.%d.%d", b[0], b[1], uint32(b[2])<<8|uint32(b[3])),
		fmt.Sprintf("%d.%d", b[0], v&0xffffff),
		fmt.Sprint(v),
		fmt.Sprintf("0x%x", v),
		fmt.Sprintf("0X%X", v),
		fmt.Sprintf("0%o", v),
		fmt.Sprintf("0x%x.0x%x.0x%x.0x%x", b[0], b[1], b[2], b[3]),
		fmt.Sprintf("0%o.0%o.0%o.0%o", b[0], b[1], b[2], b[3]),
		fmt.Sprintf("0x%02x.%d.0%o.%d", b[0], b[1], b[2], b[3]),
		fmt.Sprintf("%03d.%d.%d.%d", b[0], b[1], b[2], b[3]) + ".",
		a.String() + ".",
	}
	// A leading zero makes a part octal: "%03d" is only a's when its
	// first part has no octal reading of its own.
	if b[0] >= 8 {
		forms = append(forms[:10], forms[11:]...)
	}
	return forms
}

// ipv6Embeddings are IPv6 addresses that carry the IPv4 address a, each
// of which some path (mapping, NAT64, 6to4, the old compatible form)
// delivers to a.
func ipv6Embeddings(a netip.Addr) []netip.Addr {
	b := a.As4()
	var out []netip.Addr
	for _, pre := range [][]byte{
		{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff},       // ::ffff:a
		{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},             // ::a
		{0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0},    // 64:ff9b::a
		{0, 0x64, 0xff, 0x9b, 0, 1, 0, 0, 0, 0, 0, 0},    // 64:ff9b:1::a
		{0x20, 0x02, b[0], b[1], b[2], b[3], 0, 0, 0, 0}, // 2002:a::
	} {
		var x [16]byte
		copy(x[:], pre)
		if len(pre) == 12 {
			copy(x[12:], b[:])
		}
		out = append(out, netip.AddrFrom16(x))
	}
	return out
}

// refusedAt says whether dialing host (as a URL writes it, port 80) is
// refused as an address before anything connects. The context is
// already canceled, so that even an address let through connects to
// nothing.
func refusedAt(t *testing.T, f *Fetcher, host string) (bool, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c, err := f.dial(ctx, "tcp", net.JoinHostPort(host, "80"))
	if c != nil {
		c.Close()
		t.Fatalf("dial %s connected with a canceled context", host)
	}
	var refused *RefusedError
	return errors.As(err, &refused), err
}

// noNetwork is a resolver that answers no name, so that nothing a fuzzed
// host names is looked up anywhere.
var noNetwork = &net.Resolver{PreferGo: true, Dial: func(context.Context, string, string) (net.Conn, error) {
	return nil, errors.New("no network in a fuzz test")
}}

// FuzzAddressForms takes an address (4 or 16 bytes, and a zone) and
// checks the fetcher's verdict holds for every way of writing it: each
// IPv4 form reads back as the same address and gets the same verdict at
// dial time as the canonical form; an address refused in canonical form
// is refused in every form and every IPv6 embedding; the check at
// connect(2) agrees with the check on the literal.
func FuzzAddressForms(f *testing.F) {
	f.Add([]byte{127, 0, 0, 1}, "")
	f.Add([]byte{8, 8, 8, 8}, "")
	f.Add([]byte{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, "eth0")
	f.Fuzz(func(t *testing.T, raw []byte, zone string) {
		fe := &Fetcher{Resolver: noNetwork}
		var a netip.Addr
		switch len(raw) {
		case 4:
			a = netip.AddrFrom4([4]byte(raw))
		case 16:
			a = netip.AddrFrom16([16]byte(raw))
			if zone != "" && !strings.ContainsAny(zone, "%[]/ \x00") && !a.Is4In6() {
				a = a.WithZone(zone)
			}
		default:
			return
		}
		class, refused := Classify(a)
		if got, _ := Classify(a.WithZone("")); got != class {
			t.Fatalf("%s is %s, and %s without its zone", a, class, got)
		}
		if !refused {
			// An address of this host is refused whatever its class.
			own, err := HostAddress(a)
			refused = own || err != nil
		}
		if err := dialControl("tcp", netip.AddrPortFrom(a, 80).String(), nil); (err != nil) != refused {
			t.Fatalf("%s: Classify says refused=%v, the connect check says %v", a, refused, err)
		}
		if r, err := refusedAt(t, fe, a.String()); r != refused {
			t.Fatalf("%s: Classify says refused=%v, dial says %v", a, refused, err)
		}
		if a.Is6() {
			// A refused IPv6 address is refused however it is written.
			for _, s := range []string{strings.ToUpper(a.String()), a.StringExpanded()} {
				if r, err := refusedAt(t, fe, s); r != refused {
					t.Fatalf("%s written %s: refused=%v, dial says %v", a, s, refused, err)
				}
			}
			return
		}
		for _, s := range ipv4Forms(a) {
			got, ok := parseHostAddr(s)
			if !ok || got != a {
				t.Fatalf("%s written %s reads as %v (%v)", a, s, got, ok)
			}
			if r, err := refusedAt(t, fe, s); r != refused {
				t.Fatalf("%s written %s: refused=%v, dial says %v", a, s, refused, err)
			}
		}
		for _, e := range ipv6Embeddings(a) {
			c, r := Classify(e)
			if refused && !r {
				t.Fatalf("%s is refused (%s), but %s, which carries it, is %s", a, class, e, c)
			}
			if r, err := refusedAt(t, fe, e.String()); refused && !r {
				t.Fatalf("%s is refused, but dialing %s is not: %v", a, e, err)
			}
		}
	})
}

// fuzzRedirect is a transport whose first hop answers a redirect to
// Location, and whose later hops go to the fetcher's own transport, with
// every dial made on a canceled context: each address is judged, none is
// connected to.
type fuzzRedirect struct {
	t        *testing.T
	f        *Fetcher
	location string
	real     *http.Transport

	mu    sync.Mutex
	hops  int
	urls  []*url.URL
	dials []dialed
}

type dialed struct {
	address string
	err     error
}

func newFuzzRedirect(t *testing.T, f *Fetcher, location string) *fuzzRedirect {
	rt := &fuzzRedirect{t: t, f: f, location: location, real: f.transport()}
	rt.real.DialContext = func(ctx context.Context, network, address string) (net.Conn, error) {
		ctx, cancel := context.WithCancel(ctx)
		cancel()
		c, err := f.dial(ctx, network, address)
		if c != nil {
			c.Close()
			t.Fatalf("dial %s connected with a canceled context", address)
		}
		rt.mu.Lock()
		rt.dials = append(rt.dials, dialed{address, err})
		rt.mu.Unlock()
		return nil, err
	}
	return rt
}

func (rt *fuzzRedirect) RoundTrip(req *http.Request) (*http.Response, error) {
	rt.mu.Lock()
	hop := rt.hops
	rt.hops++
	rt.urls = append(rt.urls, req.URL)
	rt.mu.Unlock()
	if hop == 0 && rt.location != "" {
		return &http.Response{
			StatusCode: http.StatusFound,
			Header:     http.Header{"Location": {rt.location}},
			Body:       io.NopCloser(strings.NewReader("")),
			Request:    req,
		}, nil
	}
	return rt.real.RoundTrip(req)
}

// FuzzFetchURL takes a URL an agent asks for and where its first answer
// redirects, and follows them as Fetch does. Every URL a request goes to
// passes the URL check (http or https, no userinfo, a host), and every
// address dialed that is written as an address, in any form the dialer
// or a browser reads as one, is judged as that address: a refused one
// is refused before anything connects.
func FuzzFetchURL(f *testing.F) {
	f.Add("http://198.51.100.7/", "http://127.0.0.1/")
	f.Add("https://example.com/a", "/b")
	f.Add("http://[::1]/", "")
	f.Fuzz(func(t *testing.T, raw, location string) {
		fe := &Fetcher{Resolver: noNetwork}
		u, err := checkURL(raw)
		if err != nil {
			var bad *BadURLError
			if !errors.As(err, &bad) {
				t.Fatalf("checkURL(%q): %v is not a *BadURLError", raw, err)
			}
			return
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.User != nil || u.Hostname() == "" {
			t.Fatalf("checkURL(%q) accepted %s", raw, u)
		}
		rt := newFuzzRedirect(t, fe, location)
		client := &http.Client{Transport: rt, CheckRedirect: fe.checkRedirect}
		req, err := http.NewRequest(http.MethodGet, u.String(), nil)
		if err != nil {
			return
		}
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			t.Fatalf("%s: a fetch succeeded without a connection", u)
		}
		for i, hop := range rt.urls {
			if i == 0 {
				continue // the URL asked for, checked above
			}
			if _, err := checkURL(hop.String()); err != nil {
				t.Fatalf("a redirect reached %s, which the URL check refuses: %v", hop, err)
			}
		}
		for _, d := range rt.dials {
			host, _, err := net.SplitHostPort(d.address)
			if err != nil {
				continue
			}
			a, literal := parseHostAddr(host)
			if na, err := netip.ParseAddr(host); err == nil && (!literal || na != a) {
				t.Fatalf("the dialer reads %s as %s, the fetcher as %v (%v)", host, na, a, literal)
			}
			if !literal {
				continue
			}
			var refused *RefusedError
			if _, r := Classify(a); r && !errors.As(d.err, &refused) {
				t.Fatalf("dialing %s (%s) was not refused: %v", d.address, a, d.err)
			}
		}
	})
}
