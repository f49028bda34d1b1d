package procs

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestRefusalHides: a refused process counts as hiding its files by the
// CPU it runs while refused, or by a long wall time, never by a short
// wall time alone (a command waiting for the CPU on its way to its exec).
func TestRefusalHides(t *testing.T) {
	cases := []struct {
		cpu, wall time.Duration
		want      bool
	}{
		{0, 2 * time.Second, false},
		{10 * time.Millisecond, 4 * time.Second, false},
		{200 * time.Millisecond, 300 * time.Millisecond, true},
		{0, 5 * time.Second, true},
	}
	for _, c := range cases {
		if got := refusalHides(c.cpu, c.wall); got != c.want {
			t.Errorf("refusalHides(cpu %v, wall %v) = %v, want %v", c.cpu, c.wall, got, c.want)
		}
	}
}

// TestCPUTime reads utime and stime from a stat line whose command holds
// spaces and parentheses, and this process's own.
func TestCPUTime(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "42"), 0o755)
	line := "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 150 25 0 0 20 0 1 0 100 1000 10\n"
	os.WriteFile(filepath.Join(root, "42", "stat"), []byte(line), 0o644)
	if got := cpuTime(root, 42); got != 1750*time.Millisecond {
		t.Fatalf("cpuTime = %v, want 1.75s (150+25 ticks)", got)
	}
	if got := cpuTime(root, 43); got != 0 {
		t.Fatalf("a process that is gone: %v", got)
	}
	for start := time.Now(); time.Since(start) < 50*time.Millisecond; {
	}
	if got := cpuTime("/proc", os.Getpid()); got <= 0 {
		t.Fatalf("this process's own CPU time: %v", got)
	}
}

// TestZombie: a child that ended and is not yet reaped is a zombie (its
// table refused to all but root, holding nothing); a running one, a stat
// line of state S, and a process that is gone are not.
func TestZombie(t *testing.T) {
	root := t.TempDir()
	// state, then fields 4 to 19, then num_threads (field 20).
	for pid, st := range map[string]string{"7": "Z 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0", "8": "S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0",
		// A main thread that ended alone: another thread lives on.
		"10": "Z 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 2 0"} {
		os.MkdirAll(filepath.Join(root, pid), 0o755)
		os.WriteFile(filepath.Join(root, pid, "stat"), []byte(pid+" (x) y) "+st+"\n"), 0o644)
	}
	if !zombie(root, 7) || zombie(root, 8) || zombie(root, 9) || zombie(root, 10) {
		t.Fatalf("zombie of Z, S, gone, Z with a live thread: %v %v %v %v", zombie(root, 7), zombie(root, 8), zombie(root, 9), zombie(root, 10))
	}
	cmd := exec.Command("/bin/true")
	if err := cmd.Start(); err != nil {
		t.Skipf("needs /bin/true: %v", err)
	}
	defer cmd.Wait()
	for start := time.Now(); !zombie("/proc", cmd.Process.Pid); {
		if time.Since(start) > 5*time.Second {
			t.Fatal("an ended child, not reaped, is not seen as a zombie")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if zombie("/proc", os.Getpid()) {
		t.Fatal("this running process is seen as a zombie")
	}
}
