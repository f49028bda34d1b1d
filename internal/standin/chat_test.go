package standin

import (
	"bufio"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// chatPost sends body to path as a program does, trusting the stand-in's
// CA, and returns the answer.
func chatPost(t *testing.T, p *Provider, method, path, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(method, p.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer x")
	res, err := client(t, p).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	t.Cleanup(func() { res.Body.Close() })
	return res
}

// chatChunks reads a streamed answer: each data line's JSON, and whether
// it ended in "data: [DONE]" (and nothing after it).
func chatChunks(t *testing.T, res *http.Response) (chunks []map[string]any, done bool) {
	t.Helper()
	if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q, want text/event-stream", ct)
	}
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "event:") {
			t.Errorf("chat completions name no events; got %q", line)
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if done {
			t.Errorf("data after [DONE]: %q", data)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var c map[string]any
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("chunk is not JSON: %v: %q", err, data)
		}
		chunks = append(chunks, c)
	}
	return chunks, done
}

// chatRequestBody is a conversation as OpenCode sends it: a system prompt,
// the user's prompt as parts, one tool call and its result, tools offered.
const chatRequestBody = `{"model":"standin-model","stream":%s,"stream_options":{"include_usage":true},
 "tools":[{"type":"function","function":{"name":"bash","parameters":{}}},{"type":"function","function":{"name":"thermite_research_note","parameters":{}}}],
 "messages":[
  {"role":"system","content":"You are OpenCode."},
  {"role":"user","content":[{"type":"text","text":"run id"}]},
  {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"bash","arguments":"{\"command\":\"id -un\"}"}}]},
  {"role":"tool","tool_call_id":"call_1","content":"lane-1\n"}]}`

func TestChatTurnReadsTheConversation(t *testing.T) {
	var req chatRequest
	if err := json.Unmarshal([]byte(strings.Replace(chatRequestBody, "%s", "true", 1)), &req); err != nil {
		t.Fatal(err)
	}
	got := chatTurn("/v1/chat/completions", req)
	want := Turn{API: OpenAIChat, Path: "/v1/chat/completions", Model: "standin-model", Stream: true,
		Tools:   []string{"bash", "thermite_research_note"},
		Results: []Result{{CallID: "call_1", Name: "bash", Output: "lane-1\n"}},
		Prompt:  "run id"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("turn:\n got %+v\nwant %+v", got, want)
	}
}

func TestChatStreamsAToolCallInPieces(t *testing.T) {
	call := &Call{Name: "thermite_research_note", Input: map[string]any{"title": "t", "body": "b"}}
	p := Start(t, t.TempDir(), Steps("done", Step{Tool: call}, Step{Tool: call}))
	res := chatPost(t, p, "POST", "/v1/chat/completions", strings.Replace(chatRequestBody, "%s", "true", 1))
	chunks, done := chatChunks(t, res)
	if !done {
		t.Error("the stream did not end in data: [DONE]")
	}
	// The calls' arguments, joined from their deltas by index, as the AI
	// SDK does; the one chunk with a finish reason; the usage chunk.
	var id, name, args, finish string
	var usage map[string]any
	for _, c := range chunks {
		if c["object"] != "chat.completion.chunk" || c["model"] != "standin-model" {
			t.Errorf("chunk %v: object or model wrong", c)
		}
		if u, ok := c["usage"].(map[string]any); ok {
			usage = u
		}
		for _, ch := range c["choices"].([]any) {
			choice := ch.(map[string]any)
			if f, ok := choice["finish_reason"].(string); ok {
				if finish != "" {
					t.Errorf("a second finish reason %q", f)
				}
				finish = f
			}
			delta := choice["delta"].(map[string]any)
			calls, _ := delta["tool_calls"].([]any)
			for _, tc := range calls {
				tc := tc.(map[string]any)
				if tc["index"].(float64) != 0 {
					t.Errorf("tool call index %v, want 0", tc["index"])
				}
				if s, ok := tc["id"].(string); ok {
					id = s
				}
				f := tc["function"].(map[string]any)
				if s, ok := f["name"].(string); ok {
					name += s
				}
				args += f["arguments"].(string)
			}
		}
	}
	if finish != "tool_calls" || name != call.Name || !strings.HasPrefix(id, "call_") {
		t.Errorf("finish %q, call %q %q; want tool_calls, %s, call_…", finish, id, name, call.Name)
	}
	var input map[string]any
	if err := json.Unmarshal([]byte(args), &input); err != nil || !reflect.DeepEqual(input, call.Input) {
		t.Errorf("arguments %q (%v), want %v", args, err, call.Input)
	}
	if usage == nil {
		t.Error("stream_options.include_usage asked, no usage chunk")
	}
	if turns := p.Turns(); len(turns) != 1 || len(turns[0].Results) != 1 || turns[0].Results[0].Output != "lane-1\n" {
		t.Errorf("recorded turns %+v, want one with the bash result", turns)
	}
}

func TestChatStreamsTheFinalText(t *testing.T) {
	p := Start(t, t.TempDir(), Steps("all done"))
	res := chatPost(t, p, "POST", "/v1/chat/completions", strings.Replace(chatRequestBody, "%s", "true", 1))
	chunks, done := chatChunks(t, res)
	var text, finish string
	for _, c := range chunks {
		for _, ch := range c["choices"].([]any) {
			choice := ch.(map[string]any)
			if f, ok := choice["finish_reason"].(string); ok {
				finish = f
			}
			delta := choice["delta"].(map[string]any)
			if delta["tool_calls"] != nil {
				t.Errorf("a final answer with tool calls: %v", delta)
			}
			s, _ := delta["content"].(string)
			text += s
		}
	}
	if !done || text != "all done" || finish != "stop" {
		t.Errorf("text %q, finish %q, done %v; want %q, stop, true", text, finish, done, "all done")
	}
}

func TestChatAnswersUnstreamed(t *testing.T) {
	call := &Call{Name: "bash", Input: map[string]any{"command": "pwd"}}
	p := Start(t, t.TempDir(), func(Turn) Step { return Step{Tool: call} })
	res := chatPost(t, p, "POST", "/v1/chat/completions", strings.Replace(chatRequestBody, "%s", "false", 1))
	var got struct {
		Object  string `json:"object"`
		Choices []struct {
			FinishReason string      `json:"finish_reason"`
			Message      chatMessage `json:"message"`
		} `json:"choices"`
		Usage map[string]int `json:"usage"`
	}
	if err := json.NewDecoder(res.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if got.Object != "chat.completion" || len(got.Choices) != 1 || got.Usage["total_tokens"] == 0 {
		t.Fatalf("completion %+v", got)
	}
	c := got.Choices[0]
	if c.FinishReason != "tool_calls" || string(c.Message.Content) != "null" || len(c.Message.ToolCalls) != 1 {
		t.Fatalf("choice %+v (content %s), want one tool call and null content", c, c.Message.Content)
	}
	tc := c.Message.ToolCalls[0]
	if tc.Type != "function" || tc.Function.Name != "bash" || tc.Function.Arguments != `{"command":"pwd"}` {
		t.Errorf("tool call %+v", tc)
	}
	if p.Turns()[0].Stream {
		t.Error("turn recorded as streamed")
	}
}

func TestChatRefusesABodyItCannotRead(t *testing.T) {
	p := Start(t, t.TempDir(), Steps("x"))
	res := chatPost(t, p, "POST", "/v1/chat/completions", "{not json")
	var e struct {
		Error struct{ Type, Message string } `json:"error"`
	}
	json.NewDecoder(res.Body).Decode(&e)
	if res.StatusCode != http.StatusBadRequest || e.Error.Type != "invalid_request_error" {
		t.Errorf("status %d, error %+v; want 400 invalid_request_error", res.StatusCode, e.Error)
	}
	if len(p.Turns()) != 0 {
		t.Error("a body it could not read was answered as a turn")
	}
}
