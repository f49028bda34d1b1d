package landlock

import (
	"testing"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
)

// With NoMeetingPoints a command's own places grant every right of a role
// but making a socket or a FIFO, which the rule set still handles, so it
// makes neither anywhere; without it they grant them.
func TestRolePolicyNoMeetingPoints(t *testing.T) {
	own := t.TempDir()
	for _, noMeeting := range []bool{true, false} {
		p, _, err := RolePolicy(RoleSpec{Network: "none", DevRoot: t.TempDir(), Writable: []string{own}, NoMeetingPoints: noMeeting})
		if err != nil {
			t.Fatal(err)
		}
		if p.HandledFS&meetingPointRights != meetingPointRights {
			t.Errorf("NoMeetingPoints %v: the rule set does not handle MAKE_SOCK and MAKE_FIFO (%#x)", noMeeting, p.HandledFS)
		}
		// What the own place grants is the union of its rules (the read
		// rule of everything, and its own).
		var granted uint64
		for _, r := range p.Rules {
			if r.Path == own {
				granted |= r.Access
			} else if r.Access&meetingPointRights != 0 {
				t.Errorf("NoMeetingPoints %v: %s grants MAKE_SOCK or MAKE_FIFO (%#x)", noMeeting, r.Path, r.Access)
			}
		}
		want := uint64(RoleRights)
		if noMeeting {
			want &^= ll.AccessFSMakeSock | ll.AccessFSMakeFifo
		}
		if granted != want {
			t.Errorf("NoMeetingPoints %v: its own place grants %#x, want %#x", noMeeting, granted, want)
		}
	}
}
