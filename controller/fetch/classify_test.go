package fetch

import (
	"net/netip"
	"testing"
)

func TestClassify(t *testing.T) {
	cases := []struct {
		addr  string
		class string
	}{
		{"127.0.0.1", "loopback"},
		{"127.255.255.254", "loopback"},
		{"::1", "loopback"},
		{"10.0.0.1", "private"},
		{"10.255.255.255", "private"},
		{"172.16.0.1", "private"},
		{"172.31.255.255", "private"},
		{"192.168.1.1", "private"},
		{"fc00::1", "private"},
		{"fd12:3456::1", "private"},
		{"fec0::1", "private"},
		{"169.254.169.254", "link-local"},
		{"fe80::1", "link-local"},
		{"fe80::1%eth0", "link-local"},
		{"224.0.0.1", "multicast"},
		{"239.255.255.250", "multicast"},
		{"ff02::1", "multicast"},
		{"ff0e::1", "multicast"},
		{"0.0.0.0", "unspecified"},
		{"::", "unspecified"},
		{"0.1.2.3", "this-network"},
		{"0.255.255.255", "this-network"},
		{"100.64.0.1", "cgnat"},
		{"100.127.255.255", "cgnat"},
		{"64:ff9b::7f00:1", "nat64"},
		{"64:ff9b::808:808", "nat64"},
		{"64:ff9b:1::1", "nat64"},
		{"2002:7f00:1::1", "6to4"},
		{"2002::1", "6to4"},
		{"192.88.99.1", "6to4"},
		{"2001::1", "teredo"},
		{"2001:0:4136:e378:8000:63bf:3fff:fdd2", "teredo"},
		{"::ffff:127.0.0.1", "ipv4-mapped"},
		{"::ffff:8.8.8.8", "ipv4-mapped"}, // a mapped public address is refused too
		{"::ffff:198.51.100.7", "ipv4-mapped"},
		{"::127.0.0.1", "ipv4-compatible"},
		{"::8.8.8.8", "ipv4-compatible"},
		{"::2", "ipv4-compatible"},
		{"255.255.255.255", "broadcast"},
		{"240.0.0.1", "reserved"},
		{"254.255.255.255", "reserved"},
		{"198.18.0.1", "benchmarking"},
		{"198.19.255.255", "benchmarking"},
		{"2001:2::1", "benchmarking"},
		{"192.0.0.1", "ietf-protocol"},
		{"192.0.0.170", "ietf-protocol"},
		{"2001:1::1", "ietf-protocol"},
	}
	for _, c := range cases {
		class, refused := Classify(netip.MustParseAddr(c.addr))
		if class != c.class || !refused {
			t.Errorf("Classify(%s) = %q, %v; want %q, true", c.addr, class, refused, c.class)
		}
	}
}

func TestClassifyPublic(t *testing.T) {
	for _, s := range []string{
		"8.8.8.8", "1.1.1.1", "93.184.215.14", "151.101.1.69", "2606:4700:4700::1111", "2a00:1450:4001:80b::200e",
		// Documentation blocks: allowed, so tests can use them as public addresses.
		"192.0.2.1", "198.51.100.7", "203.0.113.9", "2001:db8::1",
		// Just outside the refused blocks.
		"1.0.0.0", "9.255.255.255", "11.0.0.0", "100.63.255.255", "100.128.0.0",
		"126.255.255.255", "128.0.0.0", "169.253.255.255", "169.255.0.0",
		"172.15.255.255", "172.32.0.0", "191.255.255.255", "192.0.1.255", "192.0.3.0",
		"192.167.255.255", "192.169.0.0", "198.17.255.255", "198.20.0.0", "223.255.255.255",
		"2001:200::1", "2003::1", "fbff:ffff::1", "2000::1", "64:ff9b:2::1",
	} {
		class, refused := Classify(netip.MustParseAddr(s))
		if class != "public" || refused {
			t.Errorf("Classify(%s) = %q, %v; want public, false", s, class, refused)
		}
	}
}

func TestClassifyInvalid(t *testing.T) {
	if class, refused := Classify(netip.Addr{}); class != "invalid" || !refused {
		t.Errorf("Classify(zero Addr) = %q, %v; want invalid, true", class, refused)
	}
}

// Every class the issue names is in the table, spelled as it says.
func TestClassesNamed(t *testing.T) {
	have := map[string]bool{}
	for _, r := range refusedBlocks {
		have[r.class] = true
	}
	for _, c := range []string{"loopback", "private", "link-local", "multicast", "unspecified",
		"this-network", "cgnat", "nat64", "6to4", "teredo", "ipv4-mapped", "ipv4-compatible",
		"broadcast", "reserved", "benchmarking", "ietf-protocol"} {
		if !have[c] {
			t.Errorf("class %q is not in the table", c)
		}
		delete(have, c)
	}
	for c := range have {
		t.Errorf("class %q is in the table but not in the issue's list", c)
	}
}

func TestParseHostAddr(t *testing.T) {
	cases := []struct{ host, want string }{
		{"127.0.0.1", "127.0.0.1"},
		{"127.1", "127.0.0.1"},
		{"127.0.1", "127.0.0.1"},
		{"0x7f.1", "127.0.0.1"},
		{"0X7F.0.0.1", "127.0.0.1"},
		{"0177.0.0.1", "127.0.0.1"},
		{"2130706433", "127.0.0.1"},
		{"0x7f000001", "127.0.0.1"},
		{"017700000001", "127.0.0.1"},
		{"010.0.0.1", "8.0.0.1"}, // octal, as a browser reads it
		{"0", "0.0.0.0"},
		{"127.0.0.1.", "127.0.0.1"},
		{"127.1.", "127.0.0.1"},
		{"1.2.3.", "1.2.0.3"},
		{"10.1.65535", "10.1.255.255"},
		{"198.51.100.7", "198.51.100.7"},
		{"::ffff:127.0.0.1", "::ffff:127.0.0.1"},
		{"::1", "::1"},
		{"fe80::1%lo", "fe80::1%lo"},
	}
	for _, c := range cases {
		a, ok := parseHostAddr(c.host)
		if !ok || a.String() != c.want {
			t.Errorf("parseHostAddr(%q) = %v, %v; want %s", c.host, a, ok, c.want)
		}
	}
	for _, name := range []string{"example.com", "loop.test", "1.2.3.4.5", "256.1.1.1", "1.2.3.256",
		"4294967296", "1.16777216", "0x", "08", "1..1", "1.2.3..", ".1", "127.0.0.1..", "+1", "1.-1", "", "localhost"} {
		if a, ok := parseHostAddr(name); ok {
			t.Errorf("parseHostAddr(%q) = %v; want a name, not an address", name, a)
		}
	}
}
