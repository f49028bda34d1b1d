package standin

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
)

// What the three protocols' tests share: a client that trusts the
// stand-in's CA, and a reader of a streamed answer's events.

// client trusts the stand-in's CA, as a program given its CA file does.
func client(t *testing.T, p *Provider) *http.Client {
	t.Helper()
	pem, err := os.ReadFile(p.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("no certificate in %s", p.CAFile)
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}

// sseEvent is one server-sent event: its name and its data as JSON.
type sseEvent struct {
	name string
	data map[string]any
}

// readEvents reads a text/event-stream answer to its end.
func readEvents(t *testing.T, res *http.Response) []sseEvent {
	t.Helper()
	if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q, want text/event-stream", ct)
	}
	var out []sseEvent
	var name string
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var d map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &d); err != nil {
				t.Fatalf("event %s: data is not JSON: %v", name, err)
			}
			if d["type"] != name {
				t.Errorf("event %q carries type %q", name, d["type"])
			}
			out = append(out, sseEvent{name, d})
		}
	}
	return out
}

// names are the events' names in order.
func names(evs []sseEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.name)
	}
	return out
}
