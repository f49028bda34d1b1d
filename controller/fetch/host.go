package fetch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// ClassHost is the class of an address of this host: one an interface
// holds, or one the kernel's routing delivers locally. Whatever its range
// (a public one too), a connection to it reaches the host's own services.
const ClassHost = "this-host"

// HostAddress decides whether a is an address of this host, asked afresh
// at every dial: an address of any interface (net.InterfaceAddrs), or one
// for which the kernel's route lookup answers a local route (RTN_LOCAL: an
// interface's address, or any address of a `local` route such as
// `ip route add local 203.0.113.0/24 dev lo`). An error means it cannot
// tell, and the caller refuses.
func HostAddress(a netip.Addr) (bool, error) {
	a = a.WithZone("")
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false, fmt.Errorf("the host's interface addresses: %w", err)
	}
	for _, ia := range addrs {
		var ip net.IP
		switch v := ia.(type) {
		case *net.IPNet:
			ip = v.IP
		case *net.IPAddr:
			ip = v.IP
		}
		if h, ok := netip.AddrFromSlice(ip); ok && h.Unmap() == a.Unmap() {
			return true, nil
		}
	}
	typ, err := routeType(a)
	if err != nil {
		return false, fmt.Errorf("the kernel's route to %s: %w", a, err)
	}
	return typ == unix.RTN_LOCAL, nil
}

var netlinkSeq atomic.Uint32

// routeType asks the kernel (rtnetlink RTM_GETROUTE, as `ip route get`
// does) for the type of the route it would take to a: RTN_LOCAL for the
// host's own addresses. No route at all (ENETUNREACH, EHOSTUNREACH) is
// RTN_UNREACHABLE: nothing local there.
func routeType(a netip.Addr) (uint8, error) {
	family, bits := uint8(unix.AF_INET), uint8(32)
	if a.Is6() && !a.Is4In6() {
		family, bits = unix.AF_INET6, 128
	} else {
		a = a.Unmap()
	}
	dst := a.AsSlice()
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return 0, fmt.Errorf("netlink socket: %w", err)
	}
	defer unix.Close(fd)
	// A kernel that does not answer must not hold the dial for ever.
	tv := unix.Timeval{Sec: 2}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return 0, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("netlink bind: %w", err)
	}
	seq := netlinkSeq.Add(1)
	// nlmsghdr (16 bytes), rtmsg (12), one rtattr RTA_DST (4 + the address).
	attrLen := unix.SizeofRtAttr + len(dst)
	msg := make([]byte, unix.SizeofNlMsghdr+unix.SizeofRtMsg+attrLen)
	ne := binary.NativeEndian
	ne.PutUint32(msg[0:], uint32(len(msg)))
	ne.PutUint16(msg[4:], unix.RTM_GETROUTE)
	ne.PutUint16(msg[6:], unix.NLM_F_REQUEST)
	ne.PutUint32(msg[8:], seq)
	rtm := msg[unix.SizeofNlMsghdr:]
	rtm[0], rtm[1] = family, bits // rtm_family, rtm_dst_len
	attr := rtm[unix.SizeofRtMsg:]
	ne.PutUint16(attr[0:], uint16(attrLen))
	ne.PutUint16(attr[2:], unix.RTA_DST)
	copy(attr[unix.SizeofRtAttr:], dst)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("netlink send: %w", err)
	}
	buf := make([]byte, 1<<16)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return 0, fmt.Errorf("netlink receive: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return 0, fmt.Errorf("netlink answer: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return 0, errors.New("netlink answer: a short error")
				}
				errno := unix.Errno(-int32(ne.Uint32(m.Data)))
				switch errno {
				case 0:
					continue
				case unix.ENETUNREACH, unix.EHOSTUNREACH:
					return unix.RTN_UNREACHABLE, nil
				}
				return 0, errno
			case unix.RTM_NEWROUTE:
				if len(m.Data) < unix.SizeofRtMsg {
					return 0, errors.New("netlink answer: a short route")
				}
				return m.Data[7], nil // rtm_type
			}
		}
	}
}
