package controller

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"thermite/controller/ledger"
)

// TestTokenOfAnotherLaneRefusedOnALanesSocket: on lane 1's socket (or
// lane 1's agent's) the token of lane 2's open trial finds no trial, as a
// wrong token does; on lane 2's and on the operator's it finds its trial.
func TestTokenOfAnotherLaneRefusedOnALanesSocket(t *testing.T) {
	c, _ := testAPI()
	l, err := ledger.Open(filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c.ledger = l
	if err := l.PutRun(ledger.Run{ID: "default", Created: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	tr := ledger.Trial{ID: "t-lane2", Run: "default", Lane: 2, TokenHash: ledger.HashToken("tok-lane-2"), State: "open", Started: time.Now().UTC()}
	if err := l.StartTrial(tr); err != nil {
		t.Fatal(err)
	}
	c.trials = map[string]*trialRT{tr.ID: newTrialRT(tr)}

	for _, tc := range []struct {
		name  string
		from  *apiConnFrom
		found bool
	}{
		{"lane-1's socket", &apiConnFrom{socket: "/s/api/lane-1/api.sock", lane: 1}, false},
		{"agent-1's socket", &apiConnFrom{socket: "/s/api/agent-1/api.sock", lane: 1}, false},
		{"lane-2's socket", &apiConnFrom{socket: "/s/api/lane-2/api.sock", lane: 2}, true},
		{"the operator's socket", &apiConnFrom{socket: "/s/api/api.sock"}, true},
		{"TCP (no socket)", nil, true},
	} {
		r := httptest.NewRequest("GET", "/v1/trial", nil)
		r.Header.Set("Authorization", "Bearer tok-lane-2")
		if tc.from != nil {
			r = r.WithContext(context.WithValue(r.Context(), apiConnKey{}, *tc.from))
		}
		if got := c.trialForRequest(r) != nil; got != tc.found {
			t.Errorf("lane 2's token on %s: trial found %v, want %v", tc.name, got, tc.found)
		}
		if tc.found && tc.from != nil {
			if info := c.infoOn(r, tr); info.APISocket != tc.from.socket {
				t.Errorf("the trial's details on %s name %q, want the socket asked on", tc.name, info.APISocket)
			}
		}
	}
}
