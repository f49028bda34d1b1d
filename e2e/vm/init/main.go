//go:build linux

// Command init is PID 1 of the virtual machine that e2e/vm/run.sh boots. It
// mounts what the test binaries need, runs each /tests/*.test as root with
// -test.v, prints one verdict line the script looks for, and powers the
// machine off.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Lines the script matches; keep them in step with run.sh.
const (
	markInit    = "THERMITE-VM: init started"
	markVerdict = "THERMITE-VM: VERDICT"
)

func main() {
	// Whatever happens, the machine must stop, or the script waits for its
	// timeout: a panic here ends PID 1, which panics the kernel, and
	// panic=-1 with qemu's -no-reboot ends qemu.
	defer powerOff()
	mountAll()
	fmt.Printf("%s %s s after boot; kernel %s\n", markInit, uptime(), kernelRelease())
	os.Setenv("PATH", "/tests:/bin")
	os.Setenv("HOME", "/root")
	os.Setenv("TMPDIR", "/tmp")

	flags := []string{"-test.v", "-test.count=1", "-test.timeout=" + param("thermite.timeout", "10m")}
	if run := param("thermite.run", ""); run != "" {
		flags = append(flags, "-test.run="+run)
	}
	tests, _ := filepath.Glob("/tests/*.test")
	if len(tests) == 0 {
		fmt.Printf("%s FAIL: no test binaries in /tests\n", markVerdict)
		return
	}
	var failed []string
	for _, bin := range tests {
		name := strings.TrimSuffix(filepath.Base(bin), ".test")
		fmt.Printf("THERMITE-VM: running %s %s\n", name, strings.Join(flags, " "))
		start := time.Now()
		cmd := exec.Command(bin, flags...)
		// A test binary runs in its package's folder; an empty one stands in.
		cmd.Dir = "/tmp"
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
		err := cmd.Run()
		fmt.Printf("THERMITE-VM: %s ended after %s: %v\n", name, time.Since(start).Round(time.Millisecond), errText(err))
		if err != nil {
			failed = append(failed, name)
		}
	}
	if len(failed) > 0 {
		fmt.Printf("%s FAIL: %s\n", markVerdict, strings.Join(failed, " "))
		return
	}
	fmt.Printf("%s PASS: %d test binaries\n", markVerdict, len(tests))
}

// mountAll mounts the file systems a test binary expects, then points
// stdio at the console, which the kernel may not have opened for us when
// the initramfs has no /dev/console.
func mountAll() {
	for _, m := range []struct{ dir, fstype string }{
		{"/proc", "proc"}, {"/sys", "sysfs"}, {"/dev", "devtmpfs"}, {"/tmp", "tmpfs"}, {"/root", "tmpfs"},
	} {
		os.MkdirAll(m.dir, 0o755)
		if err := unix.Mount(m.fstype, m.dir, m.fstype, 0, ""); err != nil {
			fmt.Fprintf(os.Stderr, "THERMITE-VM: mount %s: %v\n", m.dir, err)
		}
	}
	os.Chmod("/tmp", 0o1777)
	if fd, err := unix.Open("/dev/console", unix.O_RDWR, 0); err == nil {
		for i := range 3 {
			unix.Dup3(fd, i, 0)
		}
		if fd > 2 {
			unix.Close(fd)
		}
	}
	// Pseudo-terminals, for the tests that open /dev/ptmx.
	os.MkdirAll("/dev/pts", 0o755)
	if err := unix.Mount("devpts", "/dev/pts", "devpts", 0, "ptmxmode=0666,mode=0620"); err != nil {
		fmt.Printf("THERMITE-VM: mount /dev/pts: %v\n", err)
	}
	// Tests that look in the cgroup tree find it where a Debian host has it.
	if err := unix.Mount("cgroup2", "/sys/fs/cgroup", "cgroup2", 0, ""); err != nil {
		fmt.Printf("THERMITE-VM: mount /sys/fs/cgroup: %v\n", err)
	}
}

// param is thermite.NAME=VALUE from the kernel's command line.
func param(name, def string) string {
	data, _ := os.ReadFile("/proc/cmdline")
	for _, f := range strings.Fields(string(data)) {
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			return v
		}
	}
	return def
}

func uptime() string {
	data, _ := os.ReadFile("/proc/uptime")
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return "?"
	}
	return unix.ByteSliceToString(u.Release[:])
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

func powerOff() {
	if r := recover(); r != nil {
		fmt.Printf("%s FAIL: init panicked: %v\n", markVerdict, r)
	}
	unix.Sync()
	unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}
