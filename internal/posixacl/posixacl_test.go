package posixacl

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestEncodeRefusesWhatTheKernelRefuses: an ACL without its owner's,
// group's or others' entry, with named entries and no mask, with a name
// twice or with bits beyond rwx never reaches the kernel.
func TestEncodeRefusesWhatTheKernelRefuses(t *testing.T) {
	base := []Entry{{Tag: UserObj, Perm: 7}, {Tag: GroupObj}, {Tag: Other}}
	if _, err := Encode(base); err != nil {
		t.Fatalf("a plain mode's ACL: %v", err)
	}
	for name, es := range map[string][]Entry{
		"no owner":        {{Tag: GroupObj}, {Tag: Other}},
		"no other":        {{Tag: UserObj, Perm: 7}, {Tag: GroupObj}},
		"named, no mask":  append(base, Entry{Tag: User, Perm: 1, ID: 5}),
		"a name twice":    append(base, Entry{Tag: User, Perm: 1, ID: 5}, Entry{Tag: User, Perm: 1, ID: 5}, Entry{Tag: Mask, Perm: 1}),
		"bits beyond rwx": {{Tag: UserObj, Perm: 8}, {Tag: GroupObj}, {Tag: Other}},
		"two masks":       append(base, Entry{Tag: Mask}, Entry{Tag: Mask}),
		"an unknown tag":  append(base, Entry{Tag: 0x40}),
	} {
		if _, err := Encode(es); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
}

// TestSetTakesAndKeepsTheACL: as root, a folder given an ACL naming a user
// keeps it, its mode's group bits become the mask, and Remove takes it
// away again. (The kernel's own check of who passes is the e2e tests'.)
func TestSetTakesAndKeepsTheACL(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it names another user in a folder's ACL")
	}
	dir := filepath.Join(t.TempDir(), "gate")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	es := []Entry{{Tag: UserObj, Perm: 7}, {Tag: User, Perm: Execute, ID: 45990}, {Tag: GroupObj}, {Tag: Mask, Perm: Execute}, {Tag: Other}}
	if err := Set(fd, es); errors.Is(err, unix.EOPNOTSUPP) {
		t.Skip("the temporary folder's file system keeps no ACL")
	} else if err != nil {
		t.Fatal(err)
	}
	got, err := Get(fd)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(es) {
		t.Fatalf("read back %v, want %v", got, es)
	}
	for i := range es {
		if got[i].Tag != es[i].Tag || got[i].Perm != es[i].Perm || (es[i].Tag == User && got[i].ID != es[i].ID) {
			t.Errorf("entry %d: %+v, want %+v", i, got[i], es[i])
		}
	}
	var st unix.Stat_t
	unix.Fstat(fd, &st)
	if st.Mode&0o777 != 0o710 {
		t.Errorf("mode %04o, want 0710 (the mask as the group's bits)", st.Mode&0o777)
	}
	if err := Remove(fd); err != nil {
		t.Fatal(err)
	}
	if got, err := Get(fd); err != nil || got != nil {
		t.Errorf("after Remove: %v %v, want no ACL", got, err)
	}
}

// TestAllowsAsTheKernel: the owner's entry decides for the owner, a named
// user's entry (through the mask) for that user, and nobody else gets
// more than others' entry.
func TestAllowsAsTheKernel(t *testing.T) {
	es := []Entry{{Tag: UserObj, Perm: 7}, {Tag: User, Perm: 7, ID: 10}, {Tag: GroupObj, Perm: 5}, {Tag: Mask, Perm: 1}, {Tag: Other}}
	for _, c := range []struct {
		what   string
		uid    uint32
		groups []uint32
		want   uint16
		ok     bool
	}{
		{"the owner writes", 1, nil, Write, true},
		{"the named user searches", 10, nil, Execute, true},
		{"the named user cannot read past the mask", 10, nil, Read, false},
		{"the owner's group cannot read past the mask", 20, []uint32{2}, Read, false},
		{"the owner's group searches", 20, []uint32{2}, Execute, true},
		{"anyone else", 30, []uint32{3}, Execute, false},
	} {
		if got := Allows(es, 1, 2, c.uid, c.groups, c.want); got != c.ok {
			t.Errorf("%s: %v, want %v", c.what, got, c.ok)
		}
	}
}
