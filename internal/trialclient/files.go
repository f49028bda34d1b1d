package trialclient

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"thermite/internal/lanefs"
)

// File runs one file helper operation through the harness API: in the
// workspace (group "fs") or the run's research folder ("research").
func File[Req, Resp any](ctx context.Context, c *Client, group string, op lanefs.Typed[Req, Resp], req Req) (*Resp, error) {
	out := new(Resp)
	if err := c.Do(ctx, "POST", "/v1/"+group+"/"+op.Name, req, out); err != nil {
		return nil, err
	}
	return out, nil
}

// cliArgs are a command's flags, its other arguments and its stdin.
type cliArgs struct {
	f     map[string][]string
	rest  []string
	stdin io.Reader
}

// fileOp is one file helper operation as thermite-trial offers it.
type fileOp struct {
	cmd  fileCommand
	tool fileTool
}

// fileCommand is an operation as a command: `fs OP`, and `research OP`
// when the operation changes nothing.
type fileCommand struct {
	op       *lanefs.Op
	args     string // the usage after "fs OP"
	help     string
	min, max int      // how many arguments besides the flags
	flags    []string // the flags it takes
	run      func(ctx context.Context, c *Client, group string, a cliArgs) (any, string, error)
}

// fileCmd makes a command of op: request makes its request from the
// command line, show its answer's plain text.
func fileCmd[Req, Resp any](op lanefs.Typed[Req, Resp], args, help string, min, max int, flags []string,
	request func(a cliArgs) (Req, error), show func(res *Resp, a cliArgs) string) fileCommand {
	return fileCommand{op: op.Op, args: args, help: help, min: min, max: max, flags: flags,
		run: func(ctx context.Context, c *Client, group string, a cliArgs) (any, string, error) {
			req, err := request(a)
			if err != nil {
				return nil, "", err
			}
			res, err := File(ctx, c, group, op, req)
			if err != nil {
				return nil, "", err
			}
			return *res, show(res, a), nil
		}}
}

// fileOps are how thermite-trial offers each file helper operation
// (lanefs.Ops), one row each: its command and its MCP tool, in the order
// the help and the tools list them. Every operation has one
// (TestEveryFileOpHasACommand, TestEveryFileOpHasATool).
var fileOps = []fileOp{
	{
		cmd: fileCmd(lanefs.Read, "PATH [--offset N] [--limit N]", "a file, its bytes to stdout", 1, 1, []string{"offset", "limit"},
			func(a cliArgs) (lanefs.ReadRequest, error) {
				off, err := intFlag(a.f, "offset")
				if err != nil {
					return lanefs.ReadRequest{}, err
				}
				lim, err := intFlag(a.f, "limit")
				return lanefs.ReadRequest{Path: a.rest[0], Offset: off, Limit: lim}, err
			},
			func(res *lanefs.ReadResponse, _ cliArgs) string { return string(res.Data) }),
		tool: fileToolOf(lanefs.Read, func(where string) string {
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
	},
	{
		cmd: fileCmd(lanefs.Write, "PATH [--parents] [--mode 0644] < DATA", "", 1, 1, []string{"parents", "mode"},
			func(a cliArgs) (lanefs.WriteRequest, error) {
				mode, err := intFlag(a.f, "mode")
				if err != nil {
					return lanefs.WriteRequest{}, err
				}
				data, err := io.ReadAll(io.LimitReader(a.stdin, 256<<20))
				return lanefs.WriteRequest{Path: a.rest[0], Data: data, Mode: uint32(mode), CreateParents: a.f["parents"] != nil}, err
			},
			func(res *lanefs.WriteResponse, a cliArgs) string {
				return fmt.Sprintf("wrote %d bytes to %s\n", res.Size, a.rest[0])
			}),
		tool: fileToolOf(lanefs.Write, func(where string) string { return "Write a file of " + where + ": its whole content, as text." },
			func(in writeInput) lanefs.WriteRequest {
				return lanefs.WriteRequest{Path: in.Path, Data: []byte(in.Content), CreateParents: in.CreateParents}
			},
			func(in writeInput, res *lanefs.WriteResponse) string {
				return fmt.Sprintf("wrote %d bytes to %s", res.Size, in.Path)
			}),
	},
	{
		cmd: fileCmd(lanefs.Edit, "PATH OLD NEW", "replace the one place OLD occurs", 3, 3, nil,
			func(a cliArgs) (lanefs.EditRequest, error) {
				return lanefs.EditRequest{Path: a.rest[0], Old: a.rest[1], New: a.rest[2]}, nil
			},
			func(res *lanefs.EditResponse, a cliArgs) string {
				return fmt.Sprintf("edited %s (%d bytes now)\n", a.rest[0], res.Size)
			}),
		tool: fileToolOf(lanefs.Edit, func(where string) string { return "Replace the one place a text occurs in a file of " + where + "." },
			func(in editInput) lanefs.EditRequest {
				return lanefs.EditRequest{Path: in.Path, Old: in.Old, New: in.New}
			},
			func(in editInput, res *lanefs.EditResponse) string {
				return fmt.Sprintf("edited %s (%d bytes now)", in.Path, res.Size)
			}),
	},
	{
		cmd: fileCmd(lanefs.List, "[PATH]", "", 0, 1, nil,
			func(a cliArgs) (lanefs.ListRequest, error) { return lanefs.ListRequest{Path: arg(a.rest, 0)}, nil },
			func(res *lanefs.ListResponse, _ cliArgs) string { return listText(res) }),
		tool: fileToolOf(lanefs.List, func(where string) string { return "List a folder of " + where + "." },
			func(in dirInput) lanefs.ListRequest { return lanefs.ListRequest{Path: in.Path} },
			func(_ dirInput, res *lanefs.ListResponse) string { return listText(res) }),
	},
	{
		cmd: fileCmd(lanefs.Grep, "PATTERN [PATH] [--glob G] [--max N]", "", 1, 2, []string{"glob", "max"},
			func(a cliArgs) (lanefs.GrepRequest, error) {
				max, err := intFlag(a.f, "max")
				return lanefs.GrepRequest{Pattern: a.rest[0], Path: arg(a.rest, 1), Glob: last(a.f, "glob"), MaxMatches: int(max)}, err
			},
			func(res *lanefs.GrepResponse, _ cliArgs) string { return grepText(res) }),
		tool: fileToolOf(lanefs.Grep, func(where string) string { return "Search the files of " + where + " for a regular expression." },
			func(in grepInput) lanefs.GrepRequest {
				return lanefs.GrepRequest{Pattern: in.Pattern, Path: in.Path, Glob: in.Glob, MaxMatches: in.MaxMatches}
			},
			func(_ grepInput, res *lanefs.GrepResponse) string {
				if len(res.Matches) == 0 {
					return "no match\n"
				}
				return grepText(res)
			}),
	},
	{
		cmd: fileCmd(lanefs.Find, "[PATH] [--glob G] [--max N]", "", 0, 1, []string{"glob", "max"},
			func(a cliArgs) (lanefs.FindRequest, error) {
				max, err := intFlag(a.f, "max")
				return lanefs.FindRequest{Path: arg(a.rest, 0), Glob: last(a.f, "glob"), Max: int(max)}, err
			},
			func(res *lanefs.FindResponse, _ cliArgs) string { return findText(res) }),
		tool: fileToolOf(lanefs.Find, func(where string) string { return "Find files of " + where + " whose names match a glob." },
			func(in findInput) lanefs.FindRequest {
				return lanefs.FindRequest{Path: in.Path, Glob: in.Glob, Max: in.Max}
			},
			func(_ findInput, res *lanefs.FindResponse) string { return findText(res) }),
	},
	{
		cmd: fileCmd(lanefs.Stat, "PATH", "", 1, 1, nil,
			func(a cliArgs) (lanefs.StatRequest, error) { return lanefs.StatRequest{Path: a.rest[0]}, nil },
			func(res *lanefs.StatResponse, _ cliArgs) string { return statText(res) }),
		tool: fileToolOf(lanefs.Stat, func(where string) string { return "Describe one file or folder of " + where + "." },
			func(in pathInput) lanefs.StatRequest { return lanefs.StatRequest{Path: in.Path} },
			func(_ pathInput, res *lanefs.StatResponse) string { return statText(res) }),
	},
	{
		cmd: fileCmd(lanefs.Delete, "PATH [--recursive]", "", 1, 1, []string{"recursive"},
			func(a cliArgs) (lanefs.DeleteRequest, error) {
				return lanefs.DeleteRequest{Path: a.rest[0], Recursive: a.f["recursive"] != nil}, nil
			},
			func(res *lanefs.DeleteResponse, _ cliArgs) string { return deleteText(res) }),
		tool: fileToolOf(lanefs.Delete, func(where string) string { return "Delete a file or folder of " + where + "." },
			func(in deleteInput) lanefs.DeleteRequest {
				return lanefs.DeleteRequest{Path: in.Path, Recursive: in.Recursive}
			},
			func(_ deleteInput, res *lanefs.DeleteResponse) string { return deleteText(res) }),
	},
	{
		cmd: fileCmd(lanefs.Mkdir, "PATH [--parents]", "", 1, 1, []string{"parents"},
			func(a cliArgs) (lanefs.MkdirRequest, error) {
				return lanefs.MkdirRequest{Path: a.rest[0], Parents: a.f["parents"] != nil}, nil
			},
			func(res *lanefs.MkdirResponse, a cliArgs) string {
				if !res.Created {
					return a.rest[0] + " was there already\n"
				}
				return "made " + a.rest[0] + "\n"
			}),
		tool: fileToolOf(lanefs.Mkdir, func(where string) string { return "Make a folder in " + where + "." },
			func(in mkdirInput) lanefs.MkdirRequest {
				return lanefs.MkdirRequest{Path: in.Path, Parents: in.Parents}
			},
			func(in mkdirInput, _ *lanefs.MkdirResponse) string { return "made " + in.Path }),
	},
}

// fileCommandOf is the command of `GROUP OP`: every operation in fs, those
// that change nothing in research.
func fileCommandOf(group, op string) (fileCommand, bool) {
	for _, fo := range fileOps {
		fc := fo.cmd
		if fc.op.Name == op && (group == "fs" || group == "research" && !fc.op.Changes) {
			return fc, true
		}
	}
	return fileCommand{}, false
}

// The answers' plain text, the same for a command and its MCP tool.

// listText is a folder's entries, one a line.
func listText(res *lanefs.ListResponse) string {
	var b strings.Builder
	for _, e := range res.Entries {
		fmt.Fprintf(&b, "%-7s %10d  %s\n", e.Type, e.Size, e.Name)
	}
	if res.Truncated {
		b.WriteString("(more entries left out)\n")
	}
	return b.String()
}

// findText is the paths found, one a line.
func findText(res *lanefs.FindResponse) string {
	if len(res.Paths) == 0 {
		return ""
	}
	return strings.Join(res.Paths, "\n") + "\n"
}

// statText is one entry's type, size, mode and change time.
func statText(res *lanefs.StatResponse) string {
	return fmt.Sprintf("%s %d bytes, mode %04o, modified %s\n", res.Type, res.Size, res.Mode, res.MTime.UTC().Format(time.RFC3339))
}

// deleteText is how many entries a delete removed.
func deleteText(res *lanefs.DeleteResponse) string { return fmt.Sprintf("removed %d\n", res.Removed) }

// grepText is a grep's answer as grep prints it.
func grepText(res *lanefs.GrepResponse) string {
	var b strings.Builder
	for _, m := range res.Matches {
		fmt.Fprintf(&b, "%s:%d:%s\n", m.Path, m.LineNo, m.Line)
	}
	if res.Truncated {
		b.WriteString("(more matches left out)\n")
	}
	return b.String()
}

// fileUsage is the help's lines for the file commands of group.
func fileUsage(group string) string {
	var b strings.Builder
	for _, fo := range fileOps {
		fc := fo.cmd
		if group == "research" && fc.op.Changes {
			continue
		}
		line := group + " " + fc.op.Name + " " + fc.args
		switch {
		case fc.help != "" && len(line) > 38:
			line += "\n" + strings.Repeat(" ", 41) + fc.help
		case fc.help != "":
			line = fmt.Sprintf("%-38s %s", line, fc.help)
		}
		b.WriteString("  " + line + "\n")
	}
	return b.String()
}

// The file tools' inputs: their JSON Schemas are made from these types,
// the jsonschema tags the descriptions a model reads.
type (
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
)
