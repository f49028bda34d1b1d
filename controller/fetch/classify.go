// Package fetch is the controller's page fetcher: it fetches a web page on
// behalf of an untrusted agent and archives it in the run's research folder.
//
// The one rule it enforces: it never connects to an address that is not a
// public one. The decision is Classify; it is applied to every socket address
// at dial time (net.Dialer.Control), on every redirect hop, so neither DNS
// rebinding nor a redirect to 127.0.0.1 gets past it. No proxy is taken from
// the environment, and only http and https are spoken.
package fetch

import (
	"net/netip"
	"strconv"
	"strings"
)

// refusedBlocks is the whole policy: every address in one of these blocks is
// refused, named by its class. The first match wins, so a single address is
// listed before the block that holds it. Documentation blocks (192.0.2/24,
// 198.51.100/24, 203.0.113/24, 2001:db8::/32) are deliberately absent: they
// are never routed, and tests use them as "public" addresses.
var refusedBlocks = []struct {
	prefix netip.Prefix
	class  string
}{
	// IPv4
	{pfx("0.0.0.0/32"), "unspecified"},
	{pfx("0.0.0.0/8"), "this-network"},
	{pfx("10.0.0.0/8"), "private"},
	{pfx("100.64.0.0/10"), "cgnat"},
	{pfx("127.0.0.0/8"), "loopback"},
	{pfx("169.254.0.0/16"), "link-local"},
	{pfx("172.16.0.0/12"), "private"},
	{pfx("192.0.0.0/24"), "ietf-protocol"},
	{pfx("192.88.99.0/24"), "6to4"}, // the 6to4 relay anycast block
	{pfx("192.168.0.0/16"), "private"},
	{pfx("198.18.0.0/15"), "benchmarking"},
	{pfx("224.0.0.0/4"), "multicast"},
	{pfx("255.255.255.255/32"), "broadcast"},
	{pfx("240.0.0.0/4"), "reserved"},

	// IPv6
	{pfx("::/128"), "unspecified"},
	{pfx("::1/128"), "loopback"},
	{pfx("::ffff:0:0/96"), "ipv4-mapped"}, // never unmapped: the form itself is refused
	{pfx("::/96"), "ipv4-compatible"},
	{pfx("64:ff9b::/96"), "nat64"},
	{pfx("64:ff9b:1::/48"), "nat64"},
	{pfx("2001::/32"), "teredo"},
	{pfx("2001:2::/48"), "benchmarking"},
	{pfx("2001::/23"), "ietf-protocol"},
	{pfx("2002::/16"), "6to4"},
	{pfx("fc00::/7"), "private"},
	{pfx("fe80::/10"), "link-local"},
	{pfx("fec0::/10"), "private"}, // deprecated site-local: the private block of its day
	{pfx("ff00::/8"), "multicast"},
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// Classify names the class of a and says whether the fetcher refuses it.
// Public addresses are ("public", false); an invalid one is ("invalid", true).
// An IPv4-mapped IPv6 address is not unmapped: it is refused as
// "ipv4-mapped" whatever IPv4 address it carries.
func Classify(a netip.Addr) (class string, refused bool) {
	if !a.IsValid() {
		return "invalid", true
	}
	// Prefix.Contains is false for any zoned address: drop the zone first.
	a = a.WithZone("")
	for _, r := range refusedBlocks {
		if r.prefix.Contains(a) {
			return r.class, true
		}
	}
	return "public", false
}

// parseHostAddr reads host as an address the way a browser's URL parser
// (and inet_aton) would: IPv6 and dotted-quad literals, and the short,
// octal, hex and trailing-dot IPv4 forms (127.1, 0x7f.1, 0177.0.0.1,
// 2130706433, 127.0.0.1.). Each reaches the same socket as its dotted quad,
// so each is classified as that address rather than handed to a resolver
// as a name.
func parseHostAddr(host string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(host); err == nil {
		return a, true
	}
	// One trailing dot is the root of the DNS tree, and a browser drops it.
	return parseIPv4Loose(strings.TrimSuffix(host, "."))
}

func parseIPv4Loose(s string) (netip.Addr, bool) {
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	var v uint64
	for i, p := range parts {
		n, ok := parseIPv4Part(p)
		if !ok {
			return netip.Addr{}, false
		}
		if i < len(parts)-1 {
			if n > 0xff {
				return netip.Addr{}, false
			}
			v = v<<8 | n
			continue
		}
		// The last part fills every byte the earlier ones left.
		rest := uint(4 - i)
		if n >= 1<<(8*rest) {
			return netip.Addr{}, false
		}
		v = v<<(8*rest) | n
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
}

func parseIPv4Part(p string) (uint64, bool) {
	base := 10
	switch {
	case len(p) > 2 && (p[:2] == "0x" || p[:2] == "0X"):
		base, p = 16, p[2:]
	case len(p) > 1 && p[0] == '0':
		base, p = 8, p[1:]
	}
	if p == "" || p[0] == '+' || p[0] == '-' {
		return 0, false
	}
	n, err := strconv.ParseUint(p, base, 32)
	return n, err == nil
}
