package netpolicy

import (
	"strings"
	"testing"
)

func TestParseNetworkAcceptsEachPolicy(t *testing.T) {
	for _, want := range All {
		got, err := ParseNetwork("network.lane", string(want))
		if err != nil || got != want {
			t.Errorf("%q: got %q, %v", want, got, err)
		}
	}
}

// A value that is no policy (a typo, another case, an empty value, the
// weakened test build's own "api-tcp") is refused in one line that names
// the key it came from and the values it may take.
func TestParseNetworkRefusesAnythingElseNamingTheKey(t *testing.T) {
	for _, bad := range []string{"", "Open", "opne", "api-tcp", "tcp", " none", "none\n"} {
		n, err := ParseNetwork("network.agent", bad)
		if err == nil {
			t.Errorf("%q accepted as %q", bad, n)
			continue
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "network.agent: ") || !strings.HasSuffix(msg, "is not one of none, api, open") {
			t.Errorf("%q: %q does not name the key and the accepted values", bad, msg)
		}
		if strings.Count(msg, "\n") != 0 {
			t.Errorf("%q: error is more than one line: %q", bad, msg)
		}
	}
	if err := Network("wide").Check("seccomp: network"); err == nil || !strings.HasPrefix(err.Error(), "seccomp: network: ") {
		t.Errorf("Check: %v", err)
	}
}

func TestOnlyOpenAllowsInet(t *testing.T) {
	for _, n := range All {
		if got, want := n.AllowsInet(), n == Open; got != want {
			t.Errorf("%s.AllowsInet() = %v", n, got)
		}
		if got, want := n.ReachesAPI(), n == API; got != want {
			t.Errorf("%s.ReachesAPI() = %v", n, got)
		}
	}
}
