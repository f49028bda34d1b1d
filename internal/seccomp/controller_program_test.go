//go:build linux && (amd64 || arm64)

package seccomp

import (
	"testing"

	"golang.org/x/sys/unix"
)

// The controller daemon's filter: what every role is refused, ptrace of
// any kind, and only the sockets it serves and fetches with.
func TestProgramController(t *testing.T) {
	m := vm(t, ControllerOptions())
	for name, nr := range deniedOutright {
		if got := verdict(t, m, sys(nr)); got != "EPERM" {
			t.Errorf("%s: %s, want EPERM", name, got)
		}
	}
	for _, c := range []struct {
		name string
		call call
		want string
	}{
		{"ptrace attach", sys(unix.SYS_PTRACE, unix.PTRACE_ATTACH, 1), "EPERM"},
		{"ptrace traceme", sys(unix.SYS_PTRACE, unix.PTRACE_TRACEME), "EPERM"},
		{"process_vm_readv", sys(unix.SYS_PROCESS_VM_READV, 1), "EPERM"},
		{"process_vm_writev", sys(unix.SYS_PROCESS_VM_WRITEV, 1), "EPERM"},
		{"clone a user namespace", sys(unix.SYS_CLONE, unix.CLONE_NEWUSER), "EPERM"},
		{"clone a thread", sys(unix.SYS_CLONE, unix.CLONE_VM|unix.CLONE_THREAD|unix.CLONE_SIGHAND), "allow"},
		{"clone3", sys(unix.SYS_CLONE3), "ENOSYS"},
		{"perf_event_open", sys(unix.SYS_PERF_EVENT_OPEN), "EPERM"},
		{"openat2 (the kit loader's RESOLVE_BENEATH)", sys(unix.SYS_OPENAT2), "allow"},
		{"shmget 0666", sys(unix.SYS_SHMGET, 0, 4096, unix.IPC_CREAT|0o666), "EPERM"},
		{"chmod set-uid", sys(unix.SYS_FCHMODAT, 3, 0, 0o4755), "EPERM"},
		{"unix stream", sys(unix.SYS_SOCKET, unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0), "allow"},
		{"tcp", sys(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0), "allow"},
		{"tcp6", sys(unix.SYS_SOCKET, unix.AF_INET6, unix.SOCK_STREAM, unix.IPPROTO_TCP), "allow"},
		{"udp (DNS)", sys(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0), "allow"},
		{"udp6", sys(unix.SYS_SOCKET, unix.AF_INET6, unix.SOCK_DGRAM, unix.IPPROTO_UDP), "allow"},
		{"ping socket", sys(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP), "EPERM"},
		{"raw ip", sys(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP), "EPERM"},
		{"mptcp", sys(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP), "EPERM"},
		{"sctp", sys(unix.SYS_SOCKET, unix.AF_INET6, unix.SOCK_STREAM, unix.IPPROTO_SCTP), "EPERM"},
		{"netlink route", sys(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE), "allow"},
		{"netlink audit", sys(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT), "EPERM"},
		{"netlink uevent", sys(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_DGRAM, unix.NETLINK_KOBJECT_UEVENT), "EPERM"},
		{"netlink route, garbage above the int", sys(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW, 0xffffffff00000000|unix.NETLINK_ROUTE), "allow"},
		{"packet", sys(unix.SYS_SOCKET, unix.AF_PACKET, unix.SOCK_RAW, 0), "EPERM"},
		{"vsock", sys(unix.SYS_SOCKET, unix.AF_VSOCK, unix.SOCK_STREAM, 0), "EPERM"},
		{"socketpair unix", sys(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_STREAM, 0, 0), "allow"},
		{"socketpair inet", sys(unix.SYS_SOCKETPAIR, unix.AF_INET, unix.SOCK_STREAM, 0, 0), "EPERM"},
		{"read", sys(unix.SYS_READ, 0, 0, 0), "allow"},
	} {
		if got := verdict(t, m, c.call); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}

func TestControllerOptionsRefuseARolePolicy(t *testing.T) {
	o := ControllerOptions()
	o.Network = NetworkOpen
	if _, err := Program(o); err == nil {
		t.Fatal("a controller filter with a role's network policy was built")
	}
}
