package rig

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The flood's two sides, run as role users by startAs: "flood" is a
// hostile lane using every path to the controller at once, "ordinary" the
// lane beside it making the calls an agent makes.

// apiClient is an HTTP client on one unix socket.
func apiClient(sock string, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{MaxIdleConnsPerHost: 8, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
}

// post sends one authorized request and reads its whole answer; it
// returns the status, or the error.
func post(client *http.Client, token, route, body string) (int, []byte, error) {
	req, _ := http.NewRequest("POST", "http://api"+route, strings.NewReader(body))
	if route == "/v1/trial" {
		req, _ = http.NewRequest("GET", "http://api"+route, nil)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// flood uses every path a lane has to the controller at once until stdin
// closes or limit passes: connect-and-close loops, idle connections, large
// bodies withheld their last byte, slow readers (an exec whose output it
// never reads), exec storms, disk writes (files through the API and dd in
// an exec), a storm of recorded steps (ledger writes) and, for an agent
// given ATTACK_PROXY, CONNECT loops on its egress proxy. It says
// "flooding" once everything is open, and at its end how many requests of
// each kind it made.
func flood(sock, token string, limit time.Duration) {
	// ATTACK_PAUSE_MS: a pause after each request of each loop, so that a
	// machine of few cores is loaded, not only queued.
	pause := time.Duration(envInt("ATTACK_PAUSE_MS")) * time.Millisecond
	done := make(chan struct{})
	var waits []func()
	var counts sync.Map // kind -> *atomic.Int64
	count := func(kind string) {
		v, _ := counts.LoadOrStore(kind, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	loop := func(n int, f func()) {
		waits = append(waits, untilClosed(done, n, func() { f(); time.Sleep(pause) }))
	}
	var held []net.Conn
	held = append(held, idleConns(sock, 40)...)
	// One large body withheld its last byte: within the lane's own share
	// of the body budget, so that its other requests still go through.
	held = append(held, withheldBodies(sock, token, "/v1/fs/write", 1, 8<<20)...)
	// Slow readers: an exec of a megabyte of output, never read.
	for range 2 {
		c, err := net.DialTimeout("unix", sock, 2*time.Second)
		if err != nil {
			count("slow-dial-error")
			continue
		}
		body := `{"argv":["/usr/bin/head","-c","1048576","/dev/zero"]}`
		fmt.Fprintf(c, "POST /v1/exec HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", token, len(body), body)
		held = append(held, c)
	}
	client := apiClient(sock, 20*time.Second)
	do := func(kind, route, body string) func() {
		return func() {
			code, _, err := post(client, token, route, body)
			switch {
			case err != nil:
				count(kind + "-error")
				time.Sleep(10 * time.Millisecond)
			case code != 200:
				count(fmt.Sprintf("%s-%d", kind, code))
				time.Sleep(10 * time.Millisecond)
			default:
				count(kind)
			}
		}
	}
	loop(2, func() {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			count("connect")
		} else {
			count("connect-error")
		}
	})
	loop(2, do("exec", "/v1/exec", `{"argv":["/bin/true"]}`))
	loop(1, do("dd", "/v1/exec", `{"argv":["/bin/dd","if=/dev/zero","of=flood.bin","bs=1M","count=4","conv=fsync","status=none"]}`))
	big, _ := json.Marshal(map[string]any{"path": "flood.txt", "data": make([]byte, 256<<10)})
	loop(1, do("write", "/v1/fs/write", string(big)))
	loop(2, do("step", "/v1/steps", `{"kind":"thought","text":"flooding"}`))
	// ATTACK_PROXY: the agent's egress proxy too, CONNECT loops to a host
	// not listed and to one listed (ATTACK_UNLISTED, ATTACK_LISTED).
	if proxy := os.Getenv("ATTACK_PROXY"); proxy != "" {
		for _, target := range []string{os.Getenv("ATTACK_UNLISTED"), os.Getenv("ATTACK_LISTED")} {
			loop(2, func() { egressConnect(proxy, target, count) })
		}
	}
	say("flooding")
	stdin := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(stdin) }()
	select {
	case <-stdin:
	case <-time.After(limit):
	}
	close(done)
	for _, c := range held {
		c.Close()
	}
	for _, wait := range waits {
		wait()
	}
	var parts []string
	counts.Range(func(k, v any) bool {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v.(*atomic.Int64).Load()))
		return true
	})
	sort.Strings(parts)
	say("flood %s", strings.Join(parts, " "))
}

// ordinary makes n ordinary calls in turn, the mix an agent makes: the
// trial's details, a recorded step, an exec of /bin/true, and a file
// write of 4 KiB, until ATTACK_MS passes. It reports how many succeeded, the p50 and p99 in
// microseconds, and the last error.
func ordinary(sock, token string, n int) {
	// ATTACK_MS bounds the whole: the calls not made by then are missing
	// from the count (and are errors).
	deadline := time.Now().Add(time.Duration(max(envInt("ATTACK_MS"), 1000)) * time.Millisecond)
	client := apiClient(sock, 30*time.Second)
	file, _ := json.Marshal(map[string]any{"path": "ordinary.txt", "data": make([]byte, 4096)})
	calls := []struct{ route, body string }{
		{"/v1/trial", ""},
		{"/v1/steps", `{"kind":"thought","text":"still served"}`},
		{"/v1/exec", `{"argv":["/bin/true"]}`},
		{"/v1/fs/write", string(file)},
	}
	var lat []time.Duration
	byRoute := map[string][]time.Duration{}
	ok, failed := 0, 0
	lastErr := ""
	for i := range n {
		if time.Now().After(deadline) {
			failed += n - i
			lastErr = fmt.Sprintf("%d calls not made within ATTACK_MS", n-i)
			break
		}
		c := calls[i%len(calls)]
		t0 := time.Now()
		code, body, err := post(client, token, c.route, c.body)
		lat = append(lat, time.Since(t0))
		byRoute[c.route] = append(byRoute[c.route], time.Since(t0))
		switch {
		case err != nil:
			failed++
			lastErr = c.route + ": " + err.Error()
		case code != 200:
			failed++
			lastErr = fmt.Sprintf("%s: %d %s", c.route, code, strings.TrimSpace(string(body)))
		case c.route == "/v1/exec" && !execSucceeded(body):
			failed++
			lastErr = "/v1/exec: " + strings.TrimSpace(string(body))
		default:
			ok++
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
	var routes []string
	for _, c := range calls {
		l := byRoute[c.route]
		sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
		if len(l) > 0 {
			routes = append(routes, fmt.Sprintf("%s %d/%d", c.route, l[len(l)/2].Microseconds(), l[len(l)*99/100].Microseconds()))
		}
	}
	say("ordinary ok %d of %d errors %d p50 %d p99 %d last-error %q (p50/p99 µs: %s)", ok, n, failed, p50.Microseconds(), p99.Microseconds(), lastErr, strings.Join(routes, ", "))
}

// execSucceeded reports whether an exec's NDJSON answer ends in a frame
// that says the command exited 0.
func execSucceeded(body []byte) bool {
	var last struct {
		Done     bool `json:"done"`
		ExitCode *int `json:"exit_code"`
	}
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		json.Unmarshal(sc.Bytes(), &last)
	}
	return last.Done && last.ExitCode != nil && *last.ExitCode == 0
}

// egressConnect is one CONNECT to target on an agent's egress proxy
// (inside its network namespace), closed at once: a host the rig does not
// list is refused (each refusal an event of its trial), one it lists is a
// tunnel the controller dials and records. It counts the answer's status
// as "connect-STATUS".
func egressConnect(proxy, target string, count func(string)) {
	c, err := net.DialTimeout("tcp", proxy, 5*time.Second)
	if err != nil {
		count("connect-dial-error")
		time.Sleep(10 * time.Millisecond)
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	line, err := bufio.NewReader(c).ReadString('\n')
	if f := strings.Fields(line); err == nil && len(f) >= 2 {
		count("connect-" + f[1])
	} else {
		count("connect-error")
	}
}

// soakOrdinary is the lane beside the soak's flood: until stdin closes it
// makes, in turn, mark after mark, each a step ("soak-step-I"), a
// research note ("soak-note-I"), an exec that writes soak-exec-I.txt and
// a file write of soak-write-I.txt, each holding I. It says "marking",
// then "soak-ordinary marks N errors E p99 P failed kind:i,..." (failed:
// the first 200 calls not answered 200, "-" for none).
func soakOrdinary(sock, token string) {
	client := apiClient(sock, time.Minute)
	stop := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(stop) }()
	say("marking")
	var failed []string
	var lat []time.Duration
	errs, lastErr := 0, ""
	i := 0
	for ; ; i++ {
		select {
		case <-stop:
			sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
			var p99 time.Duration
			if len(lat) > 0 {
				p99 = lat[len(lat)*99/100]
			}
			if len(failed) == 0 {
				failed = []string{"-"}
			}
			say("soak-ordinary marks %d errors %d p99 %d failed %s last-error %q", i, errs, p99.Microseconds(), strings.Join(failed, ","), lastErr)
			return
		default:
		}
		write, _ := json.Marshal(map[string]any{"path": fmt.Sprint("soak-write-", i, ".txt"), "data": []byte(fmt.Sprint(i, "\n"))})
		exec, _ := json.Marshal(map[string]any{"argv": []string{"/bin/sh", "-c", fmt.Sprintf("echo %d > soak-exec-%d.txt", i, i)}})
		for _, c := range []struct{ kind, route, body string }{
			{"step", "/v1/steps", fmt.Sprintf(`{"kind":"thought","text":"soak-step-%d"}`, i)},
			{"note", "/v1/research/note", fmt.Sprintf(`{"title":"soak-note-%d","body":"%d"}`, i, i)},
			{"exec", "/v1/exec", string(exec)},
			{"write", "/v1/fs/write", string(write)},
		} {
			t0 := time.Now()
			code, body, err := post(client, token, c.route, c.body)
			lat = append(lat, time.Since(t0))
			if err != nil || code != 200 || (c.kind == "exec" && !execSucceeded(body)) {
				errs++
				if len(failed) < 200 {
					failed = append(failed, fmt.Sprint(c.kind, ":", i))
				}
				lastErr = fmt.Sprintf("%s: %d %v %.200s", c.route, code, err, body)
			}
		}
	}
}
