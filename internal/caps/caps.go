// Package caps reduces the broker to the capabilities a rig's container
// gives it, and proves that it has no more.
package caps

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"thermite/internal/procs"
)

// Broker is every capability the broker keeps: exactly what the compose
// file adds back after dropping all.
var Broker = []int{
	unix.CAP_CHOWN,
	unix.CAP_DAC_OVERRIDE,
	unix.CAP_FOWNER,
	unix.CAP_SETUID,
	unix.CAP_SETGID,
	unix.CAP_KILL,
}

// Egress are the capabilities the broker keeps beside its six when the
// rig gives agents egress (agent.egress): making an agent's network
// namespace and joining it (unshare and setns CLONE_NEWNET, at every
// agent start) take CAP_SYS_ADMIN; bringing its lo up, CAP_NET_ADMIN.
var Egress = []int{unix.CAP_SYS_ADMIN, unix.CAP_NET_ADMIN}

// Measure is the capability the broker keeps beside its six wherever the
// kernel (Linux 5.9 and later) and its container give it: the disk
// measure raises it, on its measuring thread and for one stat, to read the
// blocks of a deleted file a process keeps only by a mapping through
// /proc/PID/map_files (the kernel's checkpoint_restore_ns_capable). It is
// the narrow one of MapFiles; the broker uses it for nothing else.
const Measure = unix.CAP_CHECKPOINT_RESTORE

// BrokerFor is the broker's capabilities for a rig: its six, Measure where
// it has it (mapFiles), and Egress where agents get egress.
func BrokerFor(agentEgress, mapFiles bool) []int {
	out := append([]int(nil), Broker...)
	if mapFiles {
		out = append(out, Measure)
	}
	if agentEgress {
		out = append(out, Egress...)
	}
	return out
}

// Bounded says whether the bounding set holds every one of set.
func Bounded(set []int) bool {
	for _, c := range set {
		if in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err != nil || in == 0 {
			return false
		}
	}
	return true
}

var names = map[int]string{
	unix.CAP_SYS_ADMIN:          "CAP_SYS_ADMIN",
	unix.CAP_NET_ADMIN:          "CAP_NET_ADMIN",
	unix.CAP_CHOWN:              "CAP_CHOWN",
	unix.CAP_DAC_OVERRIDE:       "CAP_DAC_OVERRIDE",
	unix.CAP_FOWNER:             "CAP_FOWNER",
	unix.CAP_SETUID:             "CAP_SETUID",
	unix.CAP_SETGID:             "CAP_SETGID",
	unix.CAP_KILL:               "CAP_KILL",
	unix.CAP_CHECKPOINT_RESTORE: "CAP_CHECKPOINT_RESTORE",
}

// Mask is the bit mask of a set of capabilities.
func Mask(set []int) uint64 {
	var m uint64
	for _, c := range set {
		m |= 1 << uint(c)
	}
	return m
}

func lastCap() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, fmt.Errorf("caps: %w", err)
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// ReduceAndExec drops every capability but keep from the bounding set, sets
// no_new_privs, and execs argv. Both are per-thread, and execve keeps those
// of the thread that calls it, so the new image starts as root holding
// exactly keep on every thread: the reduced set is what the rest of the
// broker runs with, which proves it is enough.
func ReduceAndExec(keep []int, argv []string, env []string) error {
	runtime.LockOSThread()
	last, err := lastCap()
	if err != nil {
		return err
	}
	k := Mask(keep)
	for c := 0; c <= last; c++ {
		if k&(1<<uint(c)) != 0 {
			continue
		}
		// A capability the bounding set no longer holds needs no drop, and
		// dropping one takes CAP_SETPCAP, which a rig's container lacks.
		if in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err == nil && in == 0 {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("caps: drop capability %d from the bounding set: %w (the container gives it, but not CAP_SETPCAP to drop it: give the container only %s)", c, err, Names(k))
		}
	}
	if err := clearBounding(k); err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("caps: no_new_privs: %w", err)
	}
	if err := unix.Exec("/proc/self/exe", argv, env); err != nil {
		return fmt.Errorf("caps: re-exec: %w", err)
	}
	return nil
}

// clearBounding empties the bounding set where this thread may (it holds
// CAP_SETPCAP: `serve` on a host), so that no process the broker forks has
// a capability even to lose. The broker keeps keep through the exec as
// inheritable: root's exec gives it permitted = inheritable when the
// bounding set is empty. Inheritable first, as the kernel allows it only
// within inheritable | bounding. A container without CAP_SETPCAP leaves
// the bounding set at keep, its own six.
func clearBounding(keep uint64) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("caps: capget: %w", err)
	}
	if data[0].Effective&(1<<unix.CAP_SETPCAP) == 0 {
		return nil
	}
	data[0].Inheritable, data[1].Inheritable = uint32(keep), uint32(keep>>32)
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("caps: keep %s inheritable across the exec: %w", Names(keep), err)
	}
	for c := 0; c < 64; c++ {
		if keep&(1<<uint(c)) == 0 {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("caps: clear %s from the bounding set: %w", Names(1<<uint(c)), err)
		}
	}
	return nil
}

// BoundingCleared says whether this process's bounding set is empty, as
// `serve` leaves it on a host; in a container without CAP_SETPCAP it holds
// the broker's six.
func BoundingCleared() bool {
	st, err := procs.Status("/proc/self/status")
	if err != nil {
		return false
	}
	v, err := strconv.ParseUint(st["CapBnd"], 16, 64)
	return err == nil && v == 0
}

// ClearInheritable empties the inheritable set, which the broker kept only
// for its own exec: nothing it forks should carry it. Lowering it needs no
// capability. It is per thread: every thread where the runtime can do that
// (a static build), else the calling one, which the stop helper
// (spawn.Main) locks and runs its stop on.
func ClearInheritable() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("caps: capget: %w", err)
	}
	if data[0].Inheritable == 0 && data[1].Inheritable == 0 {
		return nil
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	_, _, errno := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0)
	runtime.KeepAlive(&data)
	if errno == 0 {
		return nil
	}
	if errno != unix.ENOTSUP {
		return fmt.Errorf("caps: clear the inheritable set: %w", errno)
	}
	// A cgo build: this thread only.
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("caps: clear the inheritable set: %w", err)
	}
	return nil
}

// Verify checks that this process holds exactly keep, effective and
// permitted, nothing ambient, no_new_privs, and either an empty bounding
// set with keep inheritable (a host: `serve` cleared it) or keep in the
// bounding set with nothing inheritable (a container without CAP_SETPCAP).
// It names what is missing or extra.
func Verify(keep []int) error {
	st, err := procs.Status("/proc/self/status")
	if err != nil {
		return fmt.Errorf("caps: %w", err)
	}
	want := Mask(keep)
	bnd, err := strconv.ParseUint(st["CapBnd"], 16, 64)
	if err != nil {
		return fmt.Errorf("caps: /proc/self/status CapBnd: %q", st["CapBnd"])
	}
	inh, _ := strconv.ParseUint(st["CapInh"], 16, 64)
	switch {
	case bnd == 0 && (inh == want || inh == 0):
	case bnd == want && inh == 0:
	default:
		return fmt.Errorf("caps: bounding set %016x with inheritable %016x: want 0 with %016x, or %016x with 0", bnd, inh, want, want)
	}
	for _, f := range []string{"CapEff", "CapPrm"} {
		v, err := strconv.ParseUint(st[f], 16, 64)
		if err != nil {
			return fmt.Errorf("caps: /proc/self/status %s: %q", f, st[f])
		}
		if missing := want &^ v; missing != 0 {
			return fmt.Errorf("caps: the broker needs %s, which this container does not give (%s is %016x)", Names(missing), f, v)
		}
		if extra := v &^ want; extra != 0 {
			return fmt.Errorf("caps: %s still holds %016x beyond the broker's set", f, extra)
		}
	}
	if v, _ := strconv.ParseUint(st["CapAmb"], 16, 64); v != 0 {
		return fmt.Errorf("caps: CapAmb is %016x, not 0", v)
	}
	if st["NoNewPrivs"] != "1" {
		return fmt.Errorf("caps: no_new_privs is not set")
	}
	return nil
}

// Names spells a capability mask with the broker's capability names.
func Names(m uint64) string {
	var out []string
	for c := 0; c < 64; c++ {
		if m&(1<<uint(c)) == 0 {
			continue
		}
		if n, ok := names[c]; ok {
			out = append(out, n)
		} else {
			out = append(out, "cap "+strconv.Itoa(c))
		}
	}
	return strings.Join(out, ", ")
}

// MapFiles are the capabilities either of which lets a process follow
// another's /proc/PID/map_files links (the kernel's
// checkpoint_restore_ns_capable, in the initial user namespace), which the
// disk measure takes to read a deleted file's blocks that only a mapping
// keeps, the narrow one first: Measure, which the broker keeps wherever it
// is given, then CAP_SYS_ADMIN, which it keeps where agents get egress.
var MapFiles = []int{Measure, unix.CAP_SYS_ADMIN}

// PermittedOf is the first of set that this thread's permitted set holds
// (one it may raise), or -1.
func PermittedOf(set []int) int {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if unix.Capget(&hdr, &data[0]) != nil {
		return -1
	}
	prm := uint64(data[0].Permitted) | uint64(data[1].Permitted)<<32
	for _, c := range set {
		if prm&(1<<uint(c)) != 0 {
			return c
		}
	}
	return -1
}

// WithEffective runs fn with capability c raised in the calling thread's
// effective set, and lowers it again after. capset changes the calling
// thread only, so the caller must be locked to its thread
// (runtime.LockOSThread; threadcred.As's calls are). c must be in the
// thread's permitted set (PermittedOf).
func WithEffective(c int, fn func() error) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("caps: capget: %w", err)
	}
	before := data
	data[c/32].Effective |= 1 << uint(c%32)
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("caps: raise %s on the thread: %w", Names(1<<uint(c)), err)
	}
	fnErr := fn()
	if err := unix.Capset(&hdr, &before[0]); err != nil {
		return fmt.Errorf("caps: lower %s on the thread again: %w", Names(1<<uint(c)), err)
	}
	return fnErr
}
