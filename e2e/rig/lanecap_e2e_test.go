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
	over := startAs(t, r, "lane-1", "over-cap", "ATTACK_SOCKET="+r.Cfg.RoleAPISocket("lane-1"), "ATTACK_TOKEN="+tokenOf(t, t1), "ATTACK_N=4")
	line := over.expect("over-cap ", time.Minute)
	t.Logf("lane-1: %s", line)
	if field(t, line, "held") != 4 || field(t, line, "status") != 503 || !strings.Contains(line, "api.max_conns_per_peer of 4") {
		t.Fatalf("lane-1's connection over its cap of 4: %s, want a 503 naming api.max_conns_per_peer of 4", line)
	}
	lane2 := startAs(t, r, "lane-2", "calls", "ATTACK_SOCKET="+r.Cfg.RoleAPISocket("lane-2"), "ATTACK_TOKEN="+tokenOf(t, t2), "ATTACK_N=10", "ATTACK_FRESH=1")
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
