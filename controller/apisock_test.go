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
// wrong token does; on lane 2's agent's socket and on the operator's it
// finds its trial; on lane 2's own socket, where only a lane harness
// run's token is served, it finds none either.
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
		{"lane-1's socket", &apiConnFrom{socket: "/s/api/lane-1/api.sock", lane: 1, laneSocket: true}, false},
		{"agent-1's socket", &apiConnFrom{socket: "/s/api/agent-1/api.sock", lane: 1}, false},
		{"lane-2's socket", &apiConnFrom{socket: "/s/api/lane-2/api.sock", lane: 2, laneSocket: true}, false},
		{"agent-2's socket", &apiConnFrom{socket: "/s/api/agent-2/api.sock", lane: 2}, true},
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

// TestLaneTokensServedOnlyWhereTheyBelong is tokenServes's table, one row
// an attempt: the trial's token (the agent's, which a lane command that
// read it would hold) on the lane's own socket, a lane harness run's
// token on the agent's socket, the operator's, TCP or another lane's
// socket, and what each socket serves.
func TestLaneTokensServedOnlyWhereTheyBelong(t *testing.T) {
	lane1 := apiConnFrom{socket: "/s/api/lane-1/api.sock", lane: 1, laneSocket: true}
	agent1 := apiConnFrom{socket: "/s/api/agent-1/api.sock", lane: 1}
	lane2 := apiConnFrom{socket: "/s/api/lane-2/api.sock", lane: 2, laneSocket: true}
	operator := apiConnFrom{socket: "/s/api/api.sock"}
	for _, c := range []struct {
		attempt string
		from    apiConnFrom
		has     bool
		kind    tokenKind
		lane    int
		served  bool
	}{
		{"the trial's token on its lane's socket (a lane command that read it)", lane1, true, trialToken, 1, false},
		{"a lane run's token on its agent's socket", agent1, true, laneRunToken, 1, false},
		{"a lane run's token on the operator's socket", operator, true, laneRunToken, 1, false},
		{"a lane run's token over TCP", apiConnFrom{}, false, laneRunToken, 1, false},
		{"a lane run's token on another lane's socket", lane2, true, laneRunToken, 1, false},
		{"another lane's trial token on an agent's socket", agent1, true, trialToken, 2, false},
		{"a lane run's token on its lane's socket", lane1, true, laneRunToken, 1, true},
		{"the trial's token on its agent's socket", agent1, true, trialToken, 1, true},
		{"the trial's token on the operator's socket", operator, true, trialToken, 2, true},
		{"the trial's token over TCP", apiConnFrom{}, false, trialToken, 1, true},
	} {
		if got := tokenServes(c.from, c.has, c.kind, c.lane); got != c.served {
			t.Errorf("%s: served %v, want %v", c.attempt, got, c.served)
		}
	}
}
