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

	"thermite/internal/apiwire"
	"thermite/internal/lanefs"
)

// Usage is thermite-trial's help; the file commands' lines are made from
// their table (fileOps).
var Usage = `thermite-trial: the trial's tools, through the harness API with its token

  thermite-trial [--json] [--socket PATH | --url URL] [--token-file PATH] COMMAND ...

  trial                                  the trial: id, lane, workspace, research folder
  step KIND [TEXT|-]                     record a step of the work (TEXT or stdin)
  research fetch URL                     fetch a public page into the research folder
  research note [--title T] [BODY|-]     write a note every lane of the run can read
  research search PATTERN [--glob G] [--max N]
` + fileUsage("research") + fileUsage("fs") + `  exec [--timeout D] [--cwd DIR] [--stdin] [--env K=V]... -- CMD [ARG...]
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
		var info apiwire.TrialInfo
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
		var res apiwire.StepResult
		if err := c.Do(ctx, "POST", "/v1/steps", apiwire.StepRequest{Kind: rest[0], Text: text}, &res); err != nil {
			return nil, "", err
		}
		return res, fmt.Sprintf("recorded %d bytes\n", res.Recorded), nil
	case "research fetch":
		if err := check(name, f, rest, 1, 1); err != nil {
			return nil, "", err
		}
		var res apiwire.FetchResult
		if err := c.Do(ctx, "POST", "/v1/fetch", apiwire.FetchRequest{URL: rest[0]}, &res); err != nil {
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
		var res apiwire.NoteResult
		if err := c.Do(ctx, "POST", "/v1/research/note", apiwire.NoteRequest{Title: last(f, "title"), Body: body}, &res); err != nil {
			return nil, "", err
		}
		return res, res.Path + "\n", nil
	case "research search":
		if err := check(name, f, rest, 1, 1, "glob", "max"); err != nil {
			return nil, "", err
		}
		max, err := intFlag(f, "max")
		if err != nil {
			return nil, "", err
		}
		var res lanefs.GrepResponse
		if err := c.Do(ctx, "POST", "/v1/research/search", lanefs.GrepRequest{Pattern: rest[0], Glob: last(f, "glob"), MaxMatches: int(max)}, &res); err != nil {
			return nil, "", err
		}
		return res, grepText(&res), nil
	}
	if fc, ok := fileCommandOf(group, sub); ok {
		if err := check(name, f, rest, fc.min, fc.max, fc.flags...); err != nil {
			return nil, "", err
		}
		return fc.run(ctx, c, group, cliArgs{f: f, rest: rest, stdin: stdin})
	}
	return nil, "", fmt.Errorf("no command %q; see thermite-trial --help", name)
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
	req := apiwire.ExecRequest{Argv: rest, TimeoutMS: ms, Cwd: last(f, "cwd"), Env: f["env"]}
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
			var fr apiwire.ExecFrame
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
