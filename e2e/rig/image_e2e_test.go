package rig

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"thermite/internal/testrig"
)

func TestControlKey(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "key.pub")
	os.WriteFile(key, []byte("ssh-ed25519 AAAAC3Nza control\n"), 0o644)
	sum := sha256.Sum256([]byte("ssh-ed25519 AAAAC3Nza control\n"))
	good := hex.EncodeToString(sum[:])

	bad := testrig.New(t, testrig.Options{NoStart: true, ServeArgs: []string{"--control-key", key, "--control-key-sha256", strings.Repeat("ab", 32)}})
	err := bad.Start()
	if err == nil || !strings.Contains(err.Error(), "not the "+strings.Repeat("ab", 32)+" the launch named") {
		t.Fatalf("a key with another SHA-256 started the rig: %v", err)
	}

	r := testrig.New(t, testrig.Options{ServeArgs: []string{"--control-key", key, "--control-key-sha256", good}})
	var st syscall.Stat_t
	if err := syscall.Stat(r.Cfg.ControlKey(), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 0 || int(st.Gid) != r.Role("thermite").GID || st.Mode&0o777 != 0o640 {
		t.Fatalf("key copy %d:%d %o, want root:thermite 0640", st.Uid, st.Gid, st.Mode&0o777)
	}
	if got := r.Probe("lane-1", "write", r.Cfg.ControlKey()); got != "EACCES" {
		t.Errorf("lane-1 writes the key copy: %s", got)
	}
	res, code := selftestJSON(t, r)
	if code != 0 {
		t.Fatalf("self-test: %s", res.Sentence)
	}
	found := false
	for _, p := range res.Probes {
		if strings.HasPrefix(p.Attempt, "control's key copy") && p.OK {
			found = true
		}
	}
	if !found {
		t.Fatal("no control key row")
	}
	// The copy changed behind the broker's back: the self-test says so.
	os.WriteFile(r.Cfg.ControlKey(), []byte("another key\n"), 0o640)
	res, code = selftestJSON(t, r)
	if code == 0 || !strings.Contains(res.Sentence, "control's key copy") {
		t.Fatalf("a changed key copy: %s", res.Sentence)
	}
}

func TestHostVariablesAreStripped(t *testing.T) {
	r := testrig.New(t, testrig.Options{Env: []string{"RUNPOD_API_KEY=rp-secret-value", "RUNPOD_POD_ID=abc"}})
	out, _, _ := r.RunAs("lane-1", nil, "env")
	if strings.Contains(out, "RUNPOD") || strings.Contains(out, "rp-secret-value") {
		t.Fatalf("a role's environment has the host's variables:\n%s", out)
	}
	env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", r.Status().BrokerPID))
	if strings.Contains(string(env), "RUNPOD") {
		t.Fatal("the broker kept RUNPOD_ variables")
	}
	if res, code := selftestJSON(t, r); code != 0 {
		t.Fatalf("self-test: %s", res.Sentence)
	}
}

func TestOneContainerRows(t *testing.T) {
	dir, err := os.MkdirTemp("", "thermite-image-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	defer os.RemoveAll(dir)
	sup, inbox, outbox, scan := filepath.Join(dir, "supervisor"), filepath.Join(dir, "inbox"), filepath.Join(dir, "outbox"), filepath.Join(dir, "image")
	os.MkdirAll(scan, 0o755)
	key := filepath.Join(dir, "key.pub")
	os.WriteFile(key, []byte("control key\n"), 0o644)
	sum := sha256.Sum256([]byte("control key\n"))
	r := testrig.New(t, testrig.Options{NoStart: true, ServeArgs: []string{"--control-key", key, "--control-key-sha256", hex.EncodeToString(sum[:])},
		Extra: fmt.Sprintf("[image]\none_container = true\nsupervisor_dir = %q\ninbox = %q\noutbox = %q\nscan_root = %q\n", sup, inbox, outbox, scan)})
	s, c := r.Role("supervisor"), r.Role("thermite")
	for _, d := range []struct {
		p        string
		uid, gid int
		mode     os.FileMode
	}{{sup, s.UID, s.GID, 0o700}, {inbox, s.UID, c.GID, 0o750}, {outbox, c.UID, s.GID, 0o750}} {
		os.Mkdir(d.p, 0o700)
		os.Chown(d.p, d.uid, d.gid)
		os.Chmod(d.p, d.mode|os.ModeSetgid)
	}
	os.WriteFile(filepath.Join(sup, "token"), []byte("supervisor-token"), 0o600)
	os.Chown(filepath.Join(sup, "token"), s.UID, s.GID)
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	res, code := selftestJSON(t, r)
	if code != 0 {
		t.Fatalf("self-test: %s", res.Sentence)
	}
	rows := map[string]int{}
	for _, p := range res.Probes {
		for _, a := range []string{"read the supervisor's folder", "read the supervisor's token", "read the outbox", "write the inbox", "no file in the image keeps a set-id bit"} {
			if strings.HasPrefix(p.Attempt, a) {
				rows[a]++
			}
		}
	}
	if len(rows) != 5 {
		t.Fatalf("image rows: %v", rows)
	}
	// The supervisor itself reaches its own place.
	if got := r.Probe("supervisor", "read", filepath.Join(sup, "token")); got != "ok" {
		t.Errorf("the supervisor reads its token: %s", got)
	}
	// Break two things: the outbox opened to all, a set-id file in the image.
	os.Chmod(outbox, 0o755|os.ModeSetgid)
	suid := filepath.Join(scan, "bin-su")
	os.WriteFile(suid, []byte("x"), 0o755)
	os.Chmod(suid, 0o755|os.ModeSetuid)
	res, _ = selftestJSON(t, r)
	got := failing(res)
	if len(got["read the outbox"]) == 0 || len(got["no file in the image keeps a set-id bit"]) == 0 || len(got) != 2 {
		t.Fatalf("failing rows %v, want exactly the outbox and the set-id scan\n%s", got, res.Sentence)
	}
	if !strings.Contains(res.Sentence, suid) {
		t.Errorf("the sentence does not name %s: %s", suid, res.Sentence)
	}
}
