package spawn

import (
	"errors"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// writeRecords writes recs on w as a child does, one write each.
func writeRecords(t *testing.T, w int, recs ...record) {
	t.Helper()
	for i := range recs {
		b := unsafe.Slice((*byte)(unsafe.Pointer(&recs[i])), recordSize)
		if _, err := unix.Write(w, b); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReportReadWhileTheExecStillHoldsThePipe: a child past execve's point
// of no return still holds the report pipe's write end until the exec
// closes its close-on-exec descriptors. Start reads the stamp then, and
// does not wait for that end of file (the read would block here for ever).
func TestReportReadWhileTheExecStillHoldsThePipe(t *testing.T) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	writeRecords(t, p[1], record{Kind: recordStamp, MonoNS: 42, UserNS: 7, SysNS: 9})
	st, stamped, err := readReport(p[0], nil)
	if err != nil || !stamped || st != (Stamp{MonoNS: 42, UserNS: 7, SysNS: 9}) {
		t.Fatalf("readReport = %+v, %v, %v; want the stamp, no error", st, stamped, err)
	}
}

// TestReportOfAFailedExecKeepsItsStage: a child that stamped and then
// found no program to exec wrote both records before it exited; one read
// gives the failure, by stage and errno, with the stamp.
func TestReportOfAFailedExecKeepsItsStage(t *testing.T) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	writeRecords(t, p[1],
		record{Kind: recordStamp, MonoNS: 42},
		record{Kind: recordFailure, Stage: uint32(StageExec), Errno: uint32(unix.ENOENT)})
	unix.Close(p[1])
	_, stamped, err := readReport(p[0], func(Stage, int) string { return "no-such-program" })
	var se *StageError
	if !stamped || !errors.As(err, &se) || se.Stage != StageExec || !errors.Is(err, unix.ENOENT) {
		t.Fatalf("readReport = stamped %v, %v; want the stamp and an exec ENOENT stage error", stamped, err)
	}
	if got, want := err.Error(), "spawn: execve no-such-program: not found (ENOENT)"; got != want {
		t.Fatalf("error %q, want %q", got, want)
	}
}
