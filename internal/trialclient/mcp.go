//go:build !thermite_nomcp

package trialclient

import (
	"context"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"thermite/internal/apiwire"
	"thermite/internal/lanefs"
)

// Version is what the MCP server says it is.
const Version = "1"

// The tools' inputs: their JSON Schemas are made from these types, the
// jsonschema tags the descriptions a model reads.
type (
	noInput   struct{}
	execInput struct {
		Argv           []string `json:"argv" jsonschema:"the command and its arguments, run without a shell (use [\"sh\",\"-c\",\"...\"] for one)"`
		Cwd            string   `json:"cwd,omitempty" jsonschema:"a folder inside the workspace to run in"`
		Stdin          string   `json:"stdin,omitempty" jsonschema:"text the command reads on its standard input"`
		TimeoutSeconds int      `json:"timeout_seconds,omitempty" jsonschema:"stop it after this many seconds (the rig caps it)"`
		Env            []string `json:"env,omitempty" jsonschema:"variables added to its environment, each as NAME=value"`
	}
	fetchInput struct {
		URL string `json:"url" jsonschema:"an http or https URL of a public page"`
	}
	noteInput struct {
		Title string `json:"title,omitempty" jsonschema:"the note's title"`
		Body  string `json:"body" jsonschema:"the note, in Markdown"`
	}
	stepInput struct {
		Kind string `json:"kind" jsonschema:"what kind of step: thought, plan, result, ..."`
		Text string `json:"text,omitempty" jsonschema:"what it was"`
	}
)

// text is a tool's answer: a line or more for the model, and the API's
// answer as structured content.
func text(s string, structured any) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}, StructuredContent: structured}
}

// tool adds one tool whose handler calls the API; a refusal becomes a tool
// error (isError, its one line), which the model sees and can act on.
func tool[In any](s *mcp.Server, name, desc string, readOnly bool, h func(context.Context, In) (*mcp.CallToolResult, error)) {
	t := &mcp.Tool{Name: name, Description: desc}
	if readOnly {
		t.Annotations = &mcp.ToolAnnotations{ReadOnlyHint: true}
	}
	mcp.AddTool(s, t, func(ctx context.Context, _ *mcp.CallToolRequest, in In) (*mcp.CallToolResult, any, error) {
		res, err := h(context.WithValue(ctx, toolKey{}, name), in)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %s", name, oneLine(err.Error()))
		}
		return res, nil, nil
	})
}

// fileTool is a file operation as an MCP tool: fs_OP, and research_OP
// when the operation changes nothing. fileToolOf makes one.
type fileTool struct {
	op  *lanefs.Op
	add func(s *mcp.Server, c *Client, group, where string)
}

// fileToolOf makes the tool of op: desc says what it does in where, req
// makes the request from the tool's input, and show is the answer's text
// for the model.
func fileToolOf[In, Req, Resp any](op lanefs.Typed[Req, Resp], desc func(where string) string, req func(In) Req, show func(In, *Resp) string) fileTool {
	return fileTool{op: op.Op, add: func(s *mcp.Server, c *Client, group, where string) {
		tool(s, group+"_"+op.Name, desc(where), !op.Changes, func(ctx context.Context, in In) (*mcp.CallToolResult, error) {
			res, err := File(ctx, c, group, op, req(in))
			if err != nil {
				return nil, err
			}
			return text(show(in, res), *res), nil
		})
	}}
}

// NewMCPServer is the MCP server of a trial's tools, each a call to the
// harness API with the trial's token.
func NewMCPServer(c *Client) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "thermite-trial", Version: Version}, &mcp.ServerOptions{
		Instructions: "The tools of one thermite trial. Files are the lane's workspace (fs_*) and the run's shared research folder (research_*, read-only but for notes); exec runs a command as the lane in the workspace. Paths are relative to those folders.",
	})
	tool(s, "trial_info", "The trial: its id, lane, run, workspace and research folder.", true, func(ctx context.Context, _ noInput) (*mcp.CallToolResult, error) {
		var info apiwire.TrialInfo
		if err := c.Do(ctx, "GET", "/v1/trial", nil, &info); err != nil {
			return nil, err
		}
		return text(fmt.Sprintf("trial %s, run %s, lane %d\nworkspace %s\nresearch %s", info.ID, info.Run, info.Lane, info.Workspace, info.ResearchDir), info), nil
	})
	// The file tools are the file helper's operations (fileOps): each
	// on the workspace, and those that change nothing on the research folder.
	for _, group := range []string{"fs", "research"} {
		where := "the workspace"
		if group == "research" {
			where = "the run's research folder"
		}
		for _, fo := range fileOps {
			if group == "fs" || !fo.tool.op.Changes {
				fo.tool.add(s, c, group, where)
			}
		}
	}
	tool(s, "exec", "Run a command as the lane in the workspace: its output and exit status (a non-zero status is an answer, not an error).", false, func(ctx context.Context, in execInput) (*mcp.CallToolResult, error) {
		req := apiwire.ExecRequest{Argv: in.Argv, Cwd: in.Cwd, Stdin: in.Stdin, Env: in.Env, TimeoutMS: int64(in.TimeoutSeconds) * 1000}
		var out, errOut strings.Builder
		last, err := c.Exec(ctx, req, &out, &errOut)
		if err != nil {
			return nil, err
		}
		var b strings.Builder
		fmt.Fprintf(&b, "exit status %d", ExitCode(last))
		if last.Stopped != "" && last.Stopped != "exited" {
			fmt.Fprintf(&b, " (%s)", last.Stopped)
		}
		if last.Error != "" {
			fmt.Fprintf(&b, ": %s", last.Error)
		}
		if last.Truncated {
			fmt.Fprintf(&b, "; output cut at %d of %d bytes", last.OutputCap, last.OutputBytes)
		}
		fmt.Fprintf(&b, "\n--- stdout\n%s\n--- stderr\n%s", out.String(), errOut.String())
		return text(b.String(), map[string]any{"exit_status": ExitCode(last), "stdout": out.String(), "stderr": errOut.String(), "last": last}), nil
	})
	tool(s, "research_fetch", "Fetch a public web page into the run's research folder (private and local addresses are refused).", false, func(ctx context.Context, in fetchInput) (*mcp.CallToolResult, error) {
		var res apiwire.FetchResult
		if err := c.Do(ctx, "POST", "/v1/fetch", apiwire.FetchRequest{URL: in.URL}, &res); err != nil {
			return nil, err
		}
		return text(fmt.Sprintf("%s: %d, %d bytes of %s; research_read %s", res.URL, res.Status, res.Size, res.ContentType, res.Path), res), nil
	})
	tool(s, "research_note", "Write a research note every lane of the run can read.", false, func(ctx context.Context, in noteInput) (*mcp.CallToolResult, error) {
		var res apiwire.NoteResult
		if err := c.Do(ctx, "POST", "/v1/research/note", apiwire.NoteRequest{Title: in.Title, Body: in.Body}, &res); err != nil {
			return nil, err
		}
		return text("noted: research_read "+res.Path, res), nil
	})
	tool(s, "step", "Record one step of your work in the trial's record.", false, func(ctx context.Context, in stepInput) (*mcp.CallToolResult, error) {
		var res apiwire.StepResult
		if err := c.Do(ctx, "POST", "/v1/steps", apiwire.StepRequest{Kind: in.Kind, Text: in.Text}, &res); err != nil {
			return nil, err
		}
		return text(fmt.Sprintf("recorded %d bytes", res.Recorded), res), nil
	})
	return s
}

// ServeMCP serves the trial's tools over stdin and stdout until the
// client goes.
func ServeMCP(ctx context.Context, c *Client) error {
	if err := NewMCPServer(c).Run(ctx, &mcp.StdioTransport{}); err != nil && ctx.Err() == nil {
		return fmt.Errorf("mcp: %w", err)
	}
	return nil
}
