package standin

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
)

// The OpenAI Responses API as far as Codex needs it for one turn: POST
// /v1/responses, streamed. A request's input is the whole conversation
// (Codex sends store=false), so each request is one Turn. Codex 0.171.0
// asks a provider of its own configuration for nothing else (no GET
// /v1/models).

func init() {
	protocols["POST /v1/responses"] = func(p *Provider) http.HandlerFunc { return p.responses }
}

// responsesRequest is the part of a request the stand-in reads.
type responsesRequest struct {
	Model  string              `json:"model"`
	Stream bool                `json:"stream"`
	Input  []responsesItem     `json:"input"`
	Tools  []responsesToolSpec `json:"tools"`
}

// responsesToolSpec is one offered tool: a function, a freeform (custom)
// tool such as apply_patch, a hosted tool (web_search, no name), or a
// namespace holding tools of its own (MCP servers, sub-agents).
type responsesToolSpec struct {
	Type  string              `json:"type"`
	Name  string              `json:"name"`
	Tools []responsesToolSpec `json:"tools"`
}

// responsesItem is one item of the conversation.
type responsesItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Namespace string          `json:"namespace"`
	Output    json.RawMessage `json:"output"`
}

// responsesTool is where an offered name lives: its namespace (none for a
// top-level tool) and its name there, and whether it is a freeform tool.
type responsesTool struct {
	namespace, name string
	custom          bool
}

// responsesToolName is the name a tool is offered by in Turn.Tools: its
// own name, or its namespace's and its own joined the way Codex names an
// MCP server's tools (mcp__thermite + research_note is
// mcp__thermite__research_note), with "." for another namespace
// (multi_agent_v1.spawn_agent).
func responsesToolName(namespace, name string) string {
	switch {
	case namespace == "" || strings.HasSuffix(namespace, "_"):
		return namespace + name
	case strings.HasPrefix(namespace, "mcp__"):
		return namespace + "__" + name
	}
	return namespace + "." + name
}

// offered flattens the request's tools into their names and where each
// lives.
func (q *responsesRequest) offered() ([]string, map[string]responsesTool) {
	var names []string
	where := map[string]responsesTool{}
	var add func(namespace string, specs []responsesToolSpec)
	add = func(namespace string, specs []responsesToolSpec) {
		for _, s := range specs {
			switch {
			case s.Type == "namespace":
				add(s.Name, s.Tools)
			case s.Name != "":
				n := responsesToolName(namespace, s.Name)
				names = append(names, n)
				where[n] = responsesTool{namespace: namespace, name: s.Name, custom: s.Type == "custom"}
			}
		}
	}
	add("", q.Tools)
	return names, where
}

// exitCode is how Codex's shell tools report a command's exit status.
var exitCode = regexp.MustCompile(`(?m)^Process exited with code (\d+)`)

// turn is what the request shows of the conversation.
func (q *responsesRequest) turn(path string) Turn {
	t := Turn{API: OpenAIResponses, Path: path, Model: q.Model, Stream: q.Stream}
	t.Tools, _ = q.offered()
	names := map[string]string{}
	for _, it := range q.Input {
		switch it.Type {
		case "message":
			if it.Role == "user" {
				if text := contentText(it.Content); text != "" {
					t.Prompt = text
				}
			}
		case "function_call", "custom_tool_call":
			names[it.CallID] = responsesToolName(it.Namespace, it.Name)
		case "function_call_output", "custom_tool_call_output":
			out := contentText(it.Output)
			m := exitCode.FindStringSubmatch(out)
			// Codex reports a command's status in its output's text; an
			// MCP tool's error in nothing the provider sees.
			t.Results = append(t.Results, Result{CallID: it.CallID, Name: names[it.CallID], Output: out, IsError: m != nil && m[1] != "0", Reported: m != nil})
		}
	}
	return t
}

// contentText is the text of a message's content or a tool's output:
// a string, or a list of parts whose text fields it joins.
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return ""
	}
	texts := make([]string, 0, len(parts))
	for _, p := range parts {
		if p.Text != "" {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n")
}

// responseSeq numbers the stand-in's responses and items across a test.
var responseSeq atomic.Int64

// responses answers POST /v1/responses with the script's step, streamed
// as Codex reads it.
func (p *Provider) responses(w http.ResponseWriter, r *http.Request) {
	p.seen(r)
	body, err := io.ReadAll(r.Body)
	var q responsesRequest
	if err == nil {
		err = json.Unmarshal(body, &q)
	}
	if err != nil {
		http.Error(w, `{"error":{"type":"invalid_request_error","message":"the stand-in could not read the request"}}`, http.StatusBadRequest)
		return
	}
	t := q.turn(r.URL.Path)
	step := p.Answer(t)
	n := responseSeq.Add(1)
	id := fmt.Sprintf("resp_standin_%d", n)
	var item map[string]any
	if step.Tool != nil {
		_, where := q.offered()
		tool, ok := where[step.Tool.Name]
		if !ok {
			tool = responsesTool{name: step.Tool.Name}
		}
		args, _ := json.Marshal(step.Tool.Input)
		item = map[string]any{"type": "function_call", "id": fmt.Sprintf("fc_standin_%d", n),
			"call_id": fmt.Sprintf("call_standin_%d", n), "name": tool.name, "arguments": string(args), "status": "completed"}
		if tool.namespace != "" {
			item["namespace"] = tool.namespace
		}
		if tool.custom {
			// A freeform tool (apply_patch) takes its input as text.
			input, _ := step.Tool.Input["input"].(string)
			item = map[string]any{"type": "custom_tool_call", "id": item["id"], "call_id": item["call_id"], "name": tool.name, "input": input, "status": "completed"}
		}
	} else {
		item = map[string]any{"type": "message", "id": fmt.Sprintf("msg_standin_%d", n), "role": "assistant", "status": "completed",
			"content": []map[string]any{{"type": "output_text", "text": step.Text, "annotations": []any{}}}}
	}
	usage := map[string]any{"input_tokens": len(body) / 4, "input_tokens_details": map[string]any{"cached_tokens": 0},
		"output_tokens": 10, "output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": len(body)/4 + 10}
	response := func(status string, output []any, usage any) map[string]any {
		return map[string]any{"id": id, "object": "response", "status": status, "model": q.Model, "output": output, "usage": usage}
	}
	if !q.Stream {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(response("completed", []any{item}, usage))
		return
	}
	e := newEvents(w)
	seq := 0
	send := func(kind string, data map[string]any) {
		data["type"], data["sequence_number"] = kind, seq
		seq++
		e.send(kind, data)
	}
	send("response.created", map[string]any{"response": response("in_progress", []any{}, nil)})
	itemID := item["id"]
	switch item["type"] {
	case "function_call":
		added := map[string]any{}
		for k, v := range item {
			added[k] = v
		}
		added["arguments"], added["status"] = "", "in_progress"
		send("response.output_item.added", map[string]any{"output_index": 0, "item": added})
		send("response.function_call_arguments.delta", map[string]any{"item_id": itemID, "output_index": 0, "delta": item["arguments"]})
		send("response.function_call_arguments.done", map[string]any{"item_id": itemID, "output_index": 0, "arguments": item["arguments"]})
	case "custom_tool_call":
		send("response.output_item.added", map[string]any{"output_index": 0, "item": item})
		send("response.custom_tool_call_input.done", map[string]any{"item_id": itemID, "output_index": 0, "input": item["input"]})
	case "message":
		send("response.output_item.added", map[string]any{"output_index": 0, "item": map[string]any{"type": "message", "id": itemID, "role": "assistant", "status": "in_progress", "content": []any{}}})
		part := map[string]any{"type": "output_text", "text": "", "annotations": []any{}}
		send("response.content_part.added", map[string]any{"item_id": itemID, "output_index": 0, "content_index": 0, "part": part})
		send("response.output_text.delta", map[string]any{"item_id": itemID, "output_index": 0, "content_index": 0, "delta": step.Text})
		send("response.output_text.done", map[string]any{"item_id": itemID, "output_index": 0, "content_index": 0, "text": step.Text})
		part = map[string]any{"type": "output_text", "text": step.Text, "annotations": []any{}}
		send("response.content_part.done", map[string]any{"item_id": itemID, "output_index": 0, "content_index": 0, "part": part})
	}
	send("response.output_item.done", map[string]any{"output_index": 0, "item": item})
	send("response.completed", map[string]any{"response": response("completed", []any{item}, usage)})
}
