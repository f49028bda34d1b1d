package rig

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"thermite/internal/rpc"
)

// A trial's start copies the project once: the operator's import, made
// the lane's entry by entry as it is copied, is moved into place and only
// its top changes hands. Nothing is left in the controller's projects,
// every entry is the lane's, and the lane writes in its subfolders.
func TestTrialStartCopiesOnce(t *testing.T) {
	r := newRig(t)
	project := makeProject(t, r)
	info, _ := startTrial(t, r, 1, project)
	projects := filepath.Join(r.Cfg.ControllerDir(), "projects")
	if left, _ := os.ReadDir(projects); len(left) != 0 {
		t.Fatalf("the import was left in %s: %v", projects, left)
	}
	lane := r.Role("lane-1")
	for _, p := range []string{info.Workspace, filepath.Join(info.Workspace, "src"), filepath.Join(info.Workspace, "src", "main.txt")} {
		var st syscall.Stat_t
		statOf(t, p, &st)
		if int(st.Uid) != lane.UID || int(st.Gid) != lane.GID || st.Mode&0o6000 != 0 {
			t.Errorf("%s: %d:%d %04o, want lane-1's (%d:%d), no set-id bits", p, st.Uid, st.Gid, st.Mode&0o7777, lane.UID, lane.GID)
		}
	}
	if out, stderr, code := r.Thermite("trial", "exec", info.ID, "--", "sh", "-c", "echo more >> src/main.txt && mkdir src/new && cat src/main.txt"); code != 0 || !strings.Contains(out, "more") {
		t.Fatalf("the lane cannot write its workspace: exit %d %q %q", code, out, stderr)
	}
}

// The broker hands over only a folder's top for a trial's workspace and
// for nothing else: not outside scratch/trials, and never a folder another
// role owns (which would give one lane a tree another lane wrote).
func TestHandTopOnlyRefusedOutsideAWorkspace(t *testing.T) {
	r := newRig(t)
	project := makeProject(t, r)
	info2, _ := startTrial(t, r, 2, project)
	for _, c := range []struct{ path, want string }{
		{filepath.Join(r.Cfg.ResearchDir(), "default"), "top_only is for a trial's workspace"},
		{info2.Workspace, "neither the controller's nor lane-1's"},
	} {
		_, err := rpc.Call(r.Cfg.BrokerSocket(), &rpc.Request{Op: rpc.OpHandFolder, HandFolder: &rpc.HandFolderRequest{Path: c.path, Role: "lane-1", TopOnly: true}})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("top-only hand of %s to lane-1: %v, want %q", c.path, err, c.want)
		}
	}
	var st syscall.Stat_t
	statOf(t, info2.Workspace, &st)
	if int(st.Uid) != r.Role("lane-2").UID {
		t.Fatalf("lane-2's workspace changed hands: uid %d", st.Uid)
	}
}
