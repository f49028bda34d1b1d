package standin

import (
	"reflect"
	"strings"
	"testing"
)

// postResponses sends body to /v1/responses and reads the streamed
// answer's events.
func postResponses(t *testing.T, p *Provider, body string) []sseEvent {
	t.Helper()
	res, err := client(t, p).Post(p.URL+"/v1/responses", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("POST /v1/responses: %s", res.Status)
	}
	return readEvents(t, res)
}

// codexRequest is a request as Codex 0.171.0 sends one (trimmed): its
// tools (a function, a namespace of an MCP server's, a hosted tool), the
// conversation with the environment as a user message before the
// prompt, and one tool call with its output.
const codexRequest = `{"model":"standin-model","stream":true,"store":false,
 "tools":[{"type":"function","name":"exec_command","parameters":{}},
  {"type":"namespace","name":"mcp__thermite","tools":[{"type":"function","name":"research_note"},{"type":"function","name":"fs_read"}]},
  {"type":"namespace","name":"multi_agent_v1","tools":[{"type":"function","name":"spawn_agent"}]},
  {"type":"custom","name":"apply_patch"},
  {"type":"web_search","external_web_access":true}],
 "input":[{"type":"message","role":"developer","content":[{"type":"input_text","text":"You are Codex"}]},
  {"type":"message","role":"user","content":[{"type":"input_text","text":"<environment_context>...</environment_context>"}]},
  {"type":"message","role":"user","content":[{"type":"input_text","text":"do the thing"}]},
  {"type":"function_call","call_id":"c1","name":"exec_command","arguments":"{\"cmd\":\"false\"}"},
  {"type":"function_call_output","call_id":"c1","output":"Chunk ID: x\nProcess exited with code 1\nOutput:\n"},
  {"type":"function_call","call_id":"c2","namespace":"mcp__thermite","name":"research_note","arguments":"{}"},
  {"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"{\"path\":\"notes/a.md\"}"}]}%s]}`

func TestResponsesTurnIsWhatCodexSent(t *testing.T) {
	var got Turn
	p := Start(t, t.TempDir(), func(turn Turn) Step { got = turn; return Step{Text: "done"} })
	postResponses(t, p, strings.Replace(codexRequest, "%s", "", 1))
	want := Turn{API: OpenAIResponses, Path: "/v1/responses", Model: "standin-model", Stream: true, Prompt: "do the thing",
		Tools: []string{"exec_command", "mcp__thermite__research_note", "mcp__thermite__fs_read", "multi_agent_v1.spawn_agent", "apply_patch"},
		Results: []Result{
			{CallID: "c1", Name: "exec_command", Output: "Chunk ID: x\nProcess exited with code 1\nOutput:\n", IsError: true, Reported: true},
			{CallID: "c2", Name: "mcp__thermite__research_note", Output: `{"path":"notes/a.md"}`},
		}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("turn\n%+v\nwant\n%+v", got, want)
	}
	if paths := p.Paths(); !reflect.DeepEqual(paths, []string{"POST /v1/responses"}) {
		t.Errorf("paths %v", paths)
	}
}

func TestResponsesStreamsACallOfANamespacedTool(t *testing.T) {
	p := Start(t, t.TempDir(), Steps("done", Step{Tool: &Call{Name: "mcp__thermite__research_note", Input: map[string]any{"body": "hi"}}}))
	// No results yet: the script's first step.
	body := codexRequest[:strings.Index(codexRequest, `,
  {"type":"function_call","call_id":"c1"`)] + "]}"
	events := postResponses(t, p, body)
	want := []string{"response.created", "response.output_item.added", "response.function_call_arguments.delta",
		"response.function_call_arguments.done", "response.output_item.done", "response.completed"}
	if !reflect.DeepEqual(names(events), want) {
		t.Fatalf("events %v, want %v", names(events), want)
	}
	item := events[4].data["item"].(map[string]any)
	if item["type"] != "function_call" || item["namespace"] != "mcp__thermite" || item["name"] != "research_note" || item["arguments"] != `{"body":"hi"}` || item["call_id"] == "" {
		t.Errorf("the call's item: %v", item)
	}
	if added := events[1].data["item"].(map[string]any); added["call_id"] != item["call_id"] || added["arguments"] != "" {
		t.Errorf("output_item.added %v for the item %v", added, item)
	}
	resp := events[5].data["response"].(map[string]any)
	usage, _ := resp["usage"].(map[string]any)
	if resp["status"] != "completed" || resp["id"] != events[0].data["response"].(map[string]any)["id"] || usage["total_tokens"] == nil {
		t.Errorf("response.completed: %v", resp)
	}
}

func TestResponsesStreamsAFinalMessage(t *testing.T) {
	p := Start(t, t.TempDir(), Steps("all done"))
	events := postResponses(t, p, strings.Replace(codexRequest, "%s", "", 1))
	want := []string{"response.created", "response.output_item.added", "response.content_part.added", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"}
	if !reflect.DeepEqual(names(events), want) {
		t.Fatalf("events %v, want %v", names(events), want)
	}
	if d := events[3].data["delta"]; d != "all done" {
		t.Errorf("delta %v", d)
	}
	item := events[6].data["item"].(map[string]any)
	content := item["content"].([]any)[0].(map[string]any)
	if item["type"] != "message" || item["role"] != "assistant" || content["type"] != "output_text" || content["text"] != "all done" {
		t.Errorf("the message's item: %v", item)
	}
	for i, e := range events {
		if e.data["sequence_number"] != float64(i) {
			t.Errorf("event %d %s: sequence_number %v", i, e.name, e.data["sequence_number"])
		}
	}
}

func TestResponsesCallsAFreeformToolWithItsText(t *testing.T) {
	patch := "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch\n"
	p := Start(t, t.TempDir(), Steps("done", Step{Tool: &Call{Name: "apply_patch", Input: map[string]any{"input": patch}}}))
	body := codexRequest[:strings.Index(codexRequest, `,
  {"type":"function_call","call_id":"c1"`)] + "]}"
	events := postResponses(t, p, body)
	last := events[len(events)-2].data["item"].(map[string]any)
	if last["type"] != "custom_tool_call" || last["name"] != "apply_patch" || last["input"] != patch {
		t.Errorf("the call's item: %v", last)
	}
}
