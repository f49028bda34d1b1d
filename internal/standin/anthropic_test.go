package standin

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// post sends body to path and returns the answer.
func post(t *testing.T, p *Provider, path, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", p.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-api-key", "x")
	req.Header.Set("anthropic-version", "2023-06-01")
	res, err := client(t, p).Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	t.Cleanup(func() { res.Body.Close() })
	return res
}

const anthropicFirstRequest = `{"model":"claude-sonnet-4-5","max_tokens":100,"stream":true,
	"tools":[{"name":"Bash","input_schema":{"type":"object"}},{"name":"Write","input_schema":{"type":"object"}}],
	"messages":[{"role":"user","content":[{"type":"text","text":"<system-reminder>x</system-reminder>"},{"type":"text","text":"list the files"}]}]}`

// A streamed tool call arrives as Claude Code's SDK reads one: the message
// starts, a tool_use block starts empty, its input comes as JSON in
// pieces, and the message stops for tool_use.
func TestAnthropicStreamsAToolCall(t *testing.T) {
	p := Start(t, t.TempDir(), Steps("done", Step{Tool: &Call{Name: "Bash", Input: map[string]any{"command": "id -un; pwd"}}}))
	res := post(t, p, "/v1/messages", anthropicFirstRequest)
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	evs := readEvents(t, res)
	want := []string{"message_start", "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop", "message_delta", "message_stop"}
	if got := names(evs); !reflect.DeepEqual(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	block := evs[1].data["content_block"].(map[string]any)
	if block["type"] != "tool_use" || block["name"] != "Bash" || !strings.HasPrefix(block["id"].(string), "toolu_") {
		t.Errorf("content_block_start %v, want a tool_use of Bash with a toolu_ id", block)
	}
	var input strings.Builder
	for _, e := range evs[2:4] {
		d := e.data["delta"].(map[string]any)
		if d["type"] != "input_json_delta" {
			t.Errorf("delta %v, want input_json_delta", d)
		}
		input.WriteString(d["partial_json"].(string))
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(input.String()), &got); err != nil || got["command"] != "id -un; pwd" {
		t.Errorf("tool input %q (%v), want {\"command\":\"id -un; pwd\"}", input.String(), err)
	}
	if sr := evs[5].data["delta"].(map[string]any)["stop_reason"]; sr != "tool_use" {
		t.Errorf("stop_reason %v, want tool_use", sr)
	}
	turns := p.Turns()
	if len(turns) != 1 {
		t.Fatalf("%d turns recorded, want 1", len(turns))
	}
	tu := turns[0]
	if tu.API != AnthropicMessages || tu.Model != "claude-sonnet-4-5" || !tu.Stream || !reflect.DeepEqual(tu.Tools, []string{"Bash", "Write"}) {
		t.Errorf("turn %+v", tu)
	}
	if !strings.Contains(tu.Prompt, "list the files") {
		t.Errorf("prompt %q, want the user's text", tu.Prompt)
	}
}

// The tool results of a conversation are parsed with the tool each
// answers (named by the earlier tool_use), their text (a ToolSearch's
// tool_reference as the tool's name) and is_error; the
// script's final step is one text block that ends the turn.
func TestAnthropicParsesResultsAndEndsTheTurn(t *testing.T) {
	p := Start(t, t.TempDir(), Steps("all done", Step{Tool: &Call{Name: "Bash"}}, Step{Tool: &Call{Name: "ToolSearch"}}, Step{Tool: &Call{Name: "Read"}}))
	body := `{"model":"m","max_tokens":100,"tools":[{"name":"Bash"},{"name":"Read"}],"messages":[
		{"role":"user","content":"go"},
		{"role":"assistant","content":[{"type":"text","text":"ok"},{"type":"tool_use","id":"toolu_1","name":"Bash","input":{}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"lane-1\n/work"}]},
		{"role":"assistant","content":[{"type":"tool_use","id":"toolu_3","name":"ToolSearch","input":{}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_3","content":[{"type":"tool_reference","tool_name":"mcp__x__y"}]}]},
		{"role":"assistant","content":[{"type":"tool_use","id":"toolu_2","name":"Read","input":{}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_2","is_error":true,"content":[{"type":"text","text":"EACCES: permission denied"}]},{"type":"text","text":"and then?"}]}]}`
	res := post(t, p, "/v1/messages", body)
	if ct := res.Header.Get("Content-Type"); res.StatusCode != 200 || ct != "application/json" {
		t.Fatalf("status %d, Content-Type %q", res.StatusCode, ct)
	}
	var msg struct {
		Type       string `json:"type"`
		Role       string `json:"role"`
		StopReason string `json:"stop_reason"`
		Content    []struct{ Type, Text string }
	}
	if err := json.NewDecoder(res.Body).Decode(&msg); err != nil {
		t.Fatal(err)
	}
	if msg.Type != "message" || msg.Role != "assistant" || msg.StopReason != "end_turn" || len(msg.Content) != 1 || msg.Content[0].Text != "all done" {
		t.Errorf("answer %+v, want one text block \"all done\" that ends the turn", msg)
	}
	want := []Result{{CallID: "toolu_1", Name: "Bash", Output: "lane-1\n/work", Reported: true}, {CallID: "toolu_3", Name: "ToolSearch", Output: "mcp__x__y", Reported: true}, {CallID: "toolu_2", Name: "Read", Output: "EACCES: permission denied", IsError: true, Reported: true}}
	if got := p.Results(); !reflect.DeepEqual(got, want) {
		t.Errorf("results %+v, want %+v", got, want)
	}
	if tu := p.Turns()[0]; tu.Stream || tu.Prompt != "and then?" {
		t.Errorf("turn stream %v prompt %q, want false and the last user text", tu.Stream, tu.Prompt)
	}
}

// A streamed final message is one text block ending in end_turn; a
// request without tools (a title) gets the final message at once.
func TestAnthropicStreamsAFinalMessage(t *testing.T) {
	p := Start(t, t.TempDir(), Steps("the answer", Step{Tool: &Call{Name: "Bash"}}))
	res := post(t, p, "/v1/messages", `{"model":"m","stream":true,"messages":[{"role":"user","content":"title this"}]}`)
	evs := readEvents(t, res)
	want := []string{"message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"}
	if got := names(evs); !reflect.DeepEqual(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if d := evs[2].data["delta"].(map[string]any); d["type"] != "text_delta" || d["text"] != "the answer" {
		t.Errorf("delta %v, want text_delta \"the answer\"", d)
	}
	if sr := evs[4].data["delta"].(map[string]any)["stop_reason"]; sr != "end_turn" {
		t.Errorf("stop_reason %v, want end_turn", sr)
	}
}

// count_tokens answers a count and is not a turn; an unknown path is the
// stand-in's 404.
func TestAnthropicCountsTokensAndRefusesOtherPaths(t *testing.T) {
	p := Start(t, t.TempDir(), Steps("x"))
	res := post(t, p, "/v1/messages/count_tokens", `{"model":"m","messages":[{"role":"user","content":"hello"}]}`)
	var n struct {
		InputTokens int `json:"input_tokens"`
	}
	if err := json.NewDecoder(res.Body).Decode(&n); err != nil || res.StatusCode != 200 || n.InputTokens <= 0 {
		t.Errorf("count_tokens: status %d, %+v, %v", res.StatusCode, n, err)
	}
	if res := post(t, p, "/v1/other", `{}`); res.StatusCode != 404 {
		t.Errorf("/v1/other: status %d, want 404", res.StatusCode)
	}
	if len(p.Turns()) != 0 {
		t.Errorf("turns %v, want none", p.Turns())
	}
	if got, want := p.Paths(), []string{"POST /v1/messages/count_tokens", "POST /v1/other"}; !reflect.DeepEqual(got, want) {
		t.Errorf("paths %v, want %v", got, want)
	}
}
