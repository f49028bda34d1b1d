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

// loadBenchPrograms are an api lane's filter as dispatched, as the linear
// reference builds it, a one-instruction ALLOW, and each of the first two
// behind a leading ALLOW: the kernel still checks and compiles every
// instruction, but its walk for each number ends at once, which splits
// the compile cost from the walk's.
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
	allow := unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: actionAllow}
	return []benchProgram{
		{"dispatch", tree}, {"linear", linear}, {"allow", []unix.SockFilter{allow}},
		{"compile-dispatch", append([]unix.SockFilter{allow}, tree...)},
		{"compile-linear", append([]unix.SockFilter{allow}, linear...)},
	}
}

// BenchmarkFilteredCall is what a filter adds to each system call of a
// command: one locked thread each with no filter, the linear list and the
// dispatched program (an api lane's) make the same call in turn, a batch
// of filteredBatch at a time, and the median nanoseconds per call of each
// are reported. getppid is allowed whatever its arguments, so the kernel's
// bitmap lets it skip either filter; ioctl, openat, fcntl and socketpair
// have argument checks, so the filter runs on each (socketpair's rule is the
// list's last; it refuses AF_INET there, so the call does no other work).
func BenchmarkFilteredCall(b *testing.B) {
	o := Options{Network: NetworkAPI}
	tree, err := Program(o)
	if err != nil {
		b.Fatal(err)
	}
	linear, err := linearProgram(o)
	if err != nil {
		b.Fatal(err)
	}
	empty := []byte{0}
	calls := []struct {
		name string
		call func()
	}{
		{"getppid", func() { unix.RawSyscall(unix.SYS_GETPPID, 0, 0, 0) }},
		{"ioctl", func() { unix.RawSyscall(unix.SYS_IOCTL, ^uintptr(0), unix.TIOCGWINSZ, 0) }},
		{"openat", func() {
			unix.RawSyscall6(unix.SYS_OPENAT, uintptr(atFDCWD), uintptr(unsafe.Pointer(&empty[0])), unix.O_RDONLY, 0, 0, 0)
		}},
		// fcntl has the stop-signal rule's check of F_SETSIG.
		{"fcntl", func() { unix.RawSyscall(unix.SYS_FCNTL, ^uintptr(0), unix.F_GETFL, 0) }},
		{"socketpair-inet", func() { unix.RawSyscall6(unix.SYS_SOCKETPAIR, unix.AF_INET, unix.SOCK_STREAM, 0, 0, 0, 0) }},
	}
	filters := []benchProgram{{"none", nil}, {"linear", linear}, {"dispatch", tree}}
	for _, c := range calls {
		b.Run(c.name, func(b *testing.B) {
			threads := make([]*callThread, len(filters))
			for i, f := range filters {
				t, err := startCallThread(f.filter, c.call)
				if err != nil {
					b.Fatalf("%s: %v", f.name, err)
				}
				defer t.stop()
				threads[i] = t
			}
			times := make([][]time.Duration, len(filters))
			for b.Loop() {
				for i, t := range threads {
					times[i] = append(times[i], t.batch())
				}
			}
			for i, f := range filters {
				slices.Sort(times[i])
				b.ReportMetric(float64(times[i][len(times[i])/2].Nanoseconds())/filteredBatch, "ns/call-"+f.name)
			}
		})
	}
}

// filteredBatch is how many calls a callThread makes per request.
const filteredBatch = 1000

// callThread is a locked OS thread under a filter (or none) that makes
// filteredBatch calls each time it is asked, and says how long they took.
type callThread struct {
	ask  chan struct{}
	took chan time.Duration
}

func startCallThread(filter []unix.SockFilter, call func()) (*callThread, error) {
	t := &callThread{ask: make(chan struct{}), took: make(chan time.Duration)}
	ready := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the filter dies with the thread
		if filter != nil {
			if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
				ready <- err
				return
			}
			prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
			if _, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&prog))); errno != 0 {
				ready <- errno
				return
			}
		}
		ready <- nil
		for range t.ask {
			start := time.Now()
			for range filteredBatch {
				call()
			}
			t.took <- time.Since(start)
		}
	}()
	return t, <-ready
}

func (t *callThread) batch() time.Duration {
	t.ask <- struct{}{}
	return <-t.took
}

func (t *callThread) stop() { close(t.ask) }
