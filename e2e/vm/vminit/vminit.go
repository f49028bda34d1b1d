//go:build linux

// Package vminit is what the virtual machines' PID 1 programs share:
// e2e/vm/init, which runs the test binaries, and e2e/vm/riginit, which
// runs the rig as an operator would. Both mount what their programs
// expect, read thermite.NAME=VALUE from the kernel's command line, print
// the lines the scripts match, and power the machine off.
package vminit

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Lines the scripts and the tests match; keep them in step with run.sh,
// kernels.sh and kernels_test.go.
const (
	MarkInit    = "THERMITE-VM: init started"
	MarkVerdict = "THERMITE-VM: VERDICT"
)

// FS is a file system to mount: where, and of what type (the type is
// its source too).
type FS struct{ Dir, Type string }

// MountAll mounts each of fss, makes each of sticky world-writable with
// the sticky bit, points stdio at the console, which the kernel may not
// have opened when the initramfs has no /dev/console, and mounts
// pseudo-terminals at /dev/pts, for the tests and programs that open
// /dev/ptmx. A mount that fails is said on the console and passed over.
func MountAll(fss []FS, sticky []string) {
	for _, m := range fss {
		os.MkdirAll(m.Dir, 0o755)
		if err := unix.Mount(m.Type, m.Dir, m.Type, 0, ""); err != nil {
			fmt.Fprintf(os.Stderr, "THERMITE-VM: mount %s: %v\n", m.Dir, err)
		}
	}
	for _, d := range sticky {
		os.Chmod(d, 0o1777)
	}
	if fd, err := unix.Open("/dev/console", unix.O_RDWR, 0); err == nil {
		for i := range 3 {
			unix.Dup3(fd, i, 0)
		}
		if fd > 2 {
			unix.Close(fd)
		}
	}
	os.MkdirAll("/dev/pts", 0o755)
	if err := unix.Mount("devpts", "/dev/pts", "devpts", 0, "ptmxmode=0666,mode=0620"); err != nil {
		fmt.Printf("THERMITE-VM: mount /dev/pts: %v\n", err)
	}
}

// Param is thermite.NAME=VALUE from the kernel's command line, or def.
func Param(name, def string) string {
	data, _ := os.ReadFile("/proc/cmdline")
	return paramIn(string(data), name, def)
}

// paramIn is Param on the command line cmdline.
func paramIn(cmdline, name, def string) string {
	for _, f := range strings.Fields(cmdline) {
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			return v
		}
	}
	return def
}

// Uptime is the seconds since boot, as /proc/uptime writes them.
func Uptime() string {
	data, _ := os.ReadFile("/proc/uptime")
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// KernelRelease is the running kernel's release, as uname -r writes it.
func KernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return "?"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// PowerOff ends the machine; deferred first in main, it says a panic as
// the verdict before. Whatever happens, the machine must stop, or the
// script waits for its timeout.
func PowerOff() {
	if r := recover(); r != nil {
		fmt.Printf("%s FAIL: init panicked: %v\n", MarkVerdict, r)
	}
	unix.Sync()
	unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}
