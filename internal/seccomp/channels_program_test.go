//go:build linux && (amd64 || arm64)

package seccomp

import (
	"testing"

	"golang.org/x/sys/unix"

	"thermite/internal/netpolicy"
)

// With NoUnixSockets (the judge's users) socket(AF_UNIX) is refused under
// every network policy, whatever its type and high bits; socketpair makes
// an AF_UNIX pair still, and every other family is decided by the policy
// as before.
func TestProgramNoUnixSockets(t *testing.T) {
	for _, policy := range []netpolicy.Network{NetworkNone, NetworkAPI, NetworkEgress, NetworkOpen} {
		m := vm(t, Options{Network: policy, NoUnixSockets: true})
		for _, typ := range []uint64{unix.SOCK_STREAM, unix.SOCK_DGRAM | unix.SOCK_CLOEXEC, unix.SOCK_SEQPACKET} {
			for _, domain := range []uint64{unix.AF_UNIX, 0xffffffff00000000 | unix.AF_UNIX} {
				if got := verdict(t, m, sys(unix.SYS_SOCKET, domain, typ, 0)); got != "EPERM" {
					t.Errorf("%s: socket(%#x, %#x): %s, want EPERM", policy, domain, typ, got)
				}
			}
		}
		if got := verdict(t, m, sys(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0, 0)); got != "allow" {
			t.Errorf("%s: socketpair(AF_UNIX): %s, want allow", policy, got)
		}
		wantTCP := map[netpolicy.Network]string{NetworkNone: "EPERM", NetworkAPI: "EPERM", NetworkEgress: "allow", NetworkOpen: "allow"}[policy]
		if got := verdict(t, m, sys(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM, 0)); got != wantTCP {
			t.Errorf("%s: socket(AF_INET, SOCK_STREAM): %s, want %s", policy, got, wantTCP)
		}
		// Without the option the same policy allows AF_UNIX.
		plain := vm(t, Options{Network: policy})
		if got := verdict(t, plain, sys(unix.SYS_SOCKET, unix.AF_UNIX, unix.SOCK_STREAM, 0)); got != "allow" {
			t.Errorf("%s without NoUnixSockets: socket(AF_UNIX): %s, want allow", policy, got)
		}
	}
}

// With NoWatches inotify, fanotify and fcntl(F_NOTIFY) are refused, and
// the rest of fcntl is as before: F_SETSIG refused a stop signal only.
// Without it they pass.
func TestProgramNoWatches(t *testing.T) {
	watches := map[string]int{
		"inotify_init1": unix.SYS_INOTIFY_INIT1, "inotify_add_watch": unix.SYS_INOTIFY_ADD_WATCH,
		"fanotify_init": unix.SYS_FANOTIFY_INIT, "fanotify_mark": unix.SYS_FANOTIFY_MARK,
	}
	if sysInotifyInit != noSyscall {
		watches["inotify_init"] = sysInotifyInit
	}
	for _, noWatches := range []bool{true, false} {
		m := vm(t, Options{Network: NetworkAPI, NoWatches: noWatches})
		want := map[bool]string{true: "EPERM", false: "allow"}[noWatches]
		for name, nr := range watches {
			if got := verdict(t, m, sys(nr, 0, 0, 0)); got != want {
				t.Errorf("NoWatches %v: %s: %s, want %s", noWatches, name, got, want)
			}
		}
		fcntls := []struct {
			what      string
			cmd, arg  uint64
			want      string
			watchOnly bool
		}{
			{"F_NOTIFY", unix.F_NOTIFY, dnAccess | dnMultishot, "EPERM", true},
			{"F_NOTIFY, high bits", 0xffffffff00000000 | unix.F_NOTIFY, dnAccess, "EPERM", true},
			{"F_SETSIG SIGSTOP", unix.F_SETSIG, uint64(unix.SIGSTOP), "EPERM", false},
			{"F_SETSIG SIGUSR1", unix.F_SETSIG, uint64(unix.SIGUSR1), "allow", false},
			{"F_GETFL", unix.F_GETFL, 0, "allow", false},
			{"F_SETLK", unix.F_SETLK, 0, "allow", false},
		}
		for _, c := range fcntls {
			want := c.want
			if c.watchOnly && !noWatches {
				want = "allow"
			}
			if got := verdict(t, m, sys(unix.SYS_FCNTL, 3, c.cmd, c.arg)); got != want {
				t.Errorf("NoWatches %v: fcntl(%s): %s, want %s", noWatches, c.what, got, want)
			}
		}
	}
}

// The controller's filter takes neither option: they are a role's.
func TestControllerTakesNoChannelOptions(t *testing.T) {
	for _, o := range []Options{{Controller: true, NoUnixSockets: true}, {Controller: true, NoWatches: true}} {
		if _, err := Program(o); err == nil {
			t.Errorf("%+v: built, want refused", o)
		}
	}
}

// dnotify's flags (linux/fcntl.h), which x/sys/unix does not name.
const (
	dnAccess    = 0x00000001
	dnMultishot = 0x80000000
)
