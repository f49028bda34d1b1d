//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// QuotaResult is the quota path's case: the rig's scratch (its whole
// state dir) on an ext4 image made with the quota feature.
type QuotaResult struct {
	DiskCheck string `json:"disk_check"` // status's disk check line
	// KeptBytes is trial two's first measure on the lane whose trial one
	// left 40 MiB in its kept (retired) folder.
	KeptBytes int64 `json:"kept_bytes"`
	// AfterPrune is trial three's measure once the kept folders are
	// removed and it wrote 8 MiB: their shares given back, it counts.
	AfterPrune int64   `json:"after_prune"`
	EndReason  string  `json:"end_reason"`           // trial two's, after 100 MiB unlinked and open
	DiskError  string  `json:"disk_error,omitempty"` // why trial two was not measured, if it was not
	Seconds    float64 `json:"seconds"`
}

// modulesDir holds the modules kernels.sh packs for this case, and their
// order: each after what it needs (ext4: jbd2, crc16, mbcache; crc32c for
// the metadata checksums; quota_v2: quota_tree; loop for the image).
const modulesDir = "/opt/thermite/modules"

var modules = []string{"crc16", "mbcache", "jbd2", "crc32c_generic", "ext4", "loop", "quota_tree", "quota_v2"}

const (
	quotaCapMB = 64
	stateDir   = "/var/lib/thermite" // the default state_dir
)

// quotaCase mounts an ext4 with user quotas on the state dir, starts the
// rig there, and checks the quota path: status names it; an ended trial's
// kept folder, whose entries stay the lane's, does not count against the
// lane's next trial; and a file past the cap, unlinked and kept open,
// ends the trial with the cap's message naming the quota.
func quotaCase(base string, errf func(string, ...any)) (*QuotaResult, *exec.Cmd) {
	t0 := time.Now()
	q := &QuotaResult{}
	defer func() { q.Seconds = time.Since(t0).Seconds() }()
	for _, m := range modules {
		if err := loadModule(filepath.Join(modulesDir, m+".ko")); err != nil {
			errf("quota: load %s: %v", m, err)
			return q, nil
		}
	}
	img := "/tmp/scratch.img"
	if err := os.WriteFile(img, nil, 0o600); err != nil || os.Truncate(img, 384<<20) != nil {
		errf("quota: image: %v", err)
		return q, nil
	}
	if out, err := run("mkfs.ext4", "-q", "-F", "-O", "quota", "-E", "quotatype=usrquota", img); err != nil {
		errf("quota: mkfs.ext4 -O quota: %v: %s", err, out)
		return q, nil
	}
	if out, err := run("mount", "-o", "loop", img, stateDir); err != nil {
		errf("quota: mount the image on %s: %v: %s", stateDir, err, out)
		return q, nil
	}
	os.Chmod(stateDir, 0o755)
	os.WriteFile(cfgPath, []byte(base+fmt.Sprintf("[trial]\ndisk_cap_mb = %d\ndisk_check = \"500ms\"\n", quotaCapMB)), 0o644)
	broker, state := startBroker()
	if state != "ready" {
		errf("quota: start on the quota file system: %s", state)
		return q, nil
	}
	var st struct {
		DiskCheck string `json:"disk_check"`
	}
	out, err := run(bin, "status", "--json")
	if err != nil || json.Unmarshal(out, &st) != nil {
		errf("quota: status: %v: %s", err, out)
	}
	q.DiskCheck = st.DiskCheck
	fmt.Printf("RIG: quota: disk check: %s\n", q.DiskCheck)

	one, ok := trialStart(errf)
	if !ok {
		return q, broker
	}
	if out, err := run(bin, "trial", "exec", one, "--", "sh", "-c", "head -c 41943040 /dev/zero > kept && sync"); err != nil {
		errf("quota: trial exec: %v: %s", err, out)
	}
	if out, err := run(bin, "trial", "end", one); err != nil {
		errf("quota: trial end: %v: %s", err, out)
	}
	two, ok := trialStart(errf)
	if !ok {
		return q, broker
	}
	q.KeptBytes = -1
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		n, ok, why := trialDisk(two)
		if ok {
			q.KeptBytes = n
			break
		}
		q.DiskError = why
	}
	fmt.Printf("RIG: quota: trial two's first measure, after trial one kept 40 MiB: %d bytes %s\n", q.KeptBytes, q.DiskError)
	if q.KeptBytes < 0 {
		errf("quota: trial two was not measured: %s", q.DiskError)
		return q, broker
	}
	if out, err := run(bin, "trial", "exec", two, "--", "sh", "-c",
		`setsid -f sh -c 'exec 3>big && rm big && head -c 104857600 /dev/zero >&3 && exec sleep 600' </dev/null >/dev/null 2>&1`); err != nil {
		errf("quota: trial exec: %v: %s", err, out)
	}
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline) && q.EndReason == ""; time.Sleep(200 * time.Millisecond) {
		out, _ := run(bin, "trial", "list", "--json")
		var list []struct {
			ID     string `json:"id"`
			Reason string `json:"end_reason"`
		}
		json.Unmarshal(out, &list)
		for _, t := range list {
			if t.ID == two && strings.Contains(t.Reason, "over its disk limit") {
				q.EndReason = t.Reason
			}
		}
	}
	fmt.Printf("RIG: quota: trial two ended: %q\n", q.EndReason)
	if out, err := run(bin, "trial", "prune"); err != nil {
		errf("quota: trial prune: %v: %s; processes then: %s", err, out, processesNow())
		return q, broker
	}
	three, ok := trialStart(errf)
	if !ok {
		return q, broker
	}
	if out, err := run(bin, "trial", "exec", three, "--", "sh", "-c", "head -c 8388608 /dev/zero > eight && sync"); err != nil {
		errf("quota: trial exec: %v: %s", err, out)
	}
	q.AfterPrune = -1
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if n, ok, _ := trialDisk(three); ok && n >= 8<<20 {
			q.AfterPrune = n
			break
		} else if ok {
			q.AfterPrune = n
		}
	}
	fmt.Printf("RIG: quota: after the prune, trial three with 8 MiB written: %d bytes\n", q.AfterPrune)
	return q, broker
}

func trialStart(errf func(string, ...any)) (string, bool) {
	out, err := run(bin, "trial", "start", "--lane", "1", "--project", "/opt/thermite/examples/projects/sum", "--json")
	var tr struct {
		ID string `json:"id"`
	}
	if err != nil || json.Unmarshal(out, &tr) != nil || tr.ID == "" {
		errf("quota: trial start: %v: %s", err, out)
		return "", false
	}
	return tr.ID, true
}

// trialDisk is an open trial's last disk measure, once it has one, or why
// its measure failed.
func trialDisk(id string) (int64, bool, string) {
	out, _ := run(bin, "trial", "list", "--json")
	var list []struct {
		ID   string `json:"id"`
		Disk *struct {
			Bytes   int64  `json:"bytes"`
			Checked string `json:"checked"`
			Error   string `json:"error"`
		} `json:"disk"`
	}
	json.Unmarshal(out, &list)
	for _, t := range list {
		if t.ID == id && t.Disk != nil {
			return t.Disk.Bytes, t.Disk.Checked != "", t.Disk.Error
		}
	}
	return 0, false, ""
}

// loadModule loads one kernel module; one already there is fine.
func loadModule(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.FinitModule(fd, "", 0); err != nil && err != unix.EEXIST {
		return err
	}
	return nil
}

// processesNow lists every process but root's, one line each (pid, name,
// state, parent, real uid), so a failed step says what still ran.
func processesNow() string {
	var b strings.Builder
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		data, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		f := map[string]string{}
		for _, l := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok {
				f[k] = strings.Join(strings.Fields(v), " ")
			}
		}
		if strings.HasPrefix(f["Uid"], "0 ") {
			continue
		}
		fmt.Fprintf(&b, "[pid %s %s %s ppid %s uid %s] ", e.Name(), f["Name"], f["State"], f["PPid"], f["Uid"])
	}
	return b.String()
}
