package broker

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// CheckControlKey reads control's key and checks it against the SHA-256
// the launch named. The supervisor shares the container, so it must not
// choose the key the harness trusts: a key whose hash does not match
// refuses the start.
func CheckControlKey(path, want string) ([]byte, error) {
	if path == "" || want == "" {
		return nil, fmt.Errorf("control key: give both --control-key and --control-key-sha256")
	}
	want = strings.ToLower(want)
	if b, err := hex.DecodeString(want); err != nil || len(b) != sha256.Size {
		return nil, fmt.Errorf("control key: --control-key-sha256 %q is not a hex SHA-256", want)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("control key: %w", err)
	}
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != want {
		return nil, fmt.Errorf("control key: %s has SHA-256 %s, not the %s the launch named: refusing to start", path, got, want)
	}
	return data, nil
}

// SetControlKey has the broker install control's key at start.
func (b *Broker) SetControlKey(path, sha string) {
	b.ctl.keyPath, b.ctl.keySHA = path, strings.ToLower(sha)
}

// ControlKeySHA256 is the SHA-256 the launch named, or "".
func (b *Broker) ControlKeySHA256() string { return b.ctl.keySHA }

// installControlKey checks control's key again and installs a copy that
// only root can write, readable by the controller's group: root:thermite
// 0640 in a root:thermite 0750 folder.
func (b *Broker) installControlKey() error {
	if b.ctl.keyPath == "" {
		return nil
	}
	data, err := CheckControlKey(b.ctl.keyPath, b.ctl.keySHA)
	if err != nil {
		return err
	}
	dst := b.cfg.ControlKey()
	gid := b.table.Controller().GID
	if err := ensureFolder(folder{filepath.Dir(dst), 0, gid, 0o750}); err != nil {
		return fmt.Errorf("control key: %w", err)
	}
	tmp := dst + ".new"
	os.Remove(tmp)
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("control key: %w", err)
	}
	if err := os.Chown(tmp, 0, gid); err != nil {
		return fmt.Errorf("control key: %w", err)
	}
	if err := os.Chmod(tmp, 0o640); err != nil {
		return fmt.Errorf("control key: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("control key: %w", err)
	}
	b.log.Info("control key installed", "path", dst, "sha256", b.ctl.keySHA)
	return nil
}
