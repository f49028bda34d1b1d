package rig

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"thermite/controller"
	"thermite/internal/testrig"
)

// An ended trial's folder is out of every role's reach at once (root's,
// 0700, one change rather than a walk), kept for trial.retain_ended, shown
// in status, and removed by `thermite trial prune` however the lane shaped
// it: deeper than any walk, folders without permissions.
func TestEndedTrialFolderRetiredThenPruned(t *testing.T) {
	r := newRig(t)
	project := makeProject(t, r)
	info, _ := startTrial(t, r, 1, project)
	deep := strings.Repeat("d/", 300)
	script := "mkdir -p " + deep + " && echo secret > " + deep + "f && mkdir locked && echo x > locked/f && chmod 0 locked && echo kept > note"
	if out, stderr, code := r.Thermite("trial", "exec", info.ID, "--", "sh", "-c", script); code != 0 {
		t.Fatalf("trial exec: exit %d %s %s", code, out, stderr)
	}
	if _, stderr, code := r.Thermite("trial", "end", info.ID); code != 0 {
		t.Fatalf("trial end: %s", stderr)
	}
	dir := filepath.Dir(info.Workspace)
	var st syscall.Stat_t
	statOf(t, dir, &st)
	if st.Uid != 0 || st.Mode&0o7777 != 0o700 {
		t.Fatalf("ended trial's folder %s: uid %d mode %04o, want root's 0700", dir, st.Uid, st.Mode&0o7777)
	}
	// The next trial on the same lane, and the controller's own user,
	// cannot read what the ended trial left.
	next, _ := startTrial(t, r, 1, project)
	old := filepath.Join(info.Workspace, "note")
	out, stderr, code := r.Thermite("trial", "exec", next.ID, "--", "cat", old)
	if code == 0 || !strings.Contains(out+stderr, "Permission denied") {
		t.Fatalf("the next trial on lane 1 read the ended trial's %s: exit %d %q %q", old, code, out, stderr)
	}
	if _, stderr, code := r.RunAs("thermite", nil, "ls", dir); code == 0 || !strings.Contains(stderr, "Permission denied") {
		t.Fatalf("the controller's user listed the ended trial's folder: exit %d %q", code, stderr)
	}
	out, _, code = r.Thermite("status")
	if code != 0 || !strings.Contains(out, "ended trials kept: 1 folders") {
		t.Fatalf("status does not show the kept trial: exit %d\n%s", code, out)
	}
	out, stderr, code = r.Thermite("trial", "prune")
	if code != 0 || !strings.Contains(out, "removed the folders of 1 ended trials") {
		t.Fatalf("trial prune: exit %d %q %q", code, out, stderr)
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Fatalf("ended trial's folder %s still there after prune: %v", dir, err)
	}
	// The open trial is untouched; the ledger still has the ended one.
	if _, err := os.Stat(next.Workspace); err != nil {
		t.Fatalf("prune touched the open trial: %v", err)
	}
	out, _, _ = r.Thermite("trial", "list", "--json")
	var ts []controller.TrialStatus
	if err := json.Unmarshal([]byte(out), &ts); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, tr := range ts {
		if tr.ID == info.ID {
			found = true
			if tr.Removed.IsZero() {
				t.Errorf("ledger after prune: the trial is not marked removed")
			}
		}
	}
	if !found {
		t.Fatalf("the ledger lost the pruned trial %s", info.ID)
	}
	if _, stderr, code := r.Thermite("trial", "prune", "--older-than", "-1h"); code == 0 || !strings.Contains(stderr, "--older-than") {
		t.Fatalf("a negative --older-than was accepted: %d %q", code, stderr)
	}
}

// With trial.retain_ended = "0s" an ended trial's folder is removed as it
// ends; with a short retention, in the background once it is older.
func TestEndedTrialFolderRemovedAfterRetention(t *testing.T) {
	for _, keep := range []string{"0s", "2s"} {
		t.Run(keep, func(t *testing.T) {
			r := testrig.New(t, testrig.Options{Extra: "[trial]\nretain_ended = \"" + keep + "\"\n"})
			info, _ := startTrial(t, r, 1, makeProject(t, r))
			if _, stderr, code := r.Thermite("trial", "end", info.ID); code != 0 {
				t.Fatalf("trial end: %s", stderr)
			}
			dir := filepath.Dir(info.Workspace)
			deadline := time.Now().Add(30 * time.Second)
			for {
				_, err := os.Lstat(dir)
				if os.IsNotExist(err) {
					break
				}
				if keep == "0s" || time.Now().After(deadline) {
					t.Fatalf("retain_ended %s: the ended trial's folder is still there: %v", keep, err)
				}
				time.Sleep(200 * time.Millisecond)
			}
			// What it held at its end stays in the ledger.
			out, _, _ := r.Thermite("trial", "list", "--json")
			var ts []controller.TrialStatus
			if err := json.Unmarshal([]byte(out), &ts); err != nil || len(ts) != 1 {
				t.Fatalf("trial list: %v %q", err, out)
			}
			if ts[0].DiskBytes == 0 || ts[0].Removed.IsZero() {
				t.Fatalf("ledger: disk_bytes %d, removed %v; want what it held and when it was removed", ts[0].DiskBytes, ts[0].Removed)
			}
		})
	}
}

// TestPruneDuringATrialsEndPassesItOver: a prune (the operator's, or the
// retention's) that runs while a trial's end is under way, recorded but
// its lane not yet stopped, passes that trial over instead of failing on
// its still-running processes; the end retires the folder itself, and the
// next prune removes it.
func TestPruneDuringATrialsEndPassesItOver(t *testing.T) {
	r := newRig(t)
	project := makeProject(t, r)
	info, _ := startTrial(t, r, 1, project)
	// Leftovers make the stop take a while: the window a prune lands in.
	sleepers := "for i in $(seq 30); do setsid -f sleep 600 </dev/null >/dev/null 2>&1; done"
	if out, stderr, code := r.Thermite("trial", "exec", info.ID, "--", "sh", "-c", sleepers); code != 0 {
		t.Fatalf("trial exec: exit %d %s %s", code, out, stderr)
	}
	done := make(chan struct{})
	failed := make(chan string, 1)
	prunes := 0
	go func() {
		defer close(failed)
		for {
			select {
			case <-done:
				return
			default:
			}
			out, stderr, code := r.Thermite("trial", "prune")
			prunes++
			if code != 0 {
				failed <- fmt.Sprintf("exit %d %q %q", code, out, stderr)
				return
			}
		}
	}()
	time.Sleep(100 * time.Millisecond)
	if _, stderr, code := r.Thermite("trial", "end", info.ID); code != 0 {
		t.Fatalf("trial end: %s", stderr)
	}
	close(done)
	if msg, ok := <-failed; ok {
		t.Fatalf("a prune during the trial's end failed: %s", msg)
	}
	t.Logf("%d prunes ran during the end", prunes)
	// A prune that began after the end's retire may have removed it
	// already; after one more, it is gone either way.
	if out, stderr, code := r.Thermite("trial", "prune"); code != 0 {
		t.Fatalf("trial prune after the end: exit %d %q %q", code, out, stderr)
	}
	if dir := filepath.Dir(info.Workspace); !gone(dir) {
		t.Fatalf("ended trial's folder %s still there after the prunes", dir)
	}
}

func gone(p string) bool {
	_, err := os.Lstat(p)
	return os.IsNotExist(err)
}
