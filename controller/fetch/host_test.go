package fetch

import (
	"errors"
	"net"
	"net/netip"
	"testing"
)

// Every address an interface of this machine holds is the host's, and so
// is every address of 127.0.0.0/8, which only a local route names; a
// documentation address nothing holds is not.
func TestHostAddress(t *testing.T) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, ia := range addrs {
		n, ok := ia.(*net.IPNet)
		if !ok {
			continue
		}
		a, _ := netip.AddrFromSlice(n.IP)
		a = a.Unmap()
		own, err := HostAddress(a)
		if err != nil || !own {
			t.Errorf("HostAddress(%s), an interface's address: %v, %v; want true", a, own, err)
		}
		if _, refused := Classify(a); !refused {
			// The fetcher refuses it though its range is public.
			var r *RefusedError
			if err := checkAddr(a); !errors.As(err, &r) || r.Class != ClassHost {
				t.Errorf("checkAddr(%s): %v; want a %s refusal", a, err, ClassHost)
			}
		}
	}
	if own, err := HostAddress(netip.MustParseAddr("127.0.0.9")); err != nil || !own {
		t.Errorf("HostAddress(127.0.0.9), on the local route of 127.0.0.0/8 only: %v, %v; want true", own, err)
	}
	for _, s := range []string{"198.51.100.250", "2001:db8::fe"} {
		if own, err := HostAddress(netip.MustParseAddr(s)); err != nil || own {
			t.Errorf("HostAddress(%s): %v, %v; want false", s, own, err)
		}
	}
}
