package fetch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"time"
)

// RefusedError: the fetch would have connected to an address that is not
// public. URL is the hop that was refused (after a redirect, the redirect's
// target), Host the host as that URL gives it.
type RefusedError struct {
	URL   string
	Host  string
	Addr  netip.Addr
	Class string
}

func (e *RefusedError) Error() string {
	where := e.URL
	if where == "" {
		where = e.Host
	}
	if e.Class == ClassHost {
		if where == "" {
			return fmt.Sprintf("fetch: %s is an address of this host: refused", e.Addr)
		}
		return fmt.Sprintf("fetch: %s: %s is an address of this host: refused", where, e.Addr)
	}
	if where == "" {
		return fmt.Sprintf("fetch: %s is %s %s address: refused", e.Addr, article(e.Class), e.Class)
	}
	return fmt.Sprintf("fetch: %s: %s is %s %s address: refused", where, e.Addr, article(e.Class), e.Class)
}

func article(class string) string {
	if class != "" && strings.IndexByte("aeiou", class[0]) >= 0 {
		return "an"
	}
	return "a"
}

// BadURLError: the URL (the one asked for, or a redirect's target) is not
// one the fetcher speaks to: not http or https, userinfo, no host, or not
// a URL at all.
type BadURLError struct {
	URL    string
	Reason string
	Err    error // the parse error, when there is one
}

func (e *BadURLError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("fetch: %q: %s: %v", e.URL, e.Reason, e.Err)
	}
	return fmt.Sprintf("fetch: %s: %s", e.URL, e.Reason)
}

func (e *BadURLError) Unwrap() error { return e.Err }

// TooLargeError: the body is longer than the fetcher's MaxBytes (and the
// fetcher does not truncate).
type TooLargeError struct {
	URL   string
	Limit int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("fetch: %s: the body is over the %d-byte limit (MaxBytes)", e.URL, e.Limit)
}

// TimeoutError: the whole fetch (every hop and the body) did not finish
// within the fetcher's Timeout.
type TimeoutError struct {
	URL   string
	Limit time.Duration
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("fetch: %s: not done within the %v limit (Timeout)", e.URL, e.Limit)
}

// Unwrap lets errors.Is(err, context.DeadlineExceeded) hold.
func (e *TimeoutError) Unwrap() error { return context.DeadlineExceeded }

// ErrTooManyRedirects is wrapped by the error of a fetch that was redirected
// more than MaxRedirects times.
var ErrTooManyRedirects = errors.New("too many redirects")

// HTTPStatus is the status the controller's API answers for a fetch that
// ended with err:
//
//	nil                  200 OK
//	*RefusedError        403 Forbidden (the address class is in the message)
//	*BadURLError         400 Bad Request (scheme, userinfo, no host, not a URL)
//	*TooLargeError       413 Content Too Large
//	*TimeoutError        504 Gateway Timeout (the upstream page was slow, not the client)
//	anything else        502 Bad Gateway (DNS failure, connection refused, TLS,
//	                     too many redirects, a broken upstream answer)
func HTTPStatus(err error) int {
	var (
		refused  *RefusedError
		badURL   *BadURLError
		tooLarge *TooLargeError
		timeout  *TimeoutError
	)
	switch {
	case err == nil:
		return http.StatusOK
	case errors.As(err, &refused):
		return http.StatusForbidden
	case errors.As(err, &badURL):
		return http.StatusBadRequest
	case errors.As(err, &tooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.As(err, &timeout):
		return http.StatusGatewayTimeout
	default:
		return http.StatusBadGateway
	}
}
