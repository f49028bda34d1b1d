package standin

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
)

// OpenAI's Chat Completions API as far as one scripted turn of OpenCode
// (through its bundled @ai-sdk/openai-compatible provider) needs: POST
// /v1/chat/completions, streamed as server-sent chunks ending in
// "data: [DONE]" or answered as one JSON completion. OpenCode 1.18.33 asks
// nothing else of a custom provider (no GET /v1/models).

func init() {
	protocols["POST /v1/chat/completions"] = chatCompletions
}

// chatRequest is the part of a Chat Completions request the stand-in reads.
type chatRequest struct {
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Tools    []chatTool    `json:"tools"`
	Messages []chatMessage `json:"messages"`
}

// chatTool is an offered tool: {"type":"function","function":{"name":...}}.
type chatTool struct {
	Type     string `json:"type"`
	Function struct {
		Name string `json:"name"`
	} `json:"function"`
}

type chatMessage struct {
	Role string `json:"role"`
	// Content is a string, a list of parts, or null.
	Content    json.RawMessage `json:"content"`
	ToolCalls  []chatToolCall  `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
}

type chatToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// chatText reads a content field: a string as it is, a list of parts as
// its text parts joined (an image part and the like is skipped).
func chatText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	json.Unmarshal(raw, &parts)
	var texts []string
	for _, p := range parts {
		if p.Type == "text" {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n")
}

// chatTurn is what a Chat Completions request shows of the conversation.
// The API has no error flag on a tool's result (Result.Reported is
// false): OpenCode sends a failed tool's error as the result's text, and
// says it failed only in its own record (`opencode run --format json`).
func chatTurn(path string, req chatRequest) Turn {
	t := Turn{API: OpenAIChat, Path: path, Model: req.Model, Stream: req.Stream}
	for _, tool := range req.Tools {
		t.Tools = append(t.Tools, tool.Function.Name)
	}
	// A "tool" message names its call by id; the call, in an earlier
	// assistant message, names the tool.
	names := map[string]string{}
	for _, m := range req.Messages {
		switch m.Role {
		case "assistant":
			for _, c := range m.ToolCalls {
				names[c.ID] = c.Function.Name
			}
		case "tool":
			t.Results = append(t.Results, Result{CallID: m.ToolCallID, Name: names[m.ToolCallID], Output: chatText(m.Content), Reported: false})
		case "user":
			if text := chatText(m.Content); text != "" {
				t.Prompt = text
			}
		}
	}
	return t
}

// chatCalls numbers the stand-in's completions and tool calls, so each id
// is unique within a run.
var chatCalls atomic.Int64

// chatError answers as the API does when a request is wrong.
func chatError(w http.ResponseWriter, code int, kind, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"type": kind, "message": message, "code": nil, "param": nil}})
}

// chatAnswer is a step as the assistant's message: its text (null when a
// tool call has none) and its tool call, with the finish reason that goes
// with them.
func chatAnswer(s Step) (content any, calls []map[string]any, finish string) {
	if s.Text != "" || s.Tool == nil {
		content = s.Text
	}
	if s.Tool == nil {
		return content, nil, "stop"
	}
	input := s.Tool.Input
	if input == nil {
		input = map[string]any{}
	}
	args, _ := json.Marshal(input)
	id := fmt.Sprintf("call_standin%06d", chatCalls.Add(1))
	calls = []map[string]any{{"id": id, "type": "function", "function": map[string]any{"name": s.Tool.Name, "arguments": string(args)}}}
	return content, calls, "tool_calls"
}

func chatCompletions(p *Provider) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p.seen(r)
		var req chatRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			chatError(w, http.StatusBadRequest, "invalid_request_error", "the stand-in provider cannot read the request: "+err.Error())
			return
		}
		step := p.Answer(chatTurn(r.URL.Path, req))
		content, calls, finish := chatAnswer(step)
		id := fmt.Sprintf("chatcmpl-standin%06d", chatCalls.Add(1))
		created := time.Now().Unix()
		usage := map[string]any{"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}
		if !req.Stream {
			message := map[string]any{"role": "assistant", "content": content}
			if calls != nil {
				message["tool_calls"] = calls
			}
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(map[string]any{"id": id, "object": "chat.completion", "created": created, "model": req.Model,
				"choices": []any{map[string]any{"index": 0, "message": message, "finish_reason": finish}}, "usage": usage})
			return
		}
		e := newEvents(w)
		chunk := func(delta map[string]any, finish any) {
			e.send("", map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": req.Model,
				"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}})
		}
		chunk(map[string]any{"role": "assistant", "content": ""}, nil)
		if text, _ := content.(string); text != "" {
			chunk(map[string]any{"content": text}, nil)
		}
		for i, c := range calls {
			// A call arrives as its id and name with empty arguments,
			// then the arguments' JSON in two pieces, as the real API
			// splits them.
			f := c["function"].(map[string]any)
			chunk(map[string]any{"tool_calls": []any{map[string]any{"index": i, "id": c["id"], "type": "function",
				"function": map[string]any{"name": f["name"], "arguments": ""}}}}, nil)
			args := f["arguments"].(string)
			for _, part := range []string{args[:len(args)/2], args[len(args)/2:]} {
				chunk(map[string]any{"tool_calls": []any{map[string]any{"index": i, "function": map[string]any{"arguments": part}}}}, nil)
			}
		}
		chunk(map[string]any{}, finish)
		if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
			e.send("", map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": req.Model, "choices": []any{}, "usage": usage})
		}
		e.send("", "[DONE]")
	}
}
