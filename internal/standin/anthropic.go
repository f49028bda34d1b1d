package standin

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
)

// Anthropic's Messages API as far as one scripted turn of Claude Code (and
// of Pi, which speaks it too) needs: POST /v1/messages, streamed as
// server-sent events or answered as one JSON message, and POST
// /v1/messages/count_tokens, which Claude Code asks before it compacts.

func init() {
	protocols["POST /v1/messages"] = anthropicMessages
	protocols["POST /v1/messages/count_tokens"] = anthropicCountTokens
}

// anthropicRequest is the part of a Messages request the stand-in reads.
type anthropicRequest struct {
	Model    string             `json:"model"`
	Stream   bool               `json:"stream"`
	Tools    []anthropicTool    `json:"tools"`
	Messages []anthropicMessage `json:"messages"`
}

type anthropicTool struct {
	Name string `json:"name"`
}

type anthropicMessage struct {
	Role string `json:"role"`
	// Content is a string or a list of blocks.
	Content json.RawMessage `json:"content"`
}

// anthropicBlock is one content block: text, tool_use, tool_result (whose
// content is again a string or a list of blocks), tool_reference (a
// deferred tool that Claude Code's ToolSearch loaded) or one the stand-in
// ignores (image, thinking).
type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	ToolName  string          `json:"tool_name"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
}

// anthropicBlocks reads a content field: a plain string is one text block.
func anthropicBlocks(raw json.RawMessage) []anthropicBlock {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []anthropicBlock{{Type: "text", Text: s}}
	}
	var blocks []anthropicBlock
	json.Unmarshal(raw, &blocks)
	return blocks
}

// anthropicText joins the text blocks of a content field, a
// tool_reference shown as the tool's name.
func anthropicText(raw json.RawMessage) string {
	var texts []string
	for _, b := range anthropicBlocks(raw) {
		switch b.Type {
		case "text":
			texts = append(texts, b.Text)
		case "tool_reference":
			texts = append(texts, b.ToolName)
		}
	}
	return strings.Join(texts, "\n")
}

// anthropicTurn is what a Messages request shows of the conversation.
func anthropicTurn(path string, req anthropicRequest) Turn {
	t := Turn{API: AnthropicMessages, Path: path, Model: req.Model, Stream: req.Stream}
	for _, tool := range req.Tools {
		t.Tools = append(t.Tools, tool.Name)
	}
	// A tool_result names its call by id; the call, in an earlier
	// assistant message, names the tool.
	names := map[string]string{}
	for _, m := range req.Messages {
		blocks := anthropicBlocks(m.Content)
		for _, b := range blocks {
			switch {
			case m.Role == "assistant" && b.Type == "tool_use":
				names[b.ID] = b.Name
			case m.Role == "user" && b.Type == "tool_result":
				t.Results = append(t.Results, Result{CallID: b.ToolUseID, Name: names[b.ToolUseID], Output: anthropicText(b.Content), IsError: b.IsError, Reported: true})
			}
		}
		if m.Role == "user" {
			if text := anthropicText(m.Content); text != "" {
				t.Prompt = text
			}
		}
	}
	return t
}

// anthropicCalls numbers the stand-in's tool calls and messages, so each
// id is unique within a run.
var anthropicCalls atomic.Int64

// anthropicError answers as the Messages API does when a request is wrong.
func anthropicError(w http.ResponseWriter, code int, kind, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{"type": "error", "error": map[string]any{"type": kind, "message": message}})
}

// anthropicContent is the step as the answer's content blocks: its text
// (if any), then its tool call (if any), with the stop reason that goes
// with them.
func anthropicContent(s Step) (blocks []map[string]any, stopReason string) {
	if s.Text != "" || s.Tool == nil {
		blocks = append(blocks, map[string]any{"type": "text", "text": s.Text})
	}
	if s.Tool == nil {
		return blocks, "end_turn"
	}
	input := s.Tool.Input
	if input == nil {
		input = map[string]any{}
	}
	id := fmt.Sprintf("toolu_standin%06d", anthropicCalls.Add(1))
	return append(blocks, map[string]any{"type": "tool_use", "id": id, "name": s.Tool.Name, "input": input}), "tool_use"
}

func anthropicMessages(p *Provider) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p.seen(r)
		var req anthropicRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			anthropicError(w, http.StatusBadRequest, "invalid_request_error", "the stand-in provider cannot read the request: "+err.Error())
			return
		}
		step := p.Answer(anthropicTurn(r.URL.Path, req))
		blocks, stopReason := anthropicContent(step)
		id := fmt.Sprintf("msg_standin%06d", anthropicCalls.Add(1))
		usage := map[string]any{"input_tokens": 10, "output_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
		message := map[string]any{"id": id, "type": "message", "role": "assistant", "model": req.Model,
			"content": blocks, "stop_reason": stopReason, "stop_sequence": nil, "usage": usage}
		w.Header().Set("request-id", "req_"+id)
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(message)
			return
		}
		e := newEvents(w)
		start := map[string]any{}
		for k, v := range message {
			start[k] = v
		}
		start["content"], start["stop_reason"] = []any{}, nil
		e.send("message_start", map[string]any{"type": "message_start", "message": start})
		for i, b := range blocks {
			// A block starts empty and arrives in deltas: text as one
			// text_delta, a tool call's input as JSON in two pieces (as
			// the real API splits it).
			if b["type"] == "tool_use" {
				e.send("content_block_start", map[string]any{"type": "content_block_start", "index": i,
					"content_block": map[string]any{"type": "tool_use", "id": b["id"], "name": b["name"], "input": map[string]any{}}})
				j, _ := json.Marshal(b["input"])
				for _, part := range []string{string(j[:len(j)/2]), string(j[len(j)/2:])} {
					e.send("content_block_delta", map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "input_json_delta", "partial_json": part}})
				}
			} else {
				e.send("content_block_start", map[string]any{"type": "content_block_start", "index": i, "content_block": map[string]any{"type": "text", "text": ""}})
				e.send("content_block_delta", map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "text_delta", "text": b["text"]}})
			}
			e.send("content_block_stop", map[string]any{"type": "content_block_stop", "index": i})
		}
		e.send("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stopReason, "stop_sequence": nil}, "usage": map[string]any{"output_tokens": 10}})
		e.send("message_stop", map[string]any{"type": "message_stop"})
	}
}

// anthropicCountTokens answers a token count: a rough four characters a
// token of the request, which is all Claude Code does with it (decide
// whether to compact).
func anthropicCountTokens(p *Provider) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p.seen(r)
		var body json.RawMessage
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			anthropicError(w, http.StatusBadRequest, "invalid_request_error", "the stand-in provider cannot read the request: "+err.Error())
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"input_tokens": len(body)/4 + 1})
	}
}
