//go:build !thermite_nomcp

package trialclient

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"thermite/controller"
	"thermite/internal/lanefs"
)

// Version is what the MCP server says it is.
const Version = "1"

// The tools' inputs: their JSON Schemas are made from these types, the
// jsonschema tags the descriptions a model reads.
type (
	noInput   struct{}
	pathInput struct {
		Path string `json:"path" jsonschema:"a path relative to the folder (the workspace, or the research folder for research_ tools)"`
	}
	dirInput struct {
		Path string `json:"path,omitempty" jsonschema:"a folder relative to the root; empty for the root itself"`
	}
	readInput struct {
		Path   string `json:"path" jsonschema:"the file, relative to the folder"`
		Offset int64  `json:"offset,omitempty" jsonschema:"the byte to start at"`
		Limit  int64  `json:"limit,omitempty" jsonschema:"at most this many bytes (the server caps it)"`
	}
	writeInput struct {
		Path          string `json:"path" jsonschema:"the file, relative to the workspace"`
		Content       string `json:"content" jsonschema:"the file's whole new content, as text"`
		CreateParents bool   `json:"create_parents,omitempty" jsonschema:"make missing folders on the way"`
	}
	editInput struct {
		Path string `json:"path" jsonschema:"the file, relative to the workspace"`
		Old  string `json:"old" jsonschema:"text that occurs exactly once in the file"`
		New  string `json:"new" jsonschema:"what replaces it"`
	}
	grepInput struct {
		Pattern    string `json:"pattern" jsonschema:"a regular expression (RE2 syntax)"`
		Path       string `json:"path,omitempty" jsonschema:"the folder to search under; empty for the root"`
		Glob       string `json:"glob,omitempty" jsonschema:"only files whose names match this glob"`
		MaxMatches int    `json:"max_matches,omitempty" jsonschema:"at most this many matches"`
	}
	findInput struct {
		Path string `json:"path,omitempty" jsonschema:"the folder to search under; empty for the root"`
		Glob string `json:"glob,omitempty" jsonschema:"a glob the names must match, such as *.go"`
		Max  int    `json:"max,omitempty" jsonschema:"at most this many paths"`
	}
	deleteInput struct {
		Path      string `json:"path" jsonschema:"the file or folder, relative to the workspace"`
		Recursive bool   `json:"recursive,omitempty" jsonschema:"delete a folder with what it holds"`
	}
	mkdirInput struct {
		Path    string `json:"path" jsonschema:"the folder, relative to the workspace"`
		Parents bool   `json:"parents,omitempty" jsonschema:"make missing folders on the way"`
	}
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
		res, err := h(ctx, in)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %s", name, oneLine(err.Error()))
		}
		return res, nil, nil
	})
}

// fileTool is how the MCP server offers one file helper operation
// (lanefs.Ops): as fs_OP, and as research_OP when the operation changes
// nothing. Every operation has one (TestEveryFileOpHasATool).
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

// fileTools are the file tools, in the order they are listed.
var fileTools = []fileTool{
	fileToolOf(lanefs.Read, func(where string) string {
		return "Read a file of " + where + " (text; bytes that are not UTF-8 come as base64)."
	},
		func(in readInput) lanefs.ReadRequest {
			return lanefs.ReadRequest{Path: in.Path, Offset: in.Offset, Limit: in.Limit}
		},
		func(_ readInput, res *lanefs.ReadResponse) string {
			body := string(res.Data)
			if !utf8.Valid(res.Data) {
				body = "(not UTF-8; the bytes are in structured content, base64)"
			}
			if res.Truncated {
				body += fmt.Sprintf("\n(cut: the file has %d bytes; read on with offset)", res.Size)
			}
			return body
		}),
	fileToolOf(lanefs.List, func(where string) string { return "List a folder of " + where + "." },
		func(in dirInput) lanefs.ListRequest { return lanefs.ListRequest{Path: in.Path} },
		func(_ dirInput, res *lanefs.ListResponse) string {
			var b strings.Builder
			for _, e := range res.Entries {
				fmt.Fprintf(&b, "%s %d %s\n", e.Type, e.Size, e.Name)
			}
			if res.Truncated {
				b.WriteString("(more entries left out)\n")
			}
			return b.String()
		}),
	fileToolOf(lanefs.Grep, func(where string) string { return "Search the files of " + where + " for a regular expression." },
		func(in grepInput) lanefs.GrepRequest {
			return lanefs.GrepRequest{Pattern: in.Pattern, Path: in.Path, Glob: in.Glob, MaxMatches: in.MaxMatches}
		},
		func(_ grepInput, res *lanefs.GrepResponse) string {
			var b strings.Builder
			for _, m := range res.Matches {
				fmt.Fprintf(&b, "%s:%d:%s\n", m.Path, m.LineNo, m.Line)
			}
			if len(res.Matches) == 0 {
				b.WriteString("no match\n")
			}
			return b.String()
		}),
	fileToolOf(lanefs.Find, func(where string) string { return "Find files of " + where + " whose names match a glob." },
		func(in findInput) lanefs.FindRequest {
			return lanefs.FindRequest{Path: in.Path, Glob: in.Glob, Max: in.Max}
		},
		func(_ findInput, res *lanefs.FindResponse) string { return strings.Join(res.Paths, "\n") }),
	fileToolOf(lanefs.Stat, func(where string) string { return "Describe one file or folder of " + where + "." },
		func(in pathInput) lanefs.StatRequest { return lanefs.StatRequest{Path: in.Path} },
		func(_ pathInput, res *lanefs.StatResponse) string {
			return fmt.Sprintf("%s %d bytes, mode %04o, modified %s", res.Type, res.Size, res.Mode, res.MTime.UTC().Format(time.RFC3339))
		}),
	fileToolOf(lanefs.Write, func(where string) string { return "Write a file of " + where + ": its whole content, as text." },
		func(in writeInput) lanefs.WriteRequest {
			return lanefs.WriteRequest{Path: in.Path, Data: []byte(in.Content), CreateParents: in.CreateParents}
		},
		func(in writeInput, res *lanefs.WriteResponse) string {
			return fmt.Sprintf("wrote %d bytes to %s", res.Size, in.Path)
		}),
	fileToolOf(lanefs.Edit, func(where string) string { return "Replace the one place a text occurs in a file of " + where + "." },
		func(in editInput) lanefs.EditRequest {
			return lanefs.EditRequest{Path: in.Path, Old: in.Old, New: in.New}
		},
		func(in editInput, res *lanefs.EditResponse) string {
			return fmt.Sprintf("edited %s (%d bytes now)", in.Path, res.Size)
		}),
	fileToolOf(lanefs.Delete, func(where string) string { return "Delete a file or folder of " + where + "." },
		func(in deleteInput) lanefs.DeleteRequest {
			return lanefs.DeleteRequest{Path: in.Path, Recursive: in.Recursive}
		},
		func(_ deleteInput, res *lanefs.DeleteResponse) string { return fmt.Sprintf("removed %d", res.Removed) }),
	fileToolOf(lanefs.Mkdir, func(where string) string { return "Make a folder in " + where + "." },
		func(in mkdirInput) lanefs.MkdirRequest {
			return lanefs.MkdirRequest{Path: in.Path, Parents: in.Parents}
		},
		func(in mkdirInput, _ *lanefs.MkdirResponse) string { return "made " + in.Path }),
}

// NewMCPServer is the MCP server of a trial's tools, each a call to the
// harness API with the trial's token.
func NewMCPServer(c *Client) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "thermite-trial", Version: Version}, &mcp.ServerOptions{
		Instructions: "The tools of one thermite trial. Files are the lane's workspace (fs_*) and the run's shared research folder (research_*, read-only but for notes); exec runs a command as the lane in the workspace. Paths are relative to those folders.",
	})
	tool(s, "trial_info", "The trial: its id, lane, run, workspace and research folder.", true, func(ctx context.Context, _ noInput) (*mcp.CallToolResult, error) {
		var info controller.TrialInfo
		if err := c.Do(ctx, "GET", "/v1/trial", nil, &info); err != nil {
			return nil, err
		}
		return text(fmt.Sprintf("trial %s, run %s, lane %d\nworkspace %s\nresearch %s", info.ID, info.Run, info.Lane, info.Workspace, info.ResearchDir), info), nil
	})
	// The file tools are the file helper's operations (fileTools): each
	// on the workspace, and those that change nothing on the research folder.
	for _, group := range []string{"fs", "research"} {
		where := "the workspace"
		if group == "research" {
			where = "the run's research folder"
		}
		for _, ft := range fileTools {
			if group == "fs" || !ft.op.Changes {
				ft.add(s, c, group, where)
			}
		}
	}
	tool(s, "exec", "Run a command as the lane in the workspace: its output and exit status (a non-zero status is an answer, not an error).", false, func(ctx context.Context, in execInput) (*mcp.CallToolResult, error) {
		req := controller.ExecRequest{Argv: in.Argv, Cwd: in.Cwd, Stdin: in.Stdin, Env: in.Env, TimeoutMS: int64(in.TimeoutSeconds) * 1000}
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
		var res controller.FetchResult
		if err := c.Do(ctx, "POST", "/v1/fetch", controller.FetchRequest{URL: in.URL}, &res); err != nil {
			return nil, err
		}
		return text(fmt.Sprintf("%s: %d, %d bytes of %s; research_read %s", res.URL, res.Status, res.Size, res.ContentType, res.Path), res), nil
	})
	tool(s, "research_note", "Write a research note every lane of the run can read.", false, func(ctx context.Context, in noteInput) (*mcp.CallToolResult, error) {
		var res controller.NoteResult
		if err := c.Do(ctx, "POST", "/v1/research/note", controller.NoteRequest{Title: in.Title, Body: in.Body}, &res); err != nil {
			return nil, err
		}
		return text("noted: research_read "+res.Path, res), nil
	})
	tool(s, "step", "Record one step of your work in the trial's record.", false, func(ctx context.Context, in stepInput) (*mcp.CallToolResult, error) {
		var res controller.StepResult
		if err := c.Do(ctx, "POST", "/v1/steps", controller.StepRequest{Kind: in.Kind, Text: in.Text}, &res); err != nil {
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
