package rig

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"thermite/internal/testrig"
)

// Issue 27: a lane may make the rig work for it only at a bounded rate;
// what it asks beyond that costs it (its own backlog, its own 429), not
// the controller, and the lanes beside it are served.

// TestLaneConnectLoopWaitsInItsOwnBacklog: lane-1 connects and closes in
// a loop on its own API socket, on 4 goroutines, with api.accept_rate 20
// and api.accept_burst 20. The controller accepts its connections no
// faster than the rate: every connect that went through was accepted or
// is still in the socket's backlog (as long as api.accept_burst), so they
// number at most the burst, the rate over the flood's time and the
// backlog; the rest fail at lane-1's own connect with EAGAIN. Meanwhile
// lane 2's lane and agent, and lane 1's own agent (a listener of its
// own), each make 10 calls on fresh connections: all answered 200.
func TestLaneConnectLoopWaitsInItsOwnBacklog(t *testing.T) {
	const rate, burst = 20, 20
	r := testrig.New(t, testrig.Options{Alone: true, APIExtra: "accept_rate = " + strconv.Itoa(rate) + "\naccept_burst = " + strconv.Itoa(burst) + "\n"})
	p := makeProject(t, r)
	t1, _ := startTrial(t, r, 1, p)
	t2, _ := startTrial(t, r, 2, p)
	run2 := startLaneRun(t, r, t2.ID)

	flood := startAs(t, r, "lane-1", "connect-close", "ATTACK_SOCKET="+r.Cfg.RoleAPISocket("lane-1"), "ATTACK_N=4", "ATTACK_MS=60000")
	flood.expect("flooding", 20*time.Second)
	for _, c := range []struct{ role, sock, token string }{
		{"lane-2", r.Cfg.RoleAPISocket("lane-2"), run2.token},
		{"agent-2", t2.APISocket, tokenOf(t, t2)},
		{"agent-1", t1.APISocket, tokenOf(t, t1)},
	} {
		calls := startAs(t, r, c.role, "calls", "ATTACK_SOCKET="+c.sock, "ATTACK_TOKEN="+c.token, "ATTACK_N=10", "ATTACK_FRESH=1")
		if l := calls.expect("calls ", time.Minute); field(t, l, "ok") != 10 {
			t.Errorf("%s's calls on its own socket while lane-1 floods its own: %s, want all 10 answered 200", c.role, l)
		}
	}
	flood.stdin.Close()
	line := flood.expect("connect-close ", 30*time.Second)
	t.Logf("lane-1: %s", line)
	if strings.Contains(line, "stopped-by limit") {
		t.Fatalf("lane-1's flood ended by its time limit before the other roles' calls were done: %s", line)
	}
	took := field(t, line, "ms")
	most := burst + rate*(took+999)/1000 + (burst + 1) + 1
	if ok := field(t, line, "ok"); ok > most {
		t.Errorf("lane-1's connects that went through in %d ms: %d, over the %d that api.accept_rate %d, api.accept_burst %d and a backlog of %d allow: the controller accepted past its rate", took, ok, most, rate, burst, burst)
	}
	if n := eagains(t, line); n < 1 {
		t.Errorf("lane-1's flood past its accept rate: no connect failed with EAGAIN, its own error: %s", line)
	}
	if n, list := openTrials(t, r); n != 2 {
		t.Fatalf("a trial ended under lane-1's flood:\n%s", list)
	}
}

// eagains is how many of a connect-close line's connects failed with
// EAGAIN.
func eagains(t testing.TB, line string) int {
	t.Helper()
	_, rest, ok := strings.Cut(line, "EAGAIN=")
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimRight(strings.Fields(rest)[0], `"`))
	if err != nil {
		t.Fatalf("EAGAIN's count in %q: %v", line, err)
	}
	return n
}

// TestLaneRequestFloodTold429OthersServed: lane 1's agent asks GET
// /v1/trial as fast as it can on 8 goroutines, with api.request_rate 20
// and api.request_burst 20 (its accepts unbounded, so that the request
// rate is what holds it). Past its rate it is answered 429 with a problem
// naming the limit and its value and a Retry-After, and at most the burst
// and the rate over its time are answered 200; a file write with a 1 MiB
// body never sent is answered 429 too, so the refusal comes before the
// body is read. Meanwhile lane 1's lane (a role of its own, its lane
// harness run's token) and lane 2's agent each make 10 calls: all
// answered 200.
func TestLaneRequestFloodTold429OthersServed(t *testing.T) {
	const rate, burst = 20, 20
	r := testrig.New(t, testrig.Options{Alone: true, APIExtra: "request_rate = " + strconv.Itoa(rate) + "\nrequest_burst = " + strconv.Itoa(burst) + "\naccept_rate = 100000\naccept_burst = 4096\n"})
	p := makeProject(t, r)
	t1, _ := startTrial(t, r, 1, p)
	t2, _ := startTrial(t, r, 2, p)
	run1 := startLaneRun(t, r, t1.ID)

	flood := startAs(t, r, "agent-1", "request-flood", "ATTACK_SOCKET="+t1.APISocket, "ATTACK_TOKEN="+tokenOf(t, t1), "ATTACK_N=8", "ATTACK_MS=120000")
	flood.expect("flooding", 20*time.Second)
	for _, c := range []struct{ role, sock, token string }{
		{"lane-1", r.Cfg.RoleAPISocket("lane-1"), run1.token},
		{"agent-2", t2.APISocket, tokenOf(t, t2)},
	} {
		calls := startAs(t, r, c.role, "calls", "ATTACK_SOCKET="+c.sock, "ATTACK_TOKEN="+c.token, "ATTACK_N=10")
		if l := calls.expect("calls ", time.Minute); field(t, l, "ok") != 10 {
			t.Errorf("%s's calls while lane 1's agent floods its own socket with requests: %s, want all 10 answered 200", c.role, l)
		}
	}
	probe := flood.expect("probe ", 2*time.Minute)
	flood.stdin.Close()
	line := flood.expect("request-flood ", 30*time.Second)
	t.Logf("agent-1: %s; %s", line, probe)
	if strings.Contains(line, "refused 0 ") {
		t.Fatalf("agent-1 flooding past its request rate was never answered 429: %s", line)
	}
	want := "agent-1 made more requests than its api.request_rate of 20 a second (api.request_burst 20 at once)"
	if !strings.Contains(line, want) || strings.Contains(line, `retry-after ""`) {
		t.Errorf("agent-1's 429: %s, want a Retry-After and the detail %q", line, want)
	}
	took := field(t, line, "ms")
	if ok, most := field(t, line, "ok"), burst+rate*(took+999)/1000+1; ok > most {
		t.Errorf("agent-1's requests answered 200 in %d ms: %d, over the %d api.request_rate %d and api.request_burst %d allow", took, ok, most, rate, burst)
	}
	if field(t, probe, "probe") != 429 {
		t.Errorf("agent-1's file write whose body never came, past its rate: %s, want 429 before the body is read", probe)
	}
	if n, list := openTrials(t, r); n != 2 {
		t.Fatalf("a trial ended under agent-1's flood:\n%s", list)
	}
}
