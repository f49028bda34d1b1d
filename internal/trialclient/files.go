package trialclient

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

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

// fileCommand is how thermite-trial offers one file helper operation
// (lanefs.Ops): `fs OP`, and `research OP` when the operation changes
// nothing. Every operation has one (TestEveryFileOpHasACommand).
type fileCommand struct {
	op       *lanefs.Op
	args     string // the usage after "fs OP"
	help     string
	min, max int      // how many arguments besides the flags
	flags    []string // the flags it takes
	run      func(ctx context.Context, c *Client, group string, a cliArgs) (any, string, error)
}

// fileCmd makes a command of op: request makes its request from the
// command line, text its answer's plain text.
func fileCmd[Req, Resp any](op lanefs.Typed[Req, Resp], args, help string, min, max int, flags []string,
	request func(a cliArgs) (Req, error), text func(res *Resp, a cliArgs) string) fileCommand {
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
			return *res, text(res, a), nil
		}}
}

// fileCommands are the file commands, in the order the help lists them.
var fileCommands = []fileCommand{
	fileCmd(lanefs.Read, "PATH [--offset N] [--limit N]", "a file, its bytes to stdout", 1, 1, []string{"offset", "limit"},
		func(a cliArgs) (lanefs.ReadRequest, error) {
			off, err := intFlag(a.f, "offset")
			if err != nil {
				return lanefs.ReadRequest{}, err
			}
			lim, err := intFlag(a.f, "limit")
			return lanefs.ReadRequest{Path: a.rest[0], Offset: off, Limit: lim}, err
		},
		func(res *lanefs.ReadResponse, _ cliArgs) string { return string(res.Data) }),
	fileCmd(lanefs.Write, "PATH [--parents] [--mode 0644] < DATA", "", 1, 1, []string{"parents", "mode"},
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
	fileCmd(lanefs.Edit, "PATH OLD NEW", "replace the one place OLD occurs", 3, 3, nil,
		func(a cliArgs) (lanefs.EditRequest, error) {
			return lanefs.EditRequest{Path: a.rest[0], Old: a.rest[1], New: a.rest[2]}, nil
		},
		func(res *lanefs.EditResponse, a cliArgs) string {
			return fmt.Sprintf("edited %s (%d bytes now)\n", a.rest[0], res.Size)
		}),
	fileCmd(lanefs.List, "[PATH]", "", 0, 1, nil,
		func(a cliArgs) (lanefs.ListRequest, error) { return lanefs.ListRequest{Path: arg(a.rest, 0)}, nil },
		func(res *lanefs.ListResponse, _ cliArgs) string {
			var b strings.Builder
			for _, e := range res.Entries {
				fmt.Fprintf(&b, "%-7s %10d  %s\n", e.Type, e.Size, e.Name)
			}
			if res.Truncated {
				b.WriteString("(more entries left out)\n")
			}
			return b.String()
		}),
	fileCmd(lanefs.Grep, "PATTERN [PATH] [--glob G] [--max N]", "", 1, 2, []string{"glob", "max"},
		func(a cliArgs) (lanefs.GrepRequest, error) {
			max, err := intFlag(a.f, "max")
			return lanefs.GrepRequest{Pattern: a.rest[0], Path: arg(a.rest, 1), Glob: last(a.f, "glob"), MaxMatches: int(max)}, err
		},
		func(res *lanefs.GrepResponse, _ cliArgs) string { return grepText(res) }),
	fileCmd(lanefs.Find, "[PATH] [--glob G] [--max N]", "", 0, 1, []string{"glob", "max"},
		func(a cliArgs) (lanefs.FindRequest, error) {
			max, err := intFlag(a.f, "max")
			return lanefs.FindRequest{Path: arg(a.rest, 0), Glob: last(a.f, "glob"), Max: int(max)}, err
		},
		func(res *lanefs.FindResponse, _ cliArgs) string {
			text := strings.Join(res.Paths, "\n")
			if text != "" {
				text += "\n"
			}
			return text
		}),
	fileCmd(lanefs.Stat, "PATH", "", 1, 1, nil,
		func(a cliArgs) (lanefs.StatRequest, error) { return lanefs.StatRequest{Path: a.rest[0]}, nil },
		func(res *lanefs.StatResponse, _ cliArgs) string {
			return fmt.Sprintf("%s %d bytes, mode %04o, modified %s\n", res.Type, res.Size, res.Mode, res.MTime.UTC().Format(time.RFC3339))
		}),
	fileCmd(lanefs.Delete, "PATH [--recursive]", "", 1, 1, []string{"recursive"},
		func(a cliArgs) (lanefs.DeleteRequest, error) {
			return lanefs.DeleteRequest{Path: a.rest[0], Recursive: a.f["recursive"] != nil}, nil
		},
		func(res *lanefs.DeleteResponse, _ cliArgs) string { return fmt.Sprintf("removed %d\n", res.Removed) }),
	fileCmd(lanefs.Mkdir, "PATH [--parents]", "", 1, 1, []string{"parents"},
		func(a cliArgs) (lanefs.MkdirRequest, error) {
			return lanefs.MkdirRequest{Path: a.rest[0], Parents: a.f["parents"] != nil}, nil
		},
		func(res *lanefs.MkdirResponse, a cliArgs) string {
			if !res.Created {
				return a.rest[0] + " was there already\n"
			}
			return "made " + a.rest[0] + "\n"
		}),
}

// fileCommandOf is the command of `GROUP OP`: every operation in fs, those
// that change nothing in research.
func fileCommandOf(group, op string) (fileCommand, bool) {
	for _, fc := range fileCommands {
		if fc.op.Name == op && (group == "fs" || group == "research" && !fc.op.Changes) {
			return fc, true
		}
	}
	return fileCommand{}, false
}

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
	for _, fc := range fileCommands {
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
