//go:build linux && (amd64 || arm64)

package seccomp

import (
	"runtime"
	"slices"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// loadOnFreshThread loads filter with seccomp(SECCOMP_SET_MODE_FILTER) on
// a new locked OS thread that then ends (a goroutine that exits locked
// takes its thread with it), and returns how long the one system call took.
func loadOnFreshThread(filter []unix.SockFilter) (time.Duration, error) {
	type result struct {
		d   time.Duration
		err error
	}
	done := make(chan result)
	go func() {
		runtime.LockOSThread() // never unlocked: the filter dies with the thread
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			done <- result{err: err}
			return
		}
		prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
		start := time.Now()
		_, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&prog)))
		d := time.Since(start)
		runtime.KeepAlive(filter)
		if errno != 0 {
			done <- result{err: errno}
			return
		}
		done <- result{d: d}
	}()
	r := <-done
	return r.d, r.err
}

// BenchmarkLoad is the kernel's cost of attaching a filter, which every
// role command pays between clone and execve: the programs are taken in
// turn, and the medians of each reported.
func BenchmarkLoad(b *testing.B) {
	programs := loadBenchPrograms(b)
	times := make([][]time.Duration, len(programs))
	for b.Loop() {
		for i, p := range programs {
			d, err := loadOnFreshThread(p.filter)
			if err != nil {
				b.Fatalf("%s: %v", p.name, err)
			}
			times[i] = append(times[i], d)
		}
	}
	for i, p := range programs {
		slices.Sort(times[i])
		b.ReportMetric(float64(times[i][len(times[i])/2].Nanoseconds())/1e3, "µs-"+p.name)
	}
}

type benchProgram struct {
	name   string
	filter []unix.SockFilter
}

// loadBenchPrograms are an api lane's filter as dispatched today, as the
// linear reference builds it, and a one-instruction ALLOW.
func loadBenchPrograms(b *testing.B) []benchProgram {
	b.Helper()
	o := Options{Network: NetworkAPI}
	tree, err := Program(o)
	if err != nil {
		b.Fatal(err)
	}
	linear, err := linearProgram(o)
	if err != nil {
		b.Fatal(err)
	}
	trivial := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: actionAllow}}
	return []benchProgram{{"dispatch", tree}, {"linear", linear}, {"trivial", trivial}}
}
