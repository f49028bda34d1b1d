package landlock

import (
	"os"
	"path/filepath"
	"testing"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
)

// The controller's rule set grants each place exactly its kind of right,
// leaves out what does not exist, and never follows a symlink it was
// given (one the controller's user placed would grant its target).
func TestControllerPolicyGrantsEachPlaceItsRights(t *testing.T) {
	dir := t.TempDir()
	own, sock, kits, ledger, elsewhere := filepath.Join(dir, "own"), filepath.Join(dir, "sock"), filepath.Join(dir, "kits"), filepath.Join(dir, "ledger.db"), filepath.Join(dir, "elsewhere")
	for _, d := range []string{own, sock, kits, elsewhere} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(ledger, nil, 0o600)
	link := filepath.Join(dir, "link")
	os.Symlink(elsewhere, link)
	p := ControllerPolicy(ControllerSpec{
		Read: []string{"/etc", filepath.Join(dir, "missing")}, Exec: []string{kits, link},
		Binary: "/proc/self/exe", Writable: []string{own}, Sockets: []string{sock}, Files: []string{ledger},
	})
	got := map[string]uint64{}
	for _, r := range p.Rules {
		got[r.Path] |= r.Access
	}
	want := map[string]uint64{
		"/etc":           ll.AccessFSReadFile | ll.AccessFSReadDir,
		kits:             ll.AccessFSReadFile | ll.AccessFSReadDir | ll.AccessFSExecute,
		"/proc/self/exe": ll.AccessFSReadFile | ll.AccessFSExecute,
		own:              ll.AccessFSReadFile | ll.AccessFSReadDir | RoleRights,
		sock:             ll.AccessFSReadFile | ll.AccessFSReadDir | ll.AccessFSMakeSock | ll.AccessFSRemoveFile,
		ledger:           ll.AccessFSReadFile | ll.AccessFSWriteFile | ll.AccessFSTruncate,
	}
	for path, access := range want {
		if got[path] != access {
			t.Errorf("%s: rights %#x, want %#x", path, got[path], access)
		}
	}
	for _, path := range []string{link, elsewhere, filepath.Join(dir, "missing")} {
		if _, ok := got[path]; ok {
			t.Errorf("%s was granted %#x", path, got[path])
		}
	}
	if p.HandledFS != ControllerRights || p.HandledFS&ll.AccessFSExecute == 0 || p.Scoped == 0 {
		t.Errorf("handled %#x, scoped %#x", p.HandledFS, p.Scoped)
	}
}
