package broker

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"

	"thermite/internal/rpc"
	"thermite/internal/spawn"
	"thermite/roles"
)

// Agent egress: where the rig lists model providers (agent.egress), each
// role that may run an agent program gets a network namespace of its own
// with only lo up, whose one listener is the controller's egress proxy on
// 127.0.0.1:agent.egress_port. Its commands in egress mode start in that
// namespace, with TCP connect allowed to that port alone (seccomp: TCP
// sockets; Landlock: that port). Every other TCP address fails there:
// another port by Landlock (EACCES), any address beyond lo by the empty
// routing table (ENETUNREACH). The listener the connection came in on
// tells the controller whose trial it serves.

// egressNet is one role's network namespace and its proxy's listener.
type egressNet struct {
	ns       *os.File // the namespace, as /proc/thread-self/ns/net opened it
	listener *os.File // a listening TCP socket on 127.0.0.1 made inside ns
	addr     string
}

func (n *egressNet) close() {
	n.ns.Close()
	n.listener.Close()
}

// makeEgressNets makes the namespaces and listeners at start, for every
// role that egress mode may apply to. One that cannot be made refuses the
// start, naming the key: agents never fall back to the host's network.
func (b *Broker) makeEgressNets() error {
	if len(b.cfg.Agent.Egress) == 0 {
		return nil
	}
	nets := map[string]*egressNet{}
	for _, r := range b.table.Roles {
		pol, err := roles.PolicyFor(r, b.cfg.Network, b.cfg.Perf)
		if err != nil {
			return err
		}
		if !roles.EgressFor(r, pol, b.cfg.Agent.Egress, true) {
			continue
		}
		n, err := newEgressNet(b.cfg.Agent.EgressPort)
		if err != nil {
			for _, m := range nets {
				m.close()
			}
			return fmt.Errorf("agent.egress: the network namespace of %s: %w (agents get their egress proxy only in a namespace of their own: run the broker where it may make one, or leave agent.egress empty)", r.Name, err)
		}
		nets[r.Name] = n
	}
	b.listeners.egress = nets
	b.log.Info("agent egress namespaces made", "roles", len(nets), "proxy", "127.0.0.1:"+fmt.Sprint(b.cfg.Agent.EgressPort))
	return nil
}

// onNetNSThread runs f on a locked thread of its own that join has moved
// into another network namespace: network namespaces are per thread.
// Afterwards the thread goes back to the namespace it came from and only
// then to the Go scheduler; where it cannot, it stays locked, and the
// runtime ends it with its goroutine (or, the main thread, parks it for
// good): no thread in the wrong namespace ever runs other work.
func onNetNSThread(join func() error, f func()) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- fmt.Errorf("the broker's network namespace: %w", err)
			return
		}
		defer home.Close()
		if err := join(); err != nil {
			if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) == nil {
				runtime.UnlockOSThread()
			}
			errc <- err
			return
		}
		f()
		if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- nil
	}()
	return <-errc
}

// newEgressNet makes a network namespace, brings lo up there and listens
// on 127.0.0.1:port. A socket belongs to the namespace it was made in,
// whichever thread uses it later.
func newEgressNet(port int) (*egressNet, error) {
	var n *egressNet
	var ferr error
	err := onNetNSThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
		}
		return nil
	}, func() { n, ferr = inNewNetNS(port) })
	if err != nil {
		return nil, err
	}
	return n, ferr
}

// inNewNetNS is newEgressNet on the thread that has just made the
// namespace.
func inNewNetNS(port int) (*egressNet, error) {
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /proc/thread-self/ns/net: %w", err)
	}
	n := &egressNet{ns: os.NewFile(uintptr(fd), "netns"), addr: fmt.Sprintf("127.0.0.1:%d", port)}
	if err := loopbackUp(); err != nil {
		n.ns.Close()
		return nil, err
	}
	l, err := listenLoopback(port)
	if err != nil {
		n.ns.Close()
		return nil, err
	}
	n.listener = l
	return n, nil
}

// loopbackUp sets IFF_UP on lo: a new namespace's lo is down, and with
// it down even 127.0.0.1 is unreachable.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("lo: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("lo: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo: SIOCGIFFLAGS: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo: SIOCSIFFLAGS: %w", err)
	}
	return nil
}

// listenLoopback makes the proxy's listening socket, plain (no Go
// poller): the broker never accepts on it, the controller does.
func listenLoopback(port int) (*os.File, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("listen 127.0.0.1:%d: %w", port, err)
	}
	err = unix.Bind(fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}})
	if err == nil {
		err = unix.Listen(fd, 128)
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("listen 127.0.0.1:%d: %w", port, err)
	}
	return os.NewFile(uintptr(fd), "egress-proxy"), nil
}

// egressListeners hands the controller each role's proxy listener, as
// slots from rpc.EgressFirstFD on, and says which is whose.
func (b *Broker) egressListeners() ([]spawn.Slot, []rpc.EgressListener) {
	var slots []spawn.Slot
	var out []rpc.EgressListener
	for _, r := range b.table.Roles {
		n := b.listeners.egress[r.Name]
		if n == nil {
			continue
		}
		fd := rpc.EgressFirstFD + len(slots)
		out = append(out, rpc.EgressListener{Role: r.Name, FD: fd, Addr: n.addr})
		slots = append(slots, spawn.Slot{Name: "egress-" + r.Name, FD: fd, File: n.listener})
	}
	return slots, out
}
