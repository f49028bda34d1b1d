//go:build !thermite_nomcp

package trialclient

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"thermite/internal/lanefs"
)

// TestMCPToolsListWithSchemasAndRefusalsAreToolErrors connects the SDK's
// own client to the server in memory, in front of a stand-in API that
// refuses everything as the real one does: every tool is listed with a
// description and an object input schema, and a refusal comes back as a
// tool error holding the API's line and code, not as a protocol error.
func TestMCPToolsListWithSchemasAndRefusalsAreToolErrors(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(403)
		json.NewEncoder(w).Encode(map[string]any{"type": "urn:thermite:problem:fetch_refused", "title": "Forbidden", "status": 403, "detail": "refused: 127.0.0.1 is a loopback address", "code": "fetch_refused"})
	}))
	defer api.Close()
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	srv := NewMCPServer(New("", api.URL, "tok", "t1"))
	go srv.Run(ctx, st)
	s, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tools, err := s.ListTools(ctx, nil)
	if err != nil || len(tools.Tools) < 19 {
		t.Fatalf("tools/list: %v, %d tools", err, len(tools.Tools))
	}
	for _, tl := range tools.Tools {
		schema, _ := json.Marshal(tl.InputSchema)
		if tl.Description == "" || !strings.Contains(string(schema), `"type":"object"`) {
			t.Errorf("tool %s: description %q, schema %s", tl.Name, tl.Description, schema)
		}
	}
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "research_fetch", Arguments: map[string]any{"url": "http://127.0.0.1/"}})
	if err != nil || !res.IsError || len(res.Content) != 1 {
		t.Fatalf("fetch: %v %+v", err, res)
	}
	if txt := res.Content[0].(*mcp.TextContent).Text; txt != "research_fetch: refused: 127.0.0.1 is a loopback address (fetch_refused, 403)" {
		t.Fatalf("tool error %q", txt)
	}
	if _, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"argv": "not a list"}}); err == nil {
		res, _ := s.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"argv": "not a list"}})
		if !res.IsError {
			t.Fatal("exec with argv a string was taken")
		}
	}
}

// TestEveryFileOpHasATool: each operation of the file helper
// (lanefs.Ops) is a tool fs_OP, and one that changes nothing is also
// research_OP, marked read-only; one that changes files has no research
// tool.
func TestEveryFileOpHasATool(t *testing.T) {
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	go NewMCPServer(New("", "http://127.0.0.1:1", "tok", "t1")).Run(ctx, st)
	s, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tools, err := s.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	readOnly := map[string]bool{}
	for _, tl := range tools.Tools {
		readOnly[tl.Name] = tl.Annotations != nil && tl.Annotations.ReadOnlyHint
	}
	for _, op := range lanefs.Ops {
		ro, ok := readOnly["fs_"+op.Name]
		if !ok || ro == op.Changes {
			t.Errorf("fs_%s: listed %v, read-only %v; the operation changes files: %v", op.Name, ok, ro, op.Changes)
		}
		ro, ok = readOnly["research_"+op.Name]
		if ok == op.Changes || ok && !ro {
			t.Errorf("research_%s: listed %v, read-only %v; the operation changes files: %v", op.Name, ok, ro, op.Changes)
		}
	}
	if len(fileOps) != len(lanefs.Ops) {
		t.Errorf("%d file tools for %d operations", len(fileOps), len(lanefs.Ops))
	}
}
