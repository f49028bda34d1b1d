package fetch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestFetchRefusesSchemes(t *testing.T) {
	var f Fetcher
	for _, c := range []struct{ url, scheme string }{
		{"ftp://198.51.100.7/file", "ftp"},
		{"file:///etc/passwd", "file"},
		{"gopher://198.51.100.7/", "gopher"},
		{"javascript:alert(1)", "javascript"},
		{"data:text/plain,hi", "data"},
		{"ws://198.51.100.7/", "ws"},
		{"//198.51.100.7/", ""},
	} {
		_, err := f.Fetch(context.Background(), c.url)
		var bad *BadURLError
		if !errors.As(err, &bad) {
			t.Errorf("Fetch(%s): %v; want a *BadURLError", c.url, err)
			continue
		}
		if want := fmt.Sprintf("scheme %q is not allowed", c.scheme); !strings.Contains(err.Error(), want) {
			t.Errorf("Fetch(%s): %q does not say %q", c.url, err, want)
		}
		if got := HTTPStatus(err); got != http.StatusBadRequest {
			t.Errorf("HTTPStatus(%v) = %d; want 400", err, got)
		}
	}
}

func TestFetchRefusesBadURLs(t *testing.T) {
	var f Fetcher
	for _, c := range []struct{ url, says string }{
		{"http://user:hunter2@198.51.100.7/", "userinfo"},
		{"https://user@198.51.100.7/", "userinfo"},
		{"http:///path", "no host"},
		{"http://:80/", "no host"},
		{"http:opaque", "no host"},
		{"http://[::1/", "not a URL"},
		{"http://198.51.100.7/%zz", "not a URL"},
	} {
		_, err := f.Fetch(context.Background(), c.url)
		var bad *BadURLError
		if !errors.As(err, &bad) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("Fetch(%s): %v; want a *BadURLError saying %q", c.url, err, c.says)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("Fetch(%s): the error shows the password: %v", c.url, err)
		}
		if got := HTTPStatus(err); got != http.StatusBadRequest {
			t.Errorf("HTTPStatus(%v) = %d; want 400", err, got)
		}
	}
}

// dialControl judges the address the socket is about to reach, in the form
// the dialer hands it over.
func TestDialControl(t *testing.T) {
	for _, c := range []struct {
		network, address, class string
	}{
		{"tcp4", "127.0.0.1:80", "loopback"},
		{"tcp6", "[::1]:443", "loopback"},
		{"tcp6", "[fe80::1%lo]:80", "link-local"},
		{"tcp4", "169.254.169.254:80", "link-local"},
		{"tcp4", "10.1.2.3:8080", "private"},
		{"tcp6", "[::ffff:127.0.0.1]:80", "ipv4-mapped"},
		{"tcp4", "0.0.0.0:80", "unspecified"},
	} {
		err := dialControl(c.network, c.address, nil)
		var refused *RefusedError
		if !errors.As(err, &refused) || refused.Class != c.class {
			t.Errorf("dialControl(%s, %s) = %v; want a %s refusal", c.network, c.address, err, c.class)
		}
	}
	for _, address := range []string{"198.51.100.7:80", "[2001:db8::7]:443", "8.8.8.8:53"} {
		if err := dialControl("tcp", address, nil); err != nil {
			t.Errorf("dialControl(tcp, %s) = %v; want nil", address, err)
		}
	}
	// Fail closed on anything it cannot read, and on anything but TCP.
	for _, c := range [][2]string{{"tcp", "localhost:80"}, {"tcp", "garbage"}, {"udp4", "198.51.100.7:53"}, {"unix", "/run/x.sock"}} {
		if err := dialControl(c[0], c[1], nil); err == nil {
			t.Errorf("dialControl(%s, %s) = nil; want an error", c[0], c[1])
		}
	}
}

// Without a namespace: address literals are refused before anything is
// dialed, so a real loopback listener never sees a connection. (The
// namespace test, TestNetwork, covers the same and everything that needs an
// allowed server.)
func TestFetchRefusesLiteralsWithoutConnecting(t *testing.T) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	cl := &countingListener{Listener: l}
	go func() {
		for {
			c, err := cl.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { l.Close() })
	port := fmt.Sprint(l.Addr().(*net.TCPAddr).Port)

	f := &Fetcher{Timeout: 5 * time.Second}
	for _, c := range []struct{ host, addr, class string }{
		{"127.0.0.1", "127.0.0.1", "loopback"},
		{"127.1", "127.0.0.1", "loopback"},
		{"127.0.0.1.", "127.0.0.1", "loopback"},
		{"2130706433", "127.0.0.1", "loopback"},
		{"0x7f.0.0.1", "127.0.0.1", "loopback"},
		{"[::ffff:127.0.0.1]", "::ffff:127.0.0.1", "ipv4-mapped"},
		{"0.0.0.0", "0.0.0.0", "unspecified"},
		{"0", "0.0.0.0", "unspecified"},
		{"[::1]", "::1", "loopback"},
		{"[::]", "::", "unspecified"},
	} {
		u := "http://" + c.host + ":" + port + "/secret"
		_, err := f.Fetch(context.Background(), u)
		checkRefused(t, err, u, c.addr, c.class)
	}
	if n := cl.accepted.Load(); n != 0 {
		t.Errorf("the loopback listener accepted %d connections; want 0", n)
	}
}

// checkRefused asserts err is a refusal of url at addr, of class, that
// reads as the issue says and maps to 403.
func checkRefused(t *testing.T, err error, url, addr, class string) {
	t.Helper()
	var refused *RefusedError
	if !errors.As(err, &refused) {
		t.Errorf("Fetch(%s): %v; want a *RefusedError", url, err)
		return
	}
	if refused.Class != class || refused.Addr != netip.MustParseAddr(addr) || refused.URL != url {
		t.Errorf("Fetch(%s): refused %+v; want URL %s, Addr %s, Class %s", url, refused, url, addr, class)
	}
	want := fmt.Sprintf("fetch: %s: %s is %s %s address: refused", url, addr, article(class), class)
	if class == ClassHost {
		want = fmt.Sprintf("fetch: %s: %s is an address of this host: refused", url, addr)
	}
	if err.Error() != want {
		t.Errorf("Fetch(%s): error %q; want %q", url, err, want)
	}
	if got := HTTPStatus(err); got != http.StatusForbidden {
		t.Errorf("HTTPStatus(%v) = %d; want 403", err, got)
	}
}

func TestRefusedErrorMessage(t *testing.T) {
	for _, c := range []struct {
		e    RefusedError
		want string
	}{
		{RefusedError{URL: "http://x/", Host: "x", Addr: netip.MustParseAddr("127.0.0.1"), Class: "loopback"},
			"fetch: http://x/: 127.0.0.1 is a loopback address: refused"},
		{RefusedError{URL: "http://[::ffff:127.0.0.1]/", Addr: netip.MustParseAddr("::ffff:127.0.0.1"), Class: "ipv4-mapped"},
			"fetch: http://[::ffff:127.0.0.1]/: ::ffff:127.0.0.1 is an ipv4-mapped address: refused"},
		{RefusedError{Host: "db.internal", Addr: netip.MustParseAddr("10.0.0.5"), Class: "private"},
			"fetch: db.internal: 10.0.0.5 is a private address: refused"},
		{RefusedError{Addr: netip.MustParseAddr("::"), Class: "unspecified"},
			"fetch: :: is an unspecified address: refused"},
	} {
		if got := c.e.Error(); got != c.want {
			t.Errorf("Error() = %q; want %q", got, c.want)
		}
	}
}

func TestHTTPStatus(t *testing.T) {
	refused := &RefusedError{URL: "http://x/", Addr: netip.MustParseAddr("127.0.0.1"), Class: "loopback"}
	for _, c := range []struct {
		err  error
		want int
	}{
		{nil, 200},
		{refused, 403},
		{fmt.Errorf("api: %w", refused), 403},
		{&BadURLError{URL: "ftp://x/", Reason: "scheme"}, 400},
		{&TooLargeError{URL: "http://x/", Limit: 5}, 413},
		{&TimeoutError{URL: "http://x/", Limit: time.Second}, 504},
		{fmt.Errorf("fetch: http://x/: %w (MaxRedirects 5)", ErrTooManyRedirects), 502},
		{errors.New("dial tcp: connection refused"), 502},
	} {
		if got := HTTPStatus(c.err); got != c.want {
			t.Errorf("HTTPStatus(%v) = %d; want %d", c.err, got, c.want)
		}
	}
	if !errors.Is(&TimeoutError{}, context.DeadlineExceeded) {
		t.Error("a *TimeoutError is not context.DeadlineExceeded")
	}
}

func TestDefaults(t *testing.T) {
	var f Fetcher
	if f.maxBytes() != 5<<20 || f.timeout() != 20*time.Second || f.maxRedirects() != 5 || f.userAgent() == "" {
		t.Errorf("zero Fetcher: MaxBytes %d, Timeout %v, MaxRedirects %d, UserAgent %q",
			f.maxBytes(), f.timeout(), f.maxRedirects(), f.userAgent())
	}
	if got := (&Fetcher{MaxRedirects: -1}).maxRedirects(); got != 0 {
		t.Errorf("MaxRedirects -1: %d redirects followed; want 0", got)
	}
	tr := f.transport()
	if tr.Proxy != nil {
		t.Error("the transport takes a proxy")
	}
}
