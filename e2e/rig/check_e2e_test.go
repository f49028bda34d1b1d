package rig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"thermite/internal/testrig"
)

// TestCheckAsOperator drives `thermite check` on a stand-in /proc and /sys
// (the rig's [host] roots): a host that shows kernel addresses fails with
// the row and its fix, and passes once the setting is changed; status
// carries the verdict.
func TestCheckAsOperator(t *testing.T) {
	r0 := testrig.New(t, testrig.Options{NoStart: true})
	root := filepath.Join(r0.Dir, "host")
	set := func(p, v string) {
		os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755)
		if err := os.WriteFile(filepath.Join(root, p), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for k, v := range map[string]string{
		"proc/sys/kernel/kptr_restrict": "0", "proc/sys/kernel/dmesg_restrict": "1",
		"proc/sys/fs/protected_symlinks": "1", "proc/sys/fs/protected_hardlinks": "1",
		"proc/sys/kernel/perf_event_paranoid": "2", "proc/swaps": "Filename Type Size Used Priority",
	} {
		set(k, v)
	}
	os.MkdirAll(filepath.Join(root, "sys/kernel/debug"), 0o700)
	cfg, _ := os.ReadFile(r0.Config)
	extra := "\n[host]\nproc_root = " + `"` + filepath.Join(root, "proc") + `"` + "\nsys_root = " + `"` + filepath.Join(root, "sys") + `"` + "\nsetid_dirs = []\n"
	os.WriteFile(r0.Config, append(cfg, extra...), 0o644)

	out, stderr, code := r0.Thermite("check")
	if code != 1 || !strings.HasPrefix(out, "the host weakens isolation: kernel.kptr_restrict") {
		t.Fatalf("check with kptr_restrict=0: exit %d\n%s%s", code, out, stderr)
	}
	if !strings.Contains(out, "fix: sysctl -w kernel.kptr_restrict=1") {
		t.Errorf("check does not say what to change:\n%s", out)
	}
	set("proc/sys/kernel/kptr_restrict", "2")
	out, stderr, code = r0.Thermite("check", "--json")
	var v struct {
		Holds bool
		Rows  []struct {
			Name string
			OK   bool
		}
	}
	if err := jsonDecode(out, &v); err != nil || code != 0 || !v.Holds {
		t.Fatalf("check --json with kptr_restrict=2: exit %d, %v\n%s%s", code, err, out, stderr)
	}
	if err := r0.Start(); err != nil {
		t.Fatal(err)
	}
	out, _, code = r0.Thermite("status")
	if code != 0 || !strings.Contains(out, "host check: the host holds") {
		t.Errorf("status does not carry the host check's verdict: exit %d\n%s", code, out)
	}
}
