package rig

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"thermite/internal/testrig"
)

// Issue 27: a lane over one of its caps is told so, in one line naming
// the limit, and the lane beside it is not touched.

// TestLaneOverItsConnectionCapTold503: lane-1, holding all of its
// api.max_conns_per_peer (4) connections on its own socket, opens one
// more and writes a request on it: it reads a 503 whose problem names
// api.max_conns_per_peer and its value, not a bare EOF. Once one of its
// connections closes, its next call is answered 200; lane-2's calls are
// answered throughout.
func TestLaneOverItsConnectionCapTold503(t *testing.T) {
	r := testrig.New(t, testrig.Options{APIExtra: "max_conns_per_peer = 4\nheader_timeout = \"2m\"\n"})
	p := makeProject(t, r)
	t1, _ := startTrial(t, r, 1, p)
	t2, _ := startTrial(t, r, 2, p)
	// A lane's socket serves only a lane harness run's token.
	run1, run2 := startLaneRun(t, r, t1.ID), startLaneRun(t, r, t2.ID)
	over := startAs(t, r, "lane-1", "over-cap", "ATTACK_SOCKET="+r.Cfg.RoleAPISocket("lane-1"), "ATTACK_TOKEN="+run1.token, "ATTACK_N=4")
	line := over.expect("over-cap ", time.Minute)
	t.Logf("lane-1: %s", line)
	if field(t, line, "held") != 4 || field(t, line, "status") != 503 || !strings.Contains(line, "api.max_conns_per_peer of 4") {
		t.Fatalf("lane-1's connection over its cap of 4: %s, want a 503 naming api.max_conns_per_peer of 4", line)
	}
	lane2 := startAs(t, r, "lane-2", "calls", "ATTACK_SOCKET="+r.Cfg.RoleAPISocket("lane-2"), "ATTACK_TOKEN="+run2.token, "ATTACK_N=10", "ATTACK_FRESH=1")
	if l := lane2.expect("calls ", time.Minute); field(t, l, "ok") != 10 {
		t.Errorf("lane-2's calls while lane-1 is at its cap: %s, want all 10 answered", l)
	}
	over.send("release")
	if l := over.expect("after ", time.Minute); field(t, l, "status") != 200 {
		t.Fatalf("lane-1's call after one of its connections closed: %s, want 200", l)
	}
}

// overCap holds n connections (each with a request's first line sent, so
// that none is idle), opens one more, writes a whole request on it and
// reads the answer: "over-cap held N status S detail ...". On a line on
// stdin it closes one of the n and calls on a new connection until the
// answer is not the cap's 503: "after status S tries T".
func overCap(sock, token string, n int) {
	var held []net.Conn
	for range n {
		c, err := net.DialTimeout("unix", sock, 5*time.Second)
		if err != nil {
			break
		}
		io.WriteString(c, "GET /v1/trial HTTP/1.1\r\n")
		held = append(held, c)
	}
	// The listener accepts in order: this one comes after the n held.
	status, detail := 0, ""
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		detail = err.Error()
	} else {
		fmt.Fprintf(c, "GET /v1/trial HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer %s\r\n\r\n", token)
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil {
			detail = "no answer: " + err.Error()
		} else {
			var p struct{ Detail string }
			body, _ := io.ReadAll(resp.Body)
			json.Unmarshal(body, &p)
			status, detail = resp.StatusCode, p.Detail
		}
		c.Close()
	}
	say("over-cap held %d status %d detail %s", len(held), status, detail)
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() {
		return
	}
	held[0].Close()
	// The controller gives the place back once it reads the close: until
	// then the call is still over the cap, and is asked again.
	client := apiClient(sock, 30*time.Second)
	for try := 1; ; try++ {
		code, _, err := post(client, token, "/v1/trial", "")
		if (err == nil && code != http.StatusServiceUnavailable) || try == 100 {
			say("after status %d tries %d error %v", code, try, err)
			return
		}
		client.CloseIdleConnections()
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLaneOverItsRunCapRefused: lane-1's agent, running its
// api.max_runs_per_lane (2) of commands at once through the API (each a
// sleep), is refused a third with a 429 whose problem names the limit and
// its value; lane 2's agent's calls, an exec among them, are answered
// meanwhile; once lane-1's commands end, its next exec runs.
func TestLaneOverItsRunCapRefused(t *testing.T) {
	r := testrig.New(t, testrig.Options{APIExtra: "max_runs_per_lane = 2\n"})
	p := makeProject(t, r)
	t1, _ := startTrial(t, r, 1, p)
	t2, _ := startTrial(t, r, 2, p)
	over := startAs(t, r, "agent-1", "over-runs", "ATTACK_SOCKET="+t1.APISocket, "ATTACK_TOKEN="+tokenOf(t, t1), "ATTACK_N=2")
	line := over.expect("over-runs ", 2*time.Minute)
	t.Logf("agent-1: %s", line)
	if field(t, line, "running") != 2 || field(t, line, "status") != 429 || !strings.Contains(line, "api.max_runs_per_lane of 2") {
		t.Fatalf("lane-1's third command at once with a cap of 2: %s, want a 429 naming api.max_runs_per_lane of 2", line)
	}
	if l := ordinaryCalls(t, r, t2, 8, time.Minute); field(t, l, "errors") != 0 {
		t.Errorf("lane 2's calls while lane 1 is at its cap: %s", l)
	}
	over.send("release")
	if l := over.expect("after ", 2*time.Minute); field(t, l, "status") != 200 {
		t.Fatalf("lane-1's exec after its commands ended: %s, want 200", l)
	}
}

// overRuns starts n execs of a long sleep (their answers left streaming),
// then one more exec: "over-runs running N status S detail ...". On a line
// on stdin it ends the n (closing their connections cancels them) and
// execs until the answer is not the cap's 429: "after status S tries T".
func overRuns(sock, token string, n int) {
	var held []net.Conn
	// Its first frame flushes the answer's head: the command runs.
	body := `{"argv":["/bin/sh","-c","echo started; exec sleep 120"]}`
	for range n {
		c, err := net.DialTimeout("unix", sock, 5*time.Second)
		if err != nil {
			break
		}
		fmt.Fprintf(c, "POST /v1/exec HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", token, len(body), body)
		// Its 200 says the command runs, and is counted (the cap is
		// taken before the answer's head is written).
		c.SetReadDeadline(time.Now().Add(time.Minute))
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 200 {
			say("over-runs running %d status 0 detail the held exec was not started: %v", len(held), err)
			return
		}
		held = append(held, c)
	}
	client := apiClient(sock, time.Minute)
	code, answer, err := post(client, token, "/v1/exec", `{"argv":["/bin/true"]}`)
	var p struct{ Detail string }
	json.Unmarshal(answer, &p)
	if err != nil {
		p.Detail = err.Error()
	}
	say("over-runs running %d status %d detail %s", len(held), code, p.Detail)
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() {
		return
	}
	for _, c := range held {
		c.Close()
	}
	for try := 1; ; try++ {
		code, _, err := post(client, token, "/v1/exec", `{"argv":["/bin/true"]}`)
		if (err == nil && code != http.StatusTooManyRequests) || try == 200 {
			say("after status %d tries %d error %v", code, try, err)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// execStorm runs /bin/true through the API's exec in a loop on n
// goroutines until stdin closes: "exec-storm ok N refused R errors E".
func execStorm(sock, token string, n int) {
	client := apiClient(sock, time.Minute)
	var mu sync.Mutex
	counts := map[string]int{}
	done := make(chan struct{})
	wait := untilClosed(done, n, func() {
		code, body, err := post(client, token, "/v1/exec", `{"argv":["/bin/true"]}`)
		kind := "ok"
		switch {
		case err != nil:
			kind = "errors"
		case code == http.StatusTooManyRequests:
			kind = "refused"
		case code != 200 || !execSucceeded(body):
			kind = "errors"
		}
		mu.Lock()
		counts[kind]++
		mu.Unlock()
	})
	say("storming")
	io.Copy(io.Discard, os.Stdin)
	close(done)
	wait()
	say("exec-storm ok %d refused %d errors %d", counts["ok"], counts["refused"], counts["errors"])
}
