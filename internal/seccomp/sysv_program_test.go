//go:build linux && (amd64 || arm64)

package seccomp

import (
	"testing"

	"golang.org/x/sys/unix"
)

// Issue 12's SysV IPC rules, in the virtual machine: a *get that grants
// group or other any permission, and IPC_SET, are refused; everything else
// about IPC passes.
func TestProgramSysVIPC(t *testing.T) {
	const (
		creat  = unix.IPC_CREAT
		excl   = unix.IPC_EXCL
		ipc64  = 0x100
		hiJunk = 0xffffffff00000000
	)
	type getCall struct {
		name string
		make func(flags uint64) call
	}
	gets := []getCall{
		{"shmget", func(f uint64) call { return sys(unix.SYS_SHMGET, unix.IPC_PRIVATE, 4096, f) }},
		{"msgget", func(f uint64) call { return sys(unix.SYS_MSGGET, unix.IPC_PRIVATE, f) }},
		{"semget", func(f uint64) call { return sys(unix.SYS_SEMGET, unix.IPC_PRIVATE, 1, f) }},
	}
	flags := map[uint64]string{
		creat | 0o666: "EPERM", creat | 0o640: "EPERM", creat | 0o604: "EPERM",
		creat | 0o610: "EPERM", creat | 0o601: "EPERM", creat | excl | 0o660: "EPERM",
		0o666:                  "EPERM", // opening an existing object for others' access
		hiJunk | creat | 0o644: "EPERM",
		creat | 0o600:          "allow", creat | excl | 0o600: "allow", creat | 0o400: "allow",
		0: "allow", 0o600: "allow",
		hiJunk | creat | 0o600: "allow", // bits the kernel never reads
	}
	ctls := []struct {
		name string
		make func(cmd uint64) call
	}{
		{"shmctl", func(cmd uint64) call { return sys(unix.SYS_SHMCTL, 7, cmd, 0) }},
		{"msgctl", func(cmd uint64) call { return sys(unix.SYS_MSGCTL, 7, cmd, 0) }},
		{"semctl", func(cmd uint64) call { return sys(unix.SYS_SEMCTL, 7, 0, cmd, 0) }},
	}
	cmds := map[uint64]string{
		unix.IPC_SET: "EPERM", unix.IPC_SET | ipc64: "EPERM", hiJunk | unix.IPC_SET: "EPERM",
		unix.IPC_RMID: "allow", unix.IPC_STAT: "allow", unix.IPC_STAT | ipc64: "allow",
		3 /* IPC_INFO */ : "allow", unix.IPC_RMID | ipc64: "allow",
		unix.IPC_SET << 32: "allow", // the kernel sees IPC_RMID
	}
	for _, o := range allOptions {
		m := vm(t, o)
		for _, g := range gets {
			for f, want := range flags {
				if got := verdict(t, m, g.make(f)); got != want {
					t.Errorf("%+v: %s flags %#o: %s, want %s", o, g.name, f, got, want)
				}
			}
		}
		for _, c := range ctls {
			for cmd, want := range cmds {
				if got := verdict(t, m, c.make(cmd)); got != want {
					t.Errorf("%+v: %s cmd %#x: %s, want %s", o, c.name, cmd, got, want)
				}
			}
		}
		// The rest of SysV IPC, and POSIX queues' calls, are not this rule's.
		for name, c := range map[string]call{
			"shmat": sys(unix.SYS_SHMAT, 7, 0, 0), "shmdt": sys(unix.SYS_SHMDT, 0),
			"msgsnd": sys(unix.SYS_MSGSND, 7, 0, 0, 0), "msgrcv": sys(unix.SYS_MSGRCV, 7, 0, 0, 0, 0),
			"semop": sys(unix.SYS_SEMOP, 7, 0, 1), "semtimedop": sys(unix.SYS_SEMTIMEDOP, 7, 0, 1, 0),
		} {
			if got := verdict(t, m, c); got != "allow" {
				t.Errorf("%+v: %s: %s, want allow", o, name, got)
			}
		}
	}
}

// Issue 12's openat2 rule: ENOSYS (so callers fall back to openat, whose
// mode is checked) for every command but the lane's file helper.
func TestProgramOpenat2(t *testing.T) {
	for _, o := range allOptions {
		for _, helper := range []bool{false, true} {
			o.FileHelper = helper
			want := "ENOSYS"
			if helper {
				want = "allow"
			}
			m := vm(t, o)
			for _, c := range []call{sys(unix.SYS_OPENAT2), sys(unix.SYS_OPENAT2, atFDCWD, 0, 0, 24)} {
				if got := verdict(t, m, c); got != want {
					t.Errorf("%+v: openat2: %s, want %s", o, got, want)
				}
			}
			// The file helper keeps only openat2: set-id modes stay refused.
			if got := verdict(t, m, sys(unix.SYS_OPENAT, atFDCWD, 0, unix.O_CREAT|unix.O_WRONLY, 0o4755)); got != "EPERM" {
				t.Errorf("%+v: openat creating 04755: %s, want EPERM", o, got)
			}
		}
	}
}

// The weakened rules are honoured only by a thermite_weaken build.
func TestProgramIgnoresWeakenedOutsideTestBuilds(t *testing.T) {
	o := Options{Network: NetworkNone, Weakened: []string{WeakenSysVIPC, WeakenSetIDOpenat2}}
	m := vm(t, o)
	want := map[string]string{"shmget": "EPERM", "openat2": "ENOSYS"}
	if o.weakened(WeakenSysVIPC) {
		want = map[string]string{"shmget": "allow", "openat2": "allow"}
	}
	if got := verdict(t, m, sys(unix.SYS_SHMGET, 0, 4096, unix.IPC_CREAT|0o666)); got != want["shmget"] {
		t.Errorf("shmget 0666 with the rule weakened: %s, want %s", got, want["shmget"])
	}
	if got := verdict(t, m, sys(unix.SYS_OPENAT2)); got != want["openat2"] {
		t.Errorf("openat2 with the rule weakened: %s, want %s", got, want["openat2"])
	}
}
