package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"thermite/controller/ledger"
)

// Each kind of event reads as one line with its key facts; what an agent
// chose (the host it asked for) is escaped, never written raw to the
// operator's terminal.
func TestEventLineSaysEachKindsFacts(t *testing.T) {
	at := time.Date(2026, 12, 4, 20, 31, 2, 123e6, time.UTC)
	for _, c := range []struct{ kind, data, want string }{
		{"trial.start", `{"lane":1,"files":3,"bytes":42,"reflinked":0}`, "trial.start        lane 1: 3 files, 42 bytes copied"},
		{"egress.refused", `{"target":"203.0.113.9:443","via":"lane-1","why":"not in agent.egress"}`, "egress.refused     tunnel to 203.0.113.9:443 via lane-1 refused: not in agent.egress"},
		{"egress.refused", `{"target":"127.0.0.1:9","via":"agent-1","why":"connection refused"}`, "tunnel to 127.0.0.1:9 via agent-1 refused: connection refused"},
		{"egress.open", `{"target":"127.0.0.1:4443","via":"lane-1","address":"127.0.0.1:4443"}`, "tunnel to 127.0.0.1:4443 via lane-1 opened (127.0.0.1:4443)"},
		{"egress", `{"target":"127.0.0.1:4443","via":"lane-1","bytes_sent":517,"bytes_received":4096,"ms":35}`, "tunnel to 127.0.0.1:4443 via lane-1 closed: 517 bytes sent, 4096 received, 35 ms"},
		{"api", `{"route":"POST /v1/fs/read","id":"fs_read","status":200,"ms":3}`, "api                POST /v1/fs/read (fs_read): 200 in 3 ms"},
		{"api", `{"route":"POST /v1/fetch","id":"fetch","tool":"research_fetch","status":403,"ms":1}`, "api                MCP tool research_fetch: POST /v1/fetch (fetch): 403 in 1 ms"},
		{"trial.exec", `{"argv0":"sh","role":"lane-1","exit_code":0,"stopped":"exited","wall_ms":12}`, "trial.exec         sh as lane-1: exit 0 after 12 ms"},
		{"trial.exec", `{"argv0":"sleep","role":"lane-1","exit_code":-1,"stopped":"timeout","wall_ms":5000}`, "sleep as lane-1: exit -1 (timeout) after 5000 ms"},
		{"trial.agent.start", `{"argv0":"claude","role":"lane-1","harness":"lane"}`, "claude as lane-1 (harness lane)"},
		{"trial.agent", `{"argv0":"pi","role":"agent-1","harness":"pi","exit_code":3,"stopped":"exited","wall_ms":1500}`, "pi as agent-1 (harness pi) ended: exit 3 after 1500 ms"},
		{"trial.end", `{"reason":"ended","processes_stopped":2,"disk_bytes":8192,"events_unrecorded":0}`, "trial.end          ended; 2 processes stopped, its folders held 8192 bytes"},
		{"trial.end", `{"reason":"ended","processes_stopped":0,"disk_bytes":1,"events_unrecorded":7}`, "; 7 API calls and tunnels not recorded"},
		{"trial.end", `{"reason":"its workspace is gone: the rig restarted"}`, "trial.end          its workspace is gone: the rig restarted"},
		{"step", `{"kind":"plan","text":"read\nthe code"}`, `plan: read\nthe code`},
		{"egress.refused", `{"target":"evil\u001b[2J:443","via":"lane-1","why":"not in agent.egress"}`, `tunnel to evil\x1b[2J:443`},
		{"trial.disk", `{"bytes":5,"cap_bytes":1}`, "trial.disk         bytes=5 cap_bytes=1"},
	} {
		got := eventLine(ledger.Event{At: at, Kind: c.kind, Trial: "t1", Data: json.RawMessage(c.data)})
		if !strings.HasPrefix(got, "2026-12-04 20:31:02.123  ") || !strings.Contains(got, c.want) || strings.ContainsAny(got, "\n\x1b") {
			t.Errorf("%s %s:\n got %q\nwant it to hold %q", c.kind, c.data, got, c.want)
		}
	}
}

// --json writes each event as the ledger holds it, one object a line;
// without it one line each; a stream that is not JSON is an error.
func TestPrintEventsOneLineEach(t *testing.T) {
	stream := `{"seq":4,"at":"2026-12-04T20:31:02Z","kind":"trial.start","trial":"t1","data":{"lane":1,"files":1,"bytes":2}}
{"seq":9,"at":"2026-12-04T20:31:03Z","kind":"egress.refused","trial":"t1","data":{"target":"x:443","via":"lane-1","why":"not in agent.egress"}}
`
	var human, js bytes.Buffer
	if err := printEvents(&human, strings.NewReader(stream), false); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(human.String()), "\n"); len(lines) != 2 || !strings.Contains(lines[1], "tunnel to x:443 via lane-1 refused: not in agent.egress") {
		t.Errorf("human output:\n%s", human.String())
	}
	if err := printEvents(&js, strings.NewReader(stream), true); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(js.String()), "\n")
	var e ledger.Event
	if len(lines) != 2 || json.Unmarshal([]byte(lines[1]), &e) != nil || e.Seq != 9 || e.Kind != "egress.refused" || !strings.Contains(string(e.Data), `"why":"not in agent.egress"`) {
		t.Errorf("--json output:\n%s", js.String())
	}
	if err := printEvents(&js, strings.NewReader("not json\n"), true); err == nil || !strings.Contains(err.Error(), "not JSON") {
		t.Errorf("a broken stream: %v", err)
	}
}
