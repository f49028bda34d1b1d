package broker

import (
	"bytes"
	"testing"

	"thermite/internal/posixacl"
	"thermite/roles"
)

// TestTrialGateLetsOnlyItsLaneAndAgentThrough: a trial's folder, closed by
// TrialGate's ACL, lets its lane and that lane's agent search it (to reach
// the workspace, the lane harness's home and the agent folder, whatever
// their modes) and the controller do everything; another lane that wants
// what lane-1 opened inside, another lane's agent, the judge's users and
// the other roles pass nothing, and no one but the owner lists or writes
// it.
func TestTrialGateLetsOnlyItsLaneAndAgentThrough(t *testing.T) {
	table, err := roles.New(roles.Spec{Prefix: "t-", Base: 50000, Lanes: 3, TimingUsers: 2})
	if err != nil {
		t.Fatal(err)
	}
	acl, err := TrialGate(table, "lane-1")
	if err != nil {
		t.Fatal(err)
	}
	// The kernel takes it as written (the attribute round-trips).
	raw, err := posixacl.Encode(acl)
	if err != nil {
		t.Fatal(err)
	}
	back, err := posixacl.Decode(raw)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := posixacl.Encode(back)
	if !bytes.Equal(raw, again) {
		t.Fatalf("the ACL does not round-trip: %x, then %x", raw, again)
	}
	ctl := table.Controller()
	for _, c := range []struct {
		attack string
		role   string
		want   uint16 // the rights it gets, of rwx
	}{
		{"the lane reaches its workspace", "lane-1", posixacl.Execute},
		{"the lane's agent reaches its agent folder", "agent-1", posixacl.Execute},
		{"the controller, its owner, makes and removes what is inside", "thermite", posixacl.Read | posixacl.Write | posixacl.Execute},
		{"another lane reaches what lane-1 opened inside", "lane-2", 0},
		{"another lane's agent reaches lane-1's agent folder", "agent-2", 0},
		{"a third lane", "lane-3", 0},
		{"the timing user's candidate reaches a listener lane-1 opened", "run", 0},
		{"another card's timing user", "run-2", 0},
		{"the builder reaches lane-1's workspace", "builder", 0},
		{"the planner", "planner", 0},
		{"the model check", "model-check", 0},
	} {
		r, ok := table.Role(c.role)
		if !ok {
			t.Fatalf("no role %s", c.role)
		}
		groups := append([]uint32{uint32(r.GID)}, toU32(r.Groups)...)
		for _, right := range []uint16{posixacl.Read, posixacl.Write, posixacl.Execute} {
			got := posixacl.Allows(acl, uint32(ctl.UID), uint32(ctl.GID), uint32(r.UID), groups, right)
			if want := c.want&right != 0; got != want {
				t.Errorf("%s (%s): right %o: %v, want %v", c.attack, c.role, right, got, want)
			}
		}
	}
	for _, bad := range []string{"agent-1", "run", "thermite", "lane-9", ""} {
		if _, err := TrialGate(table, bad); err == nil {
			t.Errorf("TrialGate(%q) closed a trial's folder for a role that is not a lane", bad)
		}
	}
}

func toU32(xs []int) []uint32 {
	out := make([]uint32, len(xs))
	for i, x := range xs {
		out[i] = uint32(x)
	}
	return out
}
