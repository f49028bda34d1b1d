package rig

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// requestFlood is a lane asking as fast as it can on its own socket: n
// goroutines make GET /v1/trial with the token over and over (a new
// connection whenever the controller closes one), until stdin closes or
// limit passes. Meanwhile it sends, until one is answered 429, a file
// write's headers with a 1 MiB Content-Length and no body: an answer at
// all proves it came before the body was read. It says "flooding", then
// "probe STATUS tries N" once the probe is answered, and at its end
// "request-flood ok N refused M other K ms T retry-after R detail D": the
// 200s, the 429s, the rest, how long it flooded, and the first 429's
// Retry-After and problem detail.
func requestFlood(sock, token string, n int, limit time.Duration) {
	var ok, refused, other atomic.Int64
	var first sync.Once
	retry, detail := "", ""
	done := make(chan struct{})
	t0 := time.Now()
	// One client: its connections are kept per goroutine at most
	// (MaxIdleConnsPerHost 8), and a 429 closes the one it came on.
	client := apiClient(sock, 10*time.Second)
	wait := untilClosed(done, n, func() {
		req, _ := http.NewRequest("GET", "http://api/v1/trial", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			other.Add(1)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			ok.Add(1)
		case http.StatusTooManyRequests:
			refused.Add(1)
			first.Do(func() {
				var p struct{ Detail string }
				json.Unmarshal(body, &p)
				retry, detail = resp.Header.Get("Retry-After"), p.Detail
			})
		default:
			other.Add(1)
		}
	})
	say("flooding")
	go func() {
		status, tries := withheldProbe(sock, token)
		say("probe %d tries %d", status, tries)
	}()
	stdin := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(stdin) }()
	select {
	case <-stdin:
	case <-time.After(limit):
	}
	close(done)
	ms := time.Since(t0).Milliseconds()
	wait()
	first.Do(func() {})
	say("request-flood ok %d refused %d other %d ms %d retry-after %q detail %s", ok.Load(), refused.Load(), other.Load(), ms, retry, detail)
}

// withheldProbe sends a file write's headers with a 1 MiB body that never
// comes, and reads the answer: a request that was admitted waits for its
// body (the read gives up after 5 s, well inside body_timeout, and the
// probe tries again, up to 5 times), one refused by the rate is answered
// at once. It returns the status of the first answer (0: none) and the
// tries.
func withheldProbe(sock, token string) (status, tries int) {
	for tries = 1; tries <= 5; tries++ {
		c, err := net.DialTimeout("unix", sock, 10*time.Second)
		if err != nil {
			continue
		}
		fmt.Fprintf(c, "POST /v1/fs/write HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", token, 1<<20)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		c.Close()
		if err == nil {
			status = resp.StatusCode
			if status == http.StatusTooManyRequests {
				return status, tries
			}
		}
	}
	return status, tries - 1
}
