package landlock

import (
	"strings"
	"testing"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
)

// TestEgressRuleSetConnectsToItsProxyPortAlone: egress mode handles TCP
// bind and connect and grants connect to the proxy's port only (no bind
// anywhere); a spec without the port is refused, never an open network.
func TestEgressRuleSetConnectsToItsProxyPortAlone(t *testing.T) {
	p, _, err := RolePolicy(RoleSpec{Network: "egress", EgressPort: 3128, DevRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if p.HandledNet != ll.AccessNetBindTCP|ll.AccessNetConnectTCP {
		t.Errorf("handled net %#x, want bind and connect", p.HandledNet)
	}
	if len(p.TCPPorts) != 1 || p.TCPPorts[3128] != ll.AccessNetConnectTCP {
		t.Errorf("TCP ports %v, want connect to 3128 alone", p.TCPPorts)
	}
	if _, _, err := RolePolicy(RoleSpec{Network: "egress", DevRoot: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "egress needs its proxy's port") {
		t.Errorf("egress without a port: %v", err)
	}
}
