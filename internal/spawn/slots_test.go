package spawn

import (
	"os"
	"strings"
	"testing"
)

// TestPrepareRefusesSlots: a command whose slots would not give it what
// their names say is refused before any child exists, naming the slot;
// slots with a gap between their numbers are taken. No root needed.
func TestPrepareRefusesSlots(t *testing.T) {
	a, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, tc := range []struct {
		name  string
		slots []Slot
		want  string // "" where prepare takes them
	}{
		{"none", nil, ""},
		{"two with a gap", []Slot{{Name: "bootstrap", FD: 7, File: a}, {Name: "egress", FD: 9, File: b}}, ""},
		{"one file in two slots", []Slot{{Name: "bootstrap", FD: 7, File: a}, {Name: "copy", FD: 8, File: a}}, ""},
		{"stdin's number", []Slot{{Name: "bootstrap", FD: 0, File: a}}, "slot bootstrap: descriptor 0 is stdin, stdout or stderr"},
		{"stderr's number", []Slot{{Name: "bootstrap", FD: 2, File: a}}, "slot bootstrap: descriptor 2 is stdin, stdout or stderr"},
		{"negative", []Slot{{Name: "bootstrap", FD: -1, File: a}}, "slot bootstrap: descriptor -1"},
		{"one number twice", []Slot{{Name: "bootstrap", FD: 7, File: a}, {Name: "api", FD: 7, File: b}}, "slots bootstrap and api both want descriptor 7"},
		{"one name twice", []Slot{{Name: "egress", FD: 8, File: a}, {Name: "egress", FD: 9, File: b}}, "two slots are named egress"},
		{"no file", []Slot{{Name: "api", FD: 8}}, "slot api (descriptor 8) has no file"},
		{"no name", []Slot{{FD: 8, File: a}}, "the slot for descriptor 8 has no name"},
	} {
		c := &Command{
			Argv: []string{"/bin/true"}, UID: 1000, GID: 1000,
			Stdin: a, Stdout: a, Stderr: a, Slots: tc.slots,
		}
		p, err := prepare(c)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.want == "" && len(p.slotTo) != 3+len(tc.slots):
			t.Errorf("%s: %d slots prepared, want %d", tc.name, len(p.slotTo), 3+len(tc.slots))
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want a refusal with %q", tc.name, err, tc.want)
		}
	}
}

// TestSlotsWithAGap: slots need not follow each other; a number between
// two of them is closed in the command, like every number the caller did
// not give it.
func TestSlotsWithAGap(t *testing.T) {
	r := newRig(t)
	passwd, err := os.Open("/etc/passwd")
	if err != nil {
		t.Fatal(err)
	}
	defer passwd.Close()
	group, err := os.Open("/etc/group")
	if err != nil {
		t.Fatal(err)
	}
	defer group.Close()
	c := r.command("fds", "10", "11", "13")
	c.Slots = []Slot{{Name: "passwd", FD: 7, File: passwd}, {Name: "group", FD: 12, File: group}}
	out := r.run(c)
	for _, want := range []string{"open 7 /etc/passwd", "open 12 /etc/group", "fd 10: EBADF", "fd 11: EBADF", "fd 13: EBADF"} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("want %q in:\n%s", want, out)
		}
	}
}
