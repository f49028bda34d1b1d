package runas

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"thermite/internal/rpc"
)

// TestParseTakesTheFlagsRunAsAlwaysTook: every flag, as --name value and
// --name=value, before or after the role, repeatable where it adds, and
// what follows -- untouched, flags included.
func TestParseTakesTheFlagsRunAsAlwaysTook(t *testing.T) {
	inv, err := Parse([]string{
		"--config", "/etc/rig.toml", "--cpus=2-3", "lane-1", "--timeout", "1m30s", "--cwd", "/srv/x",
		"--env", "A=1", "--env=B=2,3", "--gpus", "0,1", "--gpus=3", "--processes", "64", "--open-files=256",
		"--address-space-mb", "1024", "--file-size-mb=16", "--cpu-seconds", "5", "--json",
		"--", "sh", "-c", "echo --json", "--cpus", "9",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := &Invocation{
		Config: "/etc/rig.toml", Role: "lane-1", Argv: []string{"sh", "-c", "echo --json", "--cpus", "9"},
		Env: []string{"A=1", "B=2,3"}, Cwd: "/srv/x", CPUs: "2-3", GPUs: []int{0, 1, 3}, Timeout: 90 * time.Second,
		Limits: rpc.Limits{Processes: 64, OpenFiles: 256, AddressSpaceMB: 1024, FileSizeMB: 16, CPUSeconds: 5}, JSON: true,
	}
	if !reflect.DeepEqual(inv, want) {
		t.Fatalf("Parse:\n%+v\nwant\n%+v", inv, want)
	}
	req := Request(inv)
	if req.Op != rpc.OpRun || req.Run.Limits.TimeoutMS != 90000 || req.Run.Role != "lane-1" || !reflect.DeepEqual(req.Run.GPUs, []int{0, 1, 3}) || inv.Limits.TimeoutMS != 0 {
		t.Errorf("Request: %+v %+v", req, req.Run)
	}
}

// TestParseRefusesAMalformedCommandLine: no role, two roles, no --, no
// command, an unknown flag, a flag without its value or with a bad one:
// each is one line saying what is wrong.
func TestParseRefusesAMalformedCommandLine(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--", "true"}, errShape.Error()},
		{[]string{"a", "b", "--", "true"}, errShape.Error()},
		{[]string{"lane-1", "true"}, errShape.Error()},
		{[]string{"lane-1", "--"}, errShape.Error()},
		{[]string{"-x", "lane-1", "--", "true"}, "unknown flag -x"},
		{[]string{"lane-1", "--cpu", "1", "--", "true"}, "unknown flag --cpu"},
		{[]string{"lane-1", "--cwd"}, "--cwd needs a value"},
		{[]string{"lane-1", "--gpus", "0,x", "--", "true"}, `--gpus: "x" is not a card index`},
		{[]string{"lane-1", "--open-files", "1e3", "--", "true"}, `--open-files: "1e3" is not a whole number`},
		{[]string{"lane-1", "--file-size-mb=", "--", "true"}, `--file-size-mb: "" is not a whole number`},
		{[]string{"lane-1", "--json=maybe", "--", "true"}, `--json: "maybe" is not true or false`},
	} {
		_, err := Parse(c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: %v; want %q", c.args, err, c.want)
		}
	}
	if inv, err := Parse([]string{"--help"}); err != nil || !inv.Help {
		t.Errorf("--help: %+v %v", inv, err)
	}
}

// TestOutcomeIsTheCommandsExitStatus: the command's own code, 124 past
// its timeout, 128+N for a signal, 127 when it could not start, 1 for a
// refused request.
func TestOutcomeIsTheCommandsExitStatus(t *testing.T) {
	for _, c := range []struct {
		resp *rpc.Response
		err  error
		code int
		line string
	}{
		{&rpc.Response{Run: &rpc.RunResult{ExitCode: 0, Stopped: rpc.StoppedExited}}, nil, 0, ""},
		{&rpc.Response{Run: &rpc.RunResult{ExitCode: 3, Stopped: rpc.StoppedExited}}, nil, 3, ""},
		{&rpc.Response{Run: &rpc.RunResult{ExitCode: -1, Signal: 9, Stopped: rpc.StoppedTimeout, WallNS: 300_400_000}}, nil, 124, "sleep: timed out after 300ms"},
		{&rpc.Response{Run: &rpc.RunResult{ExitCode: -1, Signal: 9, Stopped: rpc.StoppedSignaled}}, nil, 137, "sleep: SIGKILL (signaled)"},
		{&rpc.Response{Run: &rpc.RunResult{ExitCode: -1, Signal: 24, Stopped: rpc.StoppedLimitCPU}}, nil, 152, "sleep: SIGXCPU (limit:cpu)"},
		{&rpc.Response{Run: &rpc.RunResult{ExitCode: -1}}, errors.New("sleep: not found"), 127, "sleep: not found"},
		{&rpc.Response{}, errors.New(`role "x" is not in the role table`), 1, `role "x" is not in the role table`},
		{nil, errors.New("broker socket /s: connect: no such file or directory"), 1, "broker socket /s: connect: no such file or directory"},
	} {
		code, line := Outcome("sleep", c.resp, c.err)
		if code != c.code || line != c.line {
			t.Errorf("%+v %v: %d %q; want %d %q", c.resp, c.err, code, line, c.code, c.line)
		}
	}
}
