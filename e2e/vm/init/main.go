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

	"thermite/e2e/vm/vminit"
)

func main() {
	// Whatever happens, the machine must stop, or the script waits for its
	// timeout: a panic here ends PID 1, which panics the kernel, and
	// panic=-1 with qemu's -no-reboot ends qemu.
	defer vminit.PowerOff()
	mountAll()
	fmt.Printf("%s %s s after boot; kernel %s\n", vminit.MarkInit, vminit.Uptime(), vminit.KernelRelease())
	os.Setenv("PATH", "/tests:/bin")
	os.Setenv("HOME", "/root")
	os.Setenv("TMPDIR", "/tmp")

	flags := []string{"-test.v", "-test.count=1", "-test.timeout=" + vminit.Param("thermite.timeout", "10m")}
	if run := vminit.Param("thermite.run", ""); run != "" {
		flags = append(flags, "-test.run="+run)
	}
	tests, _ := filepath.Glob("/tests/*.test")
	if len(tests) == 0 {
		fmt.Printf("%s FAIL: no test binaries in /tests\n", vminit.MarkVerdict)
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
		fmt.Printf("%s FAIL: %s\n", vminit.MarkVerdict, strings.Join(failed, " "))
		return
	}
	fmt.Printf("%s PASS: %d test binaries\n", vminit.MarkVerdict, len(tests))
}

// mountAll mounts the file systems a test binary expects, and the cgroup
// tree where a Debian host has it, for the tests that look in it.
func mountAll() {
	vminit.MountAll([]vminit.FS{
		{Dir: "/proc", Type: "proc"}, {Dir: "/sys", Type: "sysfs"}, {Dir: "/dev", Type: "devtmpfs"}, {Dir: "/tmp", Type: "tmpfs"}, {Dir: "/root", Type: "tmpfs"},
	}, []string{"/tmp"})
	if err := unix.Mount("cgroup2", "/sys/fs/cgroup", "cgroup2", 0, ""); err != nil {
		fmt.Printf("THERMITE-VM: mount /sys/fs/cgroup: %v\n", err)
	}
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}
