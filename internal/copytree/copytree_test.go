package copytree

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestCopy(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "a", "b"), 0o755)
	os.WriteFile(filepath.Join(src, "a", "b", "f"), []byte("hello"), 0o644)
	os.WriteFile(filepath.Join(src, "x.sh"), []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(src, "su"), []byte("x"), 0o755)
	unix.Chmod(filepath.Join(src, "su"), 0o4755)
	os.Symlink("/etc/passwd", filepath.Join(src, "link"))
	unix.Mkfifo(filepath.Join(src, "fifo"), 0o644)
	dst := filepath.Join(t.TempDir(), "copy")
	st, err := Copy(src, dst, Options{UID: -1, GID: -1})
	if err != nil {
		t.Fatal(err)
	}
	if st.Files != 3 || st.Symlinks != 1 || st.Skipped != 1 || st.Dirs != 3 {
		t.Fatalf("%+v", st)
	}
	b, _ := os.ReadFile(filepath.Join(dst, "a", "b", "f"))
	if string(b) != "hello" {
		t.Fatal("content")
	}
	if l, _ := os.Readlink(filepath.Join(dst, "link")); l != "/etc/passwd" {
		t.Fatal("symlink not copied as a symlink")
	}
	fi, _ := os.Stat(filepath.Join(dst, "su"))
	if fi.Mode()&os.ModeSetuid != 0 || fi.Mode().Perm() != 0o755 {
		t.Fatalf("su: %v", fi.Mode())
	}
	if _, err := Copy(src, dst, Options{UID: -1, GID: -1}); err == nil || !strings.Contains(err.Error(), dst) {
		t.Fatalf("copy onto an existing folder: %v", err)
	}
}

func TestCopyReadOnlyAndOwned(t *testing.T) {
	if os.Geteuid() != 0 || testing.Short() {
		t.Skip("needs root (and no -short) to chown")
	}
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "data"), []byte("d"), 0o664)
	os.WriteFile(filepath.Join(src, "run"), []byte("r"), 0o775)
	dst := filepath.Join(t.TempDir(), "ro")
	if _, err := Copy(src, dst, Options{UID: 45991, GID: 45991, ReadOnly: true}); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]uint32{dst: 0o555, filepath.Join(dst, "data"): 0o444, filepath.Join(dst, "run"): 0o555} {
		var st unix.Stat_t
		unix.Lstat(p, &st)
		if st.Mode&0o7777 != want || st.Uid != 45991 {
			t.Errorf("%s: %o uid %d, want %o uid 45991", p, st.Mode&0o7777, st.Uid, want)
		}
	}
}

func TestCopyLimit(t *testing.T) {
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "big"), make([]byte, 1000), 0o644)
	if _, err := Copy(src, filepath.Join(t.TempDir(), "c"), Options{UID: -1, GID: -1, MaxBytes: 10}); err == nil || !strings.Contains(err.Error(), "limit of 10 bytes") {
		t.Fatal(err)
	}
}

func TestCopyRefusesHardLinks(t *testing.T) {
	src := t.TempDir()
	outside := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(outside, []byte("root only"), 0o600)
	if err := os.Link(outside, filepath.Join(src, "linked")); err != nil {
		t.Skip("cannot hard-link here:", err)
	}
	_, err := Copy(src, filepath.Join(t.TempDir(), "c"), Options{UID: -1, GID: -1, RefuseLinks: true})
	if err == nil || !strings.Contains(err.Error(), "linked has 2 links") {
		t.Fatalf("a hard-linked file was copied: %v", err)
	}
}

// TestCopyTopOwned: everything the owner's, the top another's, as a
// trial's import is made.
func TestCopyTopOwned(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give files away")
	}
	src := t.TempDir()
	os.Chmod(src, 0o755)
	os.MkdirAll(filepath.Join(src, "a"), 0o755)
	os.WriteFile(filepath.Join(src, "a", "f"), []byte("x"), 0o4755)
	dst := filepath.Join(t.TempDir(), "c")
	files := 0
	if _, err := Copy(src, dst, Options{UID: 45991, GID: 45992, TopOwned: true, TopUID: 45993, TopGID: 45994, Progress: func(f int, _ int64) { files = f }}); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string][3]uint32{dst: {45993, 45994, 0o755}, filepath.Join(dst, "a"): {45991, 45992, 0o755}, filepath.Join(dst, "a", "f"): {45991, 45992, 0o755}} {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != want[0] || st.Gid != want[1] || st.Mode&0o7777 != want[2] {
			t.Errorf("%s: %d:%d %04o, want %d:%d %04o", p, st.Uid, st.Gid, st.Mode&0o7777, want[0], want[1], want[2])
		}
	}
	if files != 1 {
		t.Errorf("progress saw %d files, want 1", files)
	}
}

// BenchmarkCopy100k copies 100,000 small files as a trial's start does
// (owner set as it copies, no walk after) and with `cp -a
// --reflink=auto`, in CPU time (user and system) per copy.
func BenchmarkCopy100k(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root to give files away")
	}
	src, err := os.MkdirTemp("", "thermite-copy-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(src) })
	for i := 0; i < 1000; i++ {
		sub := filepath.Join(src, fmt.Sprintf("d%03d", i))
		os.Mkdir(sub, 0o755)
		for j := 0; j < 100; j++ {
			os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%03d", j)), []byte("x"), 0o644)
		}
	}
	out, err := os.MkdirTemp("", "thermite-copy-out-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(out) })
	cpu := func(who int) time.Duration {
		var ru unix.Rusage
		unix.Getrusage(who, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	n := 0
	b.Run("thermite", func(b *testing.B) {
		// The copy makes its system calls on this thread alone.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var used time.Duration
		for i := 0; i < b.N; i++ {
			n++
			dst := filepath.Join(out, fmt.Sprintf("t%d", n))
			start := cpu(unix.RUSAGE_THREAD)
			if _, err := Copy(src, dst, Options{UID: 45991, GID: 45991, TopOwned: true, TopUID: 45992, TopGID: 45992}); err != nil {
				b.Fatal(err)
			}
			used += cpu(unix.RUSAGE_THREAD) - start
			b.StopTimer()
			os.RemoveAll(dst)
			b.StartTimer()
		}
		b.ReportMetric(float64(used)/float64(b.N)/1e6, "cpu-ms/op")
	})
	b.Run("cp", func(b *testing.B) {
		start := cpu(unix.RUSAGE_CHILDREN)
		for i := 0; i < b.N; i++ {
			n++
			dst := filepath.Join(out, fmt.Sprintf("c%d", n))
			if err := exec.Command("cp", "-a", "--reflink=auto", src, dst).Run(); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			os.RemoveAll(dst)
			b.StartTimer()
		}
		b.ReportMetric(float64(cpu(unix.RUSAGE_CHILDREN)-start)/float64(b.N)/1e6, "cpu-ms/op")
	})
}

// TestCopyLeaksNoDescriptorToAConcurrentFork: the copy runs in processes
// that start other programs while it goes (the controller runs a kit's
// check with os/exec; the CLI's import runs as root). Every descriptor it
// opens must be close-on-exec from the moment it exists, or a fork by
// another goroutine in between inherits a folder of the tree being copied.
// The folder listing's duplicate was made by dup(2), without it.
func TestCopyLeaksNoDescriptorToAConcurrentFork(t *testing.T) {
	if testing.Short() {
		t.Skip("forks in a loop for a few seconds")
	}
	src := filepath.Join(t.TempDir(), "leak-marker-src")
	for i := range 200 {
		os.MkdirAll(filepath.Join(src, fmt.Sprintf("d%03d", i), "e"), 0o755)
	}
	done := make(chan struct{})
	leaks := make(chan string, 1)
	go func() {
		defer close(leaks)
		for {
			select {
			case <-done:
				return
			default:
			}
			// ls lists its own descriptors: 0-2, the one it reads
			// /proc/self/fd with, and whatever it inherited.
			out, _ := exec.Command("/bin/ls", "-l", "/proc/self/fd/").Output()
			if strings.Contains(string(out), "leak-marker-src") {
				leaks <- string(out)
				return
			}
		}
	}()
	deadline := time.Now().Add(3 * time.Second)
	for n := 0; time.Now().Before(deadline); n++ {
		if _, err := Copy(src, filepath.Join(t.TempDir(), fmt.Sprintf("copy%d", n)), Options{UID: -1, GID: -1}); err != nil {
			t.Fatal(err)
		}
		runtime.Gosched()
	}
	close(done)
	if out, ok := <-leaks; ok {
		t.Fatalf("a program started during the copy inherited a descriptor of the tree copied:\n%s", out)
	}
}

// TestCopyOfASparseFileKeepsItsHoles: a role's `truncate -s 1T` with a few
// bytes written at its start, in its middle and at its end copies as
// those blocks, not as a terabyte of zeros that fills the disk: the copy
// has the same size and content where there is data, and allocates about
// what the source does.
func TestCopyOfASparseFileKeepsItsHoles(t *testing.T) {
	src := t.TempDir()
	p := filepath.Join(src, "out")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	const size = 1 << 40
	if err := f.Truncate(size); err != nil {
		t.Skipf("the temporary folder's file system takes no 1 TiB sparse file: %v", err)
	}
	for _, off := range []int64{0, size / 2, size - 5} {
		if _, err := f.WriteAt([]byte("data!"), off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	var sst unix.Stat_t
	unix.Stat(p, &sst)
	dst := filepath.Join(t.TempDir(), "copy")
	if _, err := Copy(src, dst, Options{UID: -1, GID: -1}); err != nil {
		t.Fatal(err)
	}
	var dst1 unix.Stat_t
	if err := unix.Stat(filepath.Join(dst, "out"), &dst1); err != nil {
		t.Fatal(err)
	}
	if dst1.Size != size {
		t.Errorf("the copy is %d bytes, want %d", dst1.Size, int64(size))
	}
	// A few blocks more than the source at most (the file system's own
	// rounding), never the apparent size.
	if dst1.Blocks*512 > sst.Blocks*512+1<<20 {
		t.Errorf("the copy allocates %d bytes, the source %d: holes were written as zeros", dst1.Blocks*512, sst.Blocks*512)
	}
	g, err := os.Open(filepath.Join(dst, "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for _, off := range []int64{0, size / 2, size - 5} {
		b := make([]byte, 5)
		if _, err := g.ReadAt(b, off); err != nil || string(b) != "data!" {
			t.Errorf("at %d: %q %v, want data!", off, b, err)
		}
	}
}
