package rig

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"thermite/controller"
	"thermite/internal/testrig"
)

// mountWithUserQuotas mounts, on dir, a file system with user quota
// accounting on: tmpfs with usrquota (Linux 6.6+ with CONFIG_TMPFS_QUOTA),
// else a loop-mounted ext4 image made with the quota feature (needs
// CONFIG_QFMT_V2). Where neither mounts, the test skips, naming both.
func mountWithUserQuotas(t testing.TB, dir string, sizeMB int) string {
	t.Helper()
	err := unix.Mount("tmpfs", dir, "tmpfs", 0, "usrquota,size="+itoa(sizeMB)+"m,mode=0755")
	if err == nil {
		t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
		return "tmpfs"
	}
	whyTmpfs := err
	img := filepath.Join(t.TempDir(), "scratch.img")
	if err := os.Truncate(img, int64(sizeMB)<<20); err != nil {
		if f, ferr := os.Create(img); ferr == nil {
			f.Close()
		}
		os.Truncate(img, int64(sizeMB)<<20)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-O", "quota", "-E", "quotatype=usrquota", img).CombinedOutput(); err != nil {
		t.Skipf("needs a file system with user quotas: tmpfs usrquota: %v; mkfs.ext4 -O quota: %v %s", whyTmpfs, err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, dir).CombinedOutput(); err != nil {
		dmesg, _ := exec.Command("sh", "-c", "dmesg | grep -i quota | tail -n 1").Output()
		why := strings.TrimSpace(string(dmesg))
		if why == "" {
			why = strings.TrimSpace(string(out))
		}
		t.Skipf("needs a file system with user quotas: tmpfs -o usrquota: %v (CONFIG_TMPFS_QUOTA); ext4 -O quota does not mount: %s", whyTmpfs, why)
	}
	t.Cleanup(func() { exec.Command("umount", "-d", dir).Run() })
	os.Chmod(dir, 0o755)
	return "ext4"
}

// A lane on a rig whose scratch keeps user quotas is measured by its
// quota: status says so; an ended trial's folder, kept (retired) with its
// entries still the lane's, does not count against the lane's next trial;
// and a file the lane writes past its cap, unlinked and kept open so that
// no walk sees it, still ends the trial, the reason naming the quota.
func TestLaneWritesPastItsCapOnAQuotaFileSystemEndsItsTrial(t *testing.T) {
	testrig.RequireRoot(t)
	r := testrig.New(t, testrig.Options{NoStart: true, Extra: "[trial]\ndisk_cap_mb = 64\ndisk_check = \"200ms\"\n"})
	kind := mountWithUserQuotas(t, r.Cfg.StateDir, 512)
	if err := r.Start(); err != nil {
		t.Fatalf("start on %s with user quotas: %v\n%s", kind, err, r.LogText())
	}
	st := r.Status()
	if !strings.HasPrefix(st.DiskCheck, "quota ("+kind+" user quota on ") {
		t.Fatalf("status disk check: %q, want the quota path on %s", st.DiskCheck, kind)
	}
	out, _, _ := r.Thermite("status")
	if !strings.Contains(out, "disk check") || !strings.Contains(out, "quota ("+kind) {
		t.Errorf("status does not say the quota path:\n%s", out)
	}

	// Trial one leaves 40 MiB in its workspace, then ends: the folder is
	// kept, root's at the top, the 40 MiB still charged to lane-1.
	one, _ := startTrial(t, r, 1, makeProject(t, r))
	if _, stderr, code := r.Thermite("trial", "exec", one.ID, "--", "sh", "-c", "head -c 41943040 /dev/zero > kept && sync"); code != 0 {
		t.Fatalf("trial exec: exit %d %s", code, stderr)
	}
	if _, stderr, code := r.Thermite("trial", "end", one.ID); code != 0 {
		t.Fatalf("trial end: %d %s", code, stderr)
	}
	two, _ := startTrial(t, r, 1, makeProject(t, r))
	measured := func(s controller.TrialStatus) bool { return s.Disk != nil && !s.Disk.Checked.IsZero() }
	if got := waitTrial(t, r, two.ID, "measured", measured).Disk.Bytes; got >= 40<<20 {
		t.Fatalf("trial two measured %d bytes: the ended trial's kept folder counted against lane-1", got)
	}

	// Past the cap in a file no name links: only the quota (and the
	// unlinked-file helper, on the walk path) sees it.
	reason := holdUnlinkedUntilEnded(t, r, two.ID, 100)
	if !strings.Contains(reason, "of 64 MiB") || !strings.Contains(reason, "user quota") {
		t.Errorf("the end reason does not name the cap and the quota: %q", reason)
	}
	// The kept folders go; the quota gives back what they held.
	if _, stderr, code := r.Thermite("trial", "prune"); code != 0 {
		t.Fatalf("trial prune: %d %s", code, stderr)
	}
	// Their shares are given back: what trial three writes counts.
	three, _ := startTrial(t, r, 1, makeProject(t, r))
	if _, stderr, code := r.Thermite("trial", "exec", three.ID, "--", "sh", "-c", "head -c 8388608 /dev/zero > eight && sync"); code != 0 {
		t.Fatalf("trial exec: exit %d %s", code, stderr)
	}
	s := waitTrial(t, r, three.ID, "measured with its 8 MiB", func(s controller.TrialStatus) bool { return s.Disk != nil && s.Disk.Bytes >= 8<<20 })
	if s.Disk.Bytes >= 40<<20 {
		t.Fatalf("after the prune trial three measured %d bytes: the kept folders still counted", s.Disk.Bytes)
	}
}
