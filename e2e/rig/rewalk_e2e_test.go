package rig

import (
	"os/exec"
	"strings"
	"testing"

	"thermite/controller"
	"thermite/internal/testrig"
)

// The disk check revisits only what changed (confined.Watched): each way a
// lane can grow its folders that no folder's change shows still ends its
// trial at the cap. A process of the lane is left running in each, so that
// no check reuses an idle measure: the incremental one is what is tested.
func TestLaneGrowsUnseenByFolderChangesEndsItsTrial(t *testing.T) {
	r := testrig.New(t, testrig.Options{Lanes: 6, Extra: "[trial]\ndisk_check = \"300ms\"\ndisk_cap_mb = 2\n"})
	project := makeProject(t, r)
	over := func(s controller.TrialStatus) bool {
		return s.State != "open" && strings.Contains(s.EndReason, "over its disk limit")
	}
	measured := func(s controller.TrialStatus) bool { return s.Disk != nil && s.Disk.Bytes > 0 }
	// later runs script as the lane, in the background, after two checks
	// have measured the trial with the lane's sleeper running.
	later := func(t *testing.T, id, script string) {
		t.Helper()
		cmd := "setsid -f sh -c 'sleep 1.5; " + script + "' </dev/null >/dev/null 2>&1"
		if _, stderr, code := r.Thermite("trial", "exec", id, "--", "sh", "-c", cmd); code != 0 {
			t.Fatalf("trial exec: %s", stderr)
		}
	}
	// Each case is its own lane's: they run side by side.
	t.Run("grows an existing file in place", func(t *testing.T) {
		t.Parallel()
		info, _ := startTrial(t, r, 1, project)
		r.Thermite("trial", "exec", info.ID, "--", "dd", "if=/dev/zero", "of=existing", "bs=64k", "count=1")
		waitTrial(t, r, info.ID, "a measure", measured)
		later(t, info.ID, "dd if=/dev/zero of=existing bs=1M count=3 seek=1 conv=notrunc")
		waitTrial(t, r, info.ID, "the end for its disk after growing a file in place", over)
	})
	t.Run("fills a sparse file's holes through mmap", func(t *testing.T) {
		t.Parallel()
		if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
			t.Skip("needs /usr/bin/python3 to write through mmap as the lane")
		}
		info, _ := startTrial(t, r, 2, project)
		r.Thermite("trial", "exec", info.ID, "--", "truncate", "-s", "3M", "holes")
		waitTrial(t, r, info.ID, "a measure", measured)
		// The descriptor is closed before the writes (no close event comes
		// after them), and the mapping stays while the writer sleeps.
		later(t, info.ID, `/usr/bin/python3 -c "import mmap,os,time
f=os.open(\"holes\",os.O_RDWR); m=mmap.mmap(f,3<<20); os.close(f); time.sleep(1)
for i in range(0,3<<20,4096): m[i]=1
m.flush(); time.sleep(60)"`)
		waitTrial(t, r, info.ID, "the end for its disk after filling holes through mmap", over)
	})
	t.Run("links a file into its HOME and writes through the gone link", func(t *testing.T) {
		t.Parallel()
		info, _ := startTrial(t, r, 3, project)
		r.Thermite("trial", "exec", info.ID, "--", "dd", "if=/dev/zero", "of=linked", "bs=4k", "count=1")
		waitTrial(t, r, info.ID, "a measure", measured)
		// The link lives between two checks; the writes come later,
		// through a descriptor of the removed name, with no event on
		// the workspace's own name.
		later(t, info.ID, `ln linked "$HOME/other" && exec 3<>"$HOME/other" && rm "$HOME/other" && sleep 1 && dd if=/dev/zero bs=1M count=3 >&3 && sleep 60`)
		waitTrial(t, r, info.ID, "the end for its disk after growing a file through a gone link in its HOME", over)
	})
	t.Run("links a file into its HOME, writes through the link and removes it between two checks", func(t *testing.T) {
		t.Parallel()
		info, _ := startTrial(t, r, 4, project)
		r.Thermite("trial", "exec", info.ID, "--", "dd", "if=/dev/zero", "of=linked", "bs=4k", "count=1")
		waitTrial(t, r, info.ID, "a measure", measured)
		// HOME sees a name come, be written and go; the workspace sees
		// nothing.
		later(t, info.ID, `ln linked "$HOME/other" && dd if=/dev/zero bs=1M count=3 >>"$HOME/other" && rm "$HOME/other" && sleep 60`)
		waitTrial(t, r, info.ID, "the end for its disk after growing a file through a link removed before the check", over)
	})
	t.Run("links a file into its HOME again, writes through it at one check, removes it at a later one", func(t *testing.T) {
		t.Parallel()
		info, _ := startTrial(t, r, 5, project)
		r.Thermite("trial", "exec", info.ID, "--", "touch", "linked")
		waitTrial(t, r, info.ID, "a measure", measured)
		// The first link is seen (every folder walked); the second, of a
		// file already known as linked, is not news. While both names are
		// there the file is counted twice (768 KiB each, under the cap);
		// once the HOME name is gone, the 768 KiB are the workspace
		// file's, and 1.5 MiB more in a new file put the lane over its
		// 2 MiB. The workspace's name saw no event.
		later(t, info.ID, `ln linked "$HOME/other" && sleep 2 && rm "$HOME/other" && sleep 2 && ln linked "$HOME/other" && sleep 2 && dd if=/dev/zero bs=768k count=1 >>"$HOME/other" && sleep 2 && rm "$HOME/other" && sleep 2 && dd if=/dev/zero of=more bs=512k count=3 && sleep 60`)
		waitTrial(t, r, info.ID, "the end for its disk after growing a linked file through its other name", over)
	})
	t.Run("floods events past the queue", func(t *testing.T) {
		t.Parallel()
		info, _ := startTrial(t, r, 6, project)
		waitTrial(t, r, info.ID, "a measure", measured)
		later(t, info.ID, `mkdir -p a/b/c/d/e/f/g/h && i=0; while [ $i -lt 20000 ]; do : > a/f$i; i=$((i+1)); done; dd if=/dev/zero of=a/b/c/d/e/f/g/h/deep bs=1M count=3`)
		waitTrial(t, r, info.ID, "the end for its disk after a flood of events and a deep new folder", over)
	})
}
