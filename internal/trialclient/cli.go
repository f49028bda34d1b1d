package trialclient

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"thermite/controller"
	"thermite/internal/lanefs"
)

// Usage is thermite-trial's help.
const Usage = `thermite-trial: the trial's tools, through the harness API with its token

  thermite-trial [--json] [--socket PATH | --url URL] [--token-file PATH] COMMAND ...

  trial                                  the trial: id, lane, workspace, research folder
  step KIND [TEXT|-]                     record a step of the work (TEXT or stdin)
  research fetch URL                     fetch a public page into the research folder
  research note [--title T] [BODY|-]     write a note every lane of the run can read
  research search PATTERN [--glob G] [--max N]
  research grep PATTERN [PATH] [--glob G] [--max N]
  research read PATH [--offset N] [--limit N]
  research list [PATH]
  fs read PATH [--offset N] [--limit N]  a file of the workspace, to stdout
  fs write PATH [--parents] [--mode 0644] < DATA
  fs edit PATH OLD NEW                   replace the one place OLD occurs
  fs list [PATH]
  fs grep PATTERN [PATH] [--glob G] [--max N]
  fs find [PATH] [--glob G] [--max N]
  fs stat PATH
  fs delete PATH [--recursive]
  fs mkdir PATH [--parents]
  exec [--timeout D] [--cwd DIR] [--stdin] [--env K=V]... -- CMD [ARG...]
                                         run as the lane in the workspace; exits with its code
  mcp                                    serve these tools over stdio (Model Context Protocol)

It finds its trial from THERMITE_API_SOCKET (or THERMITE_API_URL) and
THERMITE_TOKEN (or THERMITE_TOKEN_FILE), which thermite sets for a trial's
agent; the flags stand for them, and $HOME/trial.json and $HOME/token (an
agent's folder) are read when neither is given. A refusal is one line on
stderr and exit status 1.
`

// Main runs thermite-trial with args (without the program's name) and
// returns its exit status.
func Main(args []string) int {
	return run(args, os.Getenv, os.Stdin, os.Stdout, os.Stderr)
}

func run(args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintln(stderr, "thermite-trial: "+oneLine(err.Error()))
		return 1
	}
	asJSON := false
	// --socket, --url and --token-file stand for the variables, for an
	// agent program that passes its MCP servers no environment.
	given := map[string]string{}
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		name, val, has := strings.Cut(args[0], "=")
		env := map[string]string{"--socket": EnvSocket, "--url": EnvURL, "--token-file": EnvTokenFile}[name]
		switch {
		case args[0] == "--json":
			asJSON = true
		case args[0] == "-h" || args[0] == "--help":
			io.WriteString(stdout, Usage)
			return 0
		case env != "" && has:
			given[env] = val
		case env != "" && len(args) > 1:
			given[env] = args[1]
			args = args[1:]
		default:
			return fail(fmt.Errorf("unknown flag %s; see thermite-trial --help", args[0]))
		}
		args = args[1:]
	}
	if len(given) > 0 {
		outer := getenv
		getenv = func(k string) string {
			if v, ok := given[k]; ok {
				return v
			}
			if k == EnvToken && given[EnvTokenFile] != "" {
				return ""
			}
			return outer(k)
		}
	}
	if len(args) == 0 || args[0] == "help" {
		io.WriteString(stderr, Usage)
		return 2
	}
	c, err := FromEnv(getenv)
	if err != nil {
		return fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if args[0] == "mcp" {
		if len(args) != 1 {
			return fail(fmt.Errorf("mcp takes no arguments"))
		}
		if err := ServeMCP(ctx, c); err != nil {
			return fail(err)
		}
		return 0
	}
	if args[0] == "exec" {
		return execCmd(ctx, c, args[1:], stdin, stdout, stderr, asJSON, fail)
	}
	out, text, err := dispatch(ctx, c, args, stdin)
	if err != nil {
		return fail(err)
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(out)
		return 0
	}
	io.WriteString(stdout, text)
	return 0
}

// oneLine keeps a message on one line: a refusal is one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// flags splits args into flags (--name, --name=value or --name value for
// those in valued) and the rest, in order; "--" ends the flags.
func flags(args []string, valued ...string) (map[string][]string, []string, error) {
	f := map[string][]string{}
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return f, append(rest, args[i+1:]...), nil
		}
		if !strings.HasPrefix(a, "--") || a == "-" {
			rest = append(rest, a)
			continue
		}
		name, val, has := strings.Cut(a[2:], "=")
		isValued := false
		for _, v := range valued {
			isValued = isValued || v == name
		}
		switch {
		case isValued && !has && i+1 < len(args):
			i++
			val = args[i]
		case isValued && !has:
			return nil, nil, fmt.Errorf("--%s needs a value", name)
		case !isValued && has:
			return nil, nil, fmt.Errorf("--%s takes no value", name)
		}
		f[name] = append(f[name], val)
	}
	return f, rest, nil
}

func last(f map[string][]string, name string) string {
	if v := f[name]; len(v) > 0 {
		return v[len(v)-1]
	}
	return ""
}

func intFlag(f map[string][]string, name string) (int64, error) {
	s := last(f, name)
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 0, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("--%s %q: not a non-negative integer", name, s)
	}
	return n, nil
}

// check says what is wrong with a command's arguments: unknown flags and
// a count of positional arguments outside [min, max].
func check(cmd string, f map[string][]string, rest []string, min, max int, known ...string) error {
	for name := range f {
		ok := false
		for _, k := range known {
			ok = ok || k == name
		}
		if !ok {
			return fmt.Errorf("%s: unknown flag --%s", cmd, name)
		}
	}
	if len(rest) < min || len(rest) > max {
		return fmt.Errorf("%s: wrong number of arguments; see thermite-trial --help", cmd)
	}
	return nil
}

func arg(rest []string, i int) string {
	if i < len(rest) {
		return rest[i]
	}
	return ""
}

// textOrStdin is the argument, or stdin when it is "-" or absent.
func textOrStdin(rest []string, i int, stdin io.Reader) (string, error) {
	if i < len(rest) && rest[i] != "-" {
		return rest[i], nil
	}
	b, err := io.ReadAll(io.LimitReader(stdin, 64<<20))
	return string(b), err
}

// dispatch runs one command other than exec and mcp: the API's answer
// (for --json) and its plain text.
func dispatch(ctx context.Context, c *Client, args []string, stdin io.Reader) (any, string, error) {
	group := args[0]
	sub, rest0 := "", args[1:]
	if group == "research" || group == "fs" {
		if len(args) < 2 {
			return nil, "", fmt.Errorf("%s: which? see thermite-trial --help", group)
		}
		sub, rest0 = args[1], args[2:]
	}
	f, rest, err := flags(rest0, "title", "glob", "max", "offset", "limit", "mode")
	if err != nil {
		return nil, "", err
	}
	name := strings.TrimSpace(group + " " + sub)
	switch name {
	case "trial":
		if err := check(name, f, rest, 0, 0); err != nil {
			return nil, "", err
		}
		var info controller.TrialInfo
		if err := c.Do(ctx, "GET", "/v1/trial", nil, &info); err != nil {
			return nil, "", err
		}
		return info, fmt.Sprintf("trial      %s\nrun        %s\nlane       %d\nworkspace  %s\nresearch   %s\nlane area  %s\n", info.ID, info.Run, info.Lane, info.Workspace, info.ResearchDir, info.LaneArea), nil
	case "step":
		if err := check(name, f, rest, 1, 2); err != nil {
			return nil, "", err
		}
		text, err := textOrStdin(rest, 1, stdin)
		if err != nil {
			return nil, "", err
		}
		var res controller.StepResult
		if err := c.Do(ctx, "POST", "/v1/steps", controller.StepRequest{Kind: rest[0], Text: text}, &res); err != nil {
			return nil, "", err
		}
		return res, fmt.Sprintf("recorded %d bytes\n", res.Recorded), nil
	case "research fetch":
		if err := check(name, f, rest, 1, 1); err != nil {
			return nil, "", err
		}
		var res controller.FetchResult
		if err := c.Do(ctx, "POST", "/v1/fetch", controller.FetchRequest{URL: rest[0]}, &res); err != nil {
			return nil, "", err
		}
		return res, fmt.Sprintf("%s: %d, %d bytes of %s, in %s\n", res.URL, res.Status, res.Size, res.ContentType, res.Path), nil
	case "research note":
		if err := check(name, f, rest, 0, 1, "title"); err != nil {
			return nil, "", err
		}
		body, err := textOrStdin(rest, 0, stdin)
		if err != nil {
			return nil, "", err
		}
		var res controller.NoteResult
		if err := c.Do(ctx, "POST", "/v1/research/note", controller.NoteRequest{Title: last(f, "title"), Body: body}, &res); err != nil {
			return nil, "", err
		}
		return res, res.Path + "\n", nil
	case "research search":
		if err := check(name, f, rest, 1, 1, "glob", "max"); err != nil {
			return nil, "", err
		}
		return grep(ctx, c, "/v1/research/search", rest[0], "", f)
	case "research grep", "fs grep":
		if err := check(name, f, rest, 1, 2, "glob", "max"); err != nil {
			return nil, "", err
		}
		return grep(ctx, c, "/v1/"+group+"/grep", rest[0], arg(rest, 1), f)
	case "research read", "fs read":
		if err := check(name, f, rest, 1, 1, "offset", "limit"); err != nil {
			return nil, "", err
		}
		off, err := intFlag(f, "offset")
		if err != nil {
			return nil, "", err
		}
		lim, err := intFlag(f, "limit")
		if err != nil {
			return nil, "", err
		}
		var res lanefs.ReadResponse
		if err := c.Do(ctx, "POST", "/v1/"+group+"/read", lanefs.ReadRequest{Path: rest[0], Offset: off, Limit: lim}, &res); err != nil {
			return nil, "", err
		}
		return res, string(res.Data), nil
	case "research list", "fs list":
		if err := check(name, f, rest, 0, 1); err != nil {
			return nil, "", err
		}
		var res lanefs.ListResponse
		if err := c.Do(ctx, "POST", "/v1/"+group+"/list", lanefs.ListRequest{Path: arg(rest, 0)}, &res); err != nil {
			return nil, "", err
		}
		var b strings.Builder
		for _, e := range res.Entries {
			fmt.Fprintf(&b, "%-7s %10d  %s\n", e.Type, e.Size, e.Name)
		}
		if res.Truncated {
			b.WriteString("(more entries left out)\n")
		}
		return res, b.String(), nil
	case "research find", "fs find":
		if err := check(name, f, rest, 0, 1, "glob", "max"); err != nil {
			return nil, "", err
		}
		max, err := intFlag(f, "max")
		if err != nil {
			return nil, "", err
		}
		var res lanefs.FindResponse
		if err := c.Do(ctx, "POST", "/v1/"+group+"/find", lanefs.FindRequest{Path: arg(rest, 0), Glob: last(f, "glob"), Max: int(max)}, &res); err != nil {
			return nil, "", err
		}
		text := strings.Join(res.Paths, "\n")
		if text != "" {
			text += "\n"
		}
		return res, text, nil
	case "research stat", "fs stat":
		if err := check(name, f, rest, 1, 1); err != nil {
			return nil, "", err
		}
		var res lanefs.StatResponse
		if err := c.Do(ctx, "POST", "/v1/"+group+"/stat", lanefs.StatRequest{Path: rest[0]}, &res); err != nil {
			return nil, "", err
		}
		return res, fmt.Sprintf("%s %d bytes, mode %04o, modified %s\n", res.Type, res.Size, res.Mode, res.MTime.UTC().Format(time.RFC3339)), nil
	case "fs write":
		if err := check(name, f, rest, 1, 1, "parents", "mode"); err != nil {
			return nil, "", err
		}
		mode, err := intFlag(f, "mode")
		if err != nil {
			return nil, "", err
		}
		data, err := io.ReadAll(io.LimitReader(stdin, 256<<20))
		if err != nil {
			return nil, "", err
		}
		var res lanefs.WriteResponse
		if err := c.Do(ctx, "POST", "/v1/fs/write", lanefs.WriteRequest{Path: rest[0], Data: data, Mode: uint32(mode), CreateParents: f["parents"] != nil}, &res); err != nil {
			return nil, "", err
		}
		return res, fmt.Sprintf("wrote %d bytes to %s\n", res.Size, rest[0]), nil
	case "fs edit":
		if err := check(name, f, rest, 3, 3); err != nil {
			return nil, "", err
		}
		var res lanefs.EditResponse
		if err := c.Do(ctx, "POST", "/v1/fs/edit", lanefs.EditRequest{Path: rest[0], Old: rest[1], New: rest[2]}, &res); err != nil {
			return nil, "", err
		}
		return res, fmt.Sprintf("edited %s (%d bytes now)\n", rest[0], res.Size), nil
	case "fs delete":
		if err := check(name, f, rest, 1, 1, "recursive"); err != nil {
			return nil, "", err
		}
		var res lanefs.DeleteResponse
		if err := c.Do(ctx, "POST", "/v1/fs/delete", lanefs.DeleteRequest{Path: rest[0], Recursive: f["recursive"] != nil}, &res); err != nil {
			return nil, "", err
		}
		return res, fmt.Sprintf("removed %d\n", res.Removed), nil
	case "fs mkdir":
		if err := check(name, f, rest, 1, 1, "parents"); err != nil {
			return nil, "", err
		}
		var res lanefs.MkdirResponse
		if err := c.Do(ctx, "POST", "/v1/fs/mkdir", lanefs.MkdirRequest{Path: rest[0], Parents: f["parents"] != nil}, &res); err != nil {
			return nil, "", err
		}
		if !res.Created {
			return res, rest[0] + " was there already\n", nil
		}
		return res, "made " + rest[0] + "\n", nil
	}
	return nil, "", fmt.Errorf("no command %q; see thermite-trial --help", name)
}

func grep(ctx context.Context, c *Client, route, pattern, path string, f map[string][]string) (any, string, error) {
	max, err := intFlag(f, "max")
	if err != nil {
		return nil, "", err
	}
	var res lanefs.GrepResponse
	if err := c.Do(ctx, "POST", route, lanefs.GrepRequest{Pattern: pattern, Path: path, Glob: last(f, "glob"), MaxMatches: int(max)}, &res); err != nil {
		return nil, "", err
	}
	var b strings.Builder
	for _, m := range res.Matches {
		fmt.Fprintf(&b, "%s:%d:%s\n", m.Path, m.LineNo, m.Line)
	}
	if res.Truncated {
		b.WriteString("(more matches left out)\n")
	}
	return res, b.String(), nil
}

// execCmd runs a command as the lane: its output as it comes (or, with
// --json, the frames), and the command's own exit status.
func execCmd(ctx context.Context, c *Client, args []string, stdin io.Reader, stdout, stderr io.Writer, asJSON bool, fail func(error) int) int {
	f, rest, err := flags(args, "timeout", "cwd", "env")
	if err != nil {
		return fail(err)
	}
	if err := check("exec", f, rest, 1, 1<<20, "timeout", "cwd", "env", "stdin"); err != nil {
		return fail(err)
	}
	ms, err := timeoutMS(last(f, "timeout"))
	if err != nil {
		return fail(err)
	}
	req := controller.ExecRequest{Argv: rest, TimeoutMS: ms, Cwd: last(f, "cwd"), Env: f["env"]}
	if f["stdin"] != nil {
		b, err := io.ReadAll(io.LimitReader(stdin, 16<<20))
		if err != nil {
			return fail(err)
		}
		req.StdinB64 = b
	}
	if asJSON {
		resp, err := c.send(ctx, "POST", "/v1/exec", req)
		if err != nil {
			return fail(err)
		}
		defer resp.Body.Close()
		// The frames as they come, one a line; the status is the command's.
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 8<<20)
		for sc.Scan() {
			stdout.Write(append(sc.Bytes(), '\n'))
			var fr controller.ExecFrame
			if json.Unmarshal(sc.Bytes(), &fr) == nil && fr.Done {
				return ExitCode(fr)
			}
		}
		return fail(errors.New("exec: the answer ended before the command did"))
	}
	last, err := c.Exec(ctx, req, stdout, stderr)
	if err != nil {
		return fail(err)
	}
	if last.Truncated {
		fmt.Fprintf(stderr, "thermite-trial: output cut at %d of %d bytes\n", last.OutputCap, last.OutputBytes)
	}
	code := ExitCode(last)
	switch {
	case code == 127 && last.Error != "":
		fmt.Fprintln(stderr, "thermite-trial: exec: "+oneLine(last.Error))
	case last.Stopped == "timeout":
		fmt.Fprintf(stderr, "thermite-trial: exec: timed out after %d ms\n", last.WallMS)
	}
	return code
}
