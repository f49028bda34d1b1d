package rig

import (
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"thermite/controller"
	"thermite/internal/caps"
	"thermite/internal/procs"
	"thermite/internal/testrig"
)

// mappedDeletedScript is a lane's program that keeps files of mib MiB
// each, one after the other, that only a mapping holds: each unlinked
// before a byte is written (no walk sees it), one page of it mapped, its
// descriptor closed. libc's mmap: Python's own keeps a duplicate of the
// descriptor.
func mappedDeletedScript(files, mib int) string {
	return fmt.Sprintf(`import ctypes, mmap, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
for f in range(%d):
    fd = os.open("held", os.O_RDWR | os.O_CREAT, 0o600)
    os.unlink("held")
    for i in range(%d):
        os.write(fd, b"x" * (1 << 20))
    if libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0) in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap")
    os.close(fd)
    time.sleep(0.5)
time.sleep(600)
`, files, mib)
}

// mapDeletedInLane starts mappedDeletedScript(files, mib) in trial id's
// lane, in a process that outlives the command.
func mapDeletedInLane(t *testing.T, r *testrig.Rig, id string, a *agentClient, files, mib int) {
	t.Helper()
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("needs /usr/bin/python3 to map a file as the lane")
	}
	if code, _, raw := a.do("POST", "/v1/fs/write", map[string]any{"path": "map.py", "data": []byte(mappedDeletedScript(files, mib))}); code != 200 {
		t.Fatalf("fs/write: %d %s", code, raw)
	}
	cmd := "setsid -f sh -c '/usr/bin/python3 map.py 2>map.err' </dev/null >/dev/null 2>&1"
	if _, stderr, code := r.Thermite("trial", "exec", id, "--", "sh", "-c", cmd); code != 0 {
		t.Fatalf("trial exec: %s", stderr)
	}
}

// mappedRig is a rig whose broker holds CAP_CHECKPOINT_RESTORE (it keeps
// it wherever the kernel and its container give it, egress or not), which
// following /proc/PID/map_files takes; wrap runs its serve under a command
// that takes it away, as a container that does not give it.
func mappedRig(t *testing.T, capMB int, wrap ...string) *testrig.Rig {
	if len(wrap) == 0 && !caps.Bounded([]int{caps.Measure}) {
		t.Skip("needs CAP_CHECKPOINT_RESTORE (Linux 5.9 and later) in this process's bounding set, for the broker to keep")
	}
	extra := fmt.Sprintf("[trial]\ndisk_cap_mb = %d\ndisk_check = \"200ms\"\n", capMB)
	return testrig.New(t, testrig.Options{Extra: extra, Wrap: wrap})
}

// brokerCapEff is the broker's effective capabilities.
func brokerCapEff(t *testing.T, r *testrig.Rig) uint64 {
	t.Helper()
	st, err := procs.Status(fmt.Sprintf("/proc/%d/status", r.Status().BrokerPID))
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseUint(st["CapEff"], 16, 64)
	if err != nil {
		t.Fatalf("the broker's CapEff %q: %v", st["CapEff"], err)
	}
	return v
}

// A lane writes 4 MiB into a file it unlinked, maps one page of it and
// closes the descriptor, six times: the mappings alone keep 24 MiB, which
// no walk sees and the mappings' length (4 KiB each) does not show, and
// no descriptor ever shows more than one file under the cap. The broker,
// with no agent egress and so no CAP_SYS_ADMIN, reads the files' blocks
// through /proc/PID/map_files with CAP_CHECKPOINT_RESTORE, so the trial
// ends over its 16 MiB cap with the space counted; a broker whose
// container gives no CAP_CHECKPOINT_RESTORE says at start and in its
// status that it cannot measure such files, and ends the trial as hiding
// its files.
func TestMappedDeletedFileOverTheCapEndsTheTrial(t *testing.T) {
	for _, c := range []struct {
		name string
		wrap []string
		want []string
		log  string
	}{
		{"counted", nil, []string{"over its disk limit: ", " of 16 MiB (", " deleted files its processes kept open)"}, "disk check: a deleted file only a mapping keeps counts its blocks"},
		{"no capability to read map_files", []string{"setpriv", "--bounding-set=-checkpoint_restore", "--"},
			[]string{"over its disk limit: its processes keep their open files from the measure", `maps a deleted file "`, "/map_files/", "give the container CHECKPOINT_RESTORE"},
			"disk check: a deleted file only a mapping keeps cannot be measured, so a trial whose processes keep one (as bun, OpenCode's runtime, does) ends as hiding its files: operation not permitted (following map_files takes CAP_CHECKPOINT_RESTORE"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := mappedRig(t, 16, c.wrap...)
			// The broker says at start which of the two it is, and the
			// status says what it cannot measure for as long as it runs.
			if !strings.Contains(r.LogText(), c.log) {
				t.Errorf("the broker's log does not say %q", c.log)
			}
			status, _, _ := r.Thermite("status")
			eff := brokerCapEff(t, r)
			if c.wrap == nil {
				// CAP_CHECKPOINT_RESTORE beside the six, and no CAP_SYS_ADMIN.
				if want := caps.Mask(caps.BrokerFor(false, true)); eff != want {
					t.Errorf("the broker's CapEff %016x, want %016x (its six and CAP_CHECKPOINT_RESTORE)", eff, want)
				}
				if strings.Contains(status, "cannot be measured") {
					t.Errorf("thermite status says a mapped file cannot be measured by a broker that can:\n%s", status)
				}
			} else {
				if want := caps.Mask(caps.Broker); eff != want {
					t.Errorf("the broker's CapEff %016x, want %016x (its six alone)", eff, want)
				}
				if !regexp.MustCompile(`(?m)^note\s+` + regexp.QuoteMeta(c.log)).MatchString(status) {
					t.Errorf("thermite status does not note %q:\n%s", c.log, status)
				}
			}
			info, a := startTrial(t, r, 1, makeProject(t, r))
			mapDeletedInLane(t, r, info.ID, a, 6, 4)
			s := waitTrial(t, r, info.ID, "the end for its disk", func(s controller.TrialStatus) bool { return s.State != "open" })
			for _, w := range c.want {
				if !strings.Contains(s.EndReason, w) {
					t.Fatalf("end reason %q, want it to say %q", s.EndReason, w)
				}
			}
			if c.wrap == nil {
				// One descriptor shows at most one 4 MiB file at a time:
				// more than that is files counted by their mappings alone.
				var mib, files int
				fmt.Sscanf(s.EndReason[strings.Index(s.EndReason, "(")+1:], "%d MiB of it in %d deleted files", &mib, &files)
				if mib <= 4 || files < 2 {
					t.Errorf("end reason %q: %d MiB in %d deleted files, want more than the 4 MiB of one file", s.EndReason, mib, files)
				}
			}
			for deadline := time.Now().Add(5 * time.Second); len(r.Procs("lane-1")) != 0; time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("lane-1 still runs %v", r.Procs("lane-1"))
				}
			}
		})
	}
}

// A lane whose process keeps a deleted file by a mapping alone (as bun,
// OpenCode's runtime, does at start), well under its cap, on a rig with
// no agent egress: its measure counts the file's blocks, and the trial
// goes on.
func TestLaneMappedDeletedFileUnderTheCapCounted(t *testing.T) {
	r := mappedRig(t, 64)
	info, a := startTrial(t, r, 1, makeProject(t, r))
	mapDeletedInLane(t, r, info.ID, a, 1, 8)
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
			t.Fatalf("the measure shows %d bytes, want at least the 8 MiB kept by the mapping", got)
		}
	}
}
