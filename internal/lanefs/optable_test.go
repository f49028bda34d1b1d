package lanefs

import (
	"context"
	"encoding/json"
	"testing"
)

// TestEveryOpIsServedAndChangesAreCounted: each row of Ops is answered by
// the server under its name (never "unknown operation"), and a call of an
// operation that may change files moves the client's change count, which
// the controller's idle-disk check reads, while one that only looks does
// not: a write the count missed would let a trial that changed its
// workspace be taken for idle.
func TestEveryOpIsServedAndChangesAreCounted(t *testing.T) {
	ws := t.TempDir()
	c := start(t, ws)
	ctx := context.Background()
	args := map[string]string{
		"read": `{"path":"f"}`, "write": `{"path":"f","data":"aGk="}`, "edit": `{"path":"f","old":"hi","new":"ho"}`,
		"list": `{}`, "stat": `{"path":"f"}`, "delete": `{"path":"d"}`, "mkdir": `{"path":"d"}`,
		"grep": `{"pattern":"h"}`, "find": `{}`,
	}
	// In an order where each call succeeds: write before read, mkdir
	// before delete.
	for _, name := range []string{"write", "read", "edit", "list", "stat", "mkdir", "delete", "grep", "find"} {
		op := OpNamed(name)
		if op == nil {
			t.Fatalf("no operation %q in Ops", name)
		}
		req := op.NewRequest()
		if err := json.Unmarshal([]byte(args[name]), req); err != nil {
			t.Fatal(err)
		}
		before := c.Changes()
		if err := c.Call(ctx, op, req, op.NewResponse()); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if moved := c.Changes() != before; moved != op.Changes {
			t.Errorf("%s: the change count moved %v; the operation changes files: %v", name, moved, op.Changes)
		}
	}
	if len(args) != len(Ops) {
		t.Errorf("the test knows %d operations, Ops has %d", len(args), len(Ops))
	}
}
