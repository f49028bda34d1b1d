package rig

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"thermite/controller"
	"thermite/internal/testrig"
)

// inFlightScript is a lane's program that writes mib MiB into a file it
// unlinked before a byte was written (no walk sees it), sends the
// descriptor with SCM_RIGHTS over a socket pair to itself and closes its
// own copy. With receive, it takes the descriptor at once and keeps it,
// passing it back and forth (a program handing over a handle); without,
// the file lies only in the socket's queue, in no descriptor table.
func inFlightScript(mib int, receive bool) string {
	return fmt.Sprintf(`import array, os, socket, time
fd = os.open("held", os.O_RDWR | os.O_CREAT, 0o600)
os.unlink("held")
for i in range(%d):
    os.write(fd, b"x" * (1 << 20))
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
def send(fd):
    a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
    os.close(fd)
def receive():
    msg, anc, flags, addr = b.recvmsg(1, socket.CMSG_SPACE(4))
    return array.array("i", anc[0][2])[0]
send(fd)
while %s:
    fd = receive()
    time.sleep(0.01)
    send(fd)
time.sleep(600)
`, mib, map[bool]string{true: "True", false: "False"}[receive])
}

// inFlightInLane starts inFlightScript in trial id's lane, in a process
// that outlives the command.
func inFlightInLane(t *testing.T, r *testrig.Rig, id string, a *agentClient, mib int, receive bool) {
	t.Helper()
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("needs /usr/bin/python3 to pass a descriptor as the lane")
	}
	if code, _, raw := a.do("POST", "/v1/fs/write", map[string]any{"path": "pass.py", "data": []byte(inFlightScript(mib, receive))}); code != 200 {
		t.Fatalf("fs/write: %d %s", code, raw)
	}
	cmd := "setsid -f sh -c '/usr/bin/python3 pass.py 2>pass.err' </dev/null >/dev/null 2>&1"
	if _, stderr, code := r.Thermite("trial", "exec", id, "--", "sh", "-c", cmd); code != 0 {
		t.Fatalf("trial exec: %s", stderr)
	}
}

// A lane keeps a deleted file of 8 MiB only in flight, in a socket pair's
// queue, its own descriptor closed: no descriptor table shows it, however
// far under the 64 MiB cap it is. The disk check ends the trial as keeping
// its files from the measure, naming the socket, and its processes with
// it.
func TestLaneKeepsADeletedFileOnlyInFlightEndsItsTrial(t *testing.T) {
	r := testrig.New(t, testrig.Options{Extra: "[trial]\ndisk_cap_mb = 64\ndisk_check = \"200ms\"\n"})
	info, a := startTrial(t, r, 1, makeProject(t, r))
	inFlightInLane(t, r, info.ID, a, 8, false)
	s := waitTrial(t, r, info.ID, "the end for its disk", func(s controller.TrialStatus) bool { return s.State != "open" })
	for _, w := range []string{"over its disk limit: its processes keep their open files from the measure", "(python3): its socket:[", "keeps descriptors in flight, unreceived: 1 (fdinfo scm_fds)"} {
		if !strings.Contains(s.EndReason, w) {
			t.Fatalf("end reason %q, want it to say %q", s.EndReason, w)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); len(r.Procs("lane-1")) != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("lane-1 still runs %v", r.Procs("lane-1"))
		}
	}
}

// A lane that passes its deleted file's descriptor over a socket pair and
// receives it at once, again and again, goes on: its file counts by the
// received descriptor.
func TestLanePassesADescriptorAndReceivesItGoesOn(t *testing.T) {
	r := testrig.New(t, testrig.Options{Extra: "[trial]\ndisk_cap_mb = 64\ndisk_check = \"200ms\"\n"})
	info, a := startTrial(t, r, 1, makeProject(t, r))
	inFlightInLane(t, r, info.ID, a, 8, true)
	var got int64
	for deadline := time.Now().Add(15 * time.Second); got < 8<<20; time.Sleep(100 * time.Millisecond) {
		s := trialDisk(t, r, info.ID)
		if s.State != "open" {
			t.Fatalf("the trial under its cap ended: %s", s.EndReason)
		}
		if s.Disk != nil {
			got = s.Disk.Bytes
		}
		if time.Now().After(deadline) {
			t.Fatalf("the measure shows %d bytes, want at least the 8 MiB the received descriptor keeps", got)
		}
	}
	// Several checks later it still runs.
	time.Sleep(2 * time.Second)
	if s := trialDisk(t, r, info.ID); s.State != "open" {
		t.Fatalf("the trial passing a descriptor ended: %s", s.EndReason)
	}
}
