package main

import (
	"bytes"
	"errors"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"thermite/internal/testrig"
)

// result is what an operator sees of one command.
type result struct {
	stdout, stderr string
	code           int
}

// light runs the built thermite-run-as as an operator types it, with the
// rig's configuration.
func light(t *testing.T, r *testrig.Rig, stdin []byte, args ...string) result {
	t.Helper()
	cmd := exec.Command(testrig.RunAsBinary(t), append([]string{"--config", r.Config}, args...)...)
	return runCmd(t, cmd, stdin)
}

func runCmd(t *testing.T, cmd *exec.Cmd, stdin []byte) result {
	t.Helper()
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	cmd.WaitDelay = 20 * time.Second
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	err := cmd.Run()
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("%s: %v", cmd.Path, err)
		}
		code = ee.ExitCode()
	}
	return result{o.String(), e.String(), code}
}

// both runs the same arguments through `thermite run-as` and
// thermite-run-as, checks the two show the operator the same thing (after
// norm, for what varies between runs), and returns the light client's.
func both(t *testing.T, r *testrig.Rig, stdin []byte, norm func(string) string, args ...string) result {
	t.Helper()
	o, e, c := r.ThermiteIn(stdin, append([]string{"run-as"}, args...)...)
	full := result{o, e, c}
	got := light(t, r, stdin, args...)
	if norm == nil {
		norm = func(s string) string { return s }
	}
	if full.code != got.code || norm(full.stdout) != norm(got.stdout) || norm(full.stderr) != norm(got.stderr) {
		t.Errorf("%q: thermite run-as gave %+v, thermite-run-as %+v", args, full, got)
	}
	return got
}

// oneLine checks a refusal is exactly one line on stderr, from run-as,
// with a non-zero exit status, and holds want.
func oneLine(t *testing.T, what string, got result, want string) {
	t.Helper()
	line := strings.TrimSuffix(got.stderr, "\n")
	if got.code == 0 || got.stdout != "" || strings.Contains(line, "\n") || !strings.HasPrefix(line, "thermite: run-as: ") || !strings.Contains(line, want) {
		t.Errorf("%s: exit %d, stdout %q, stderr %q; want one line with %q and a non-zero exit", what, got.code, got.stdout, got.stderr, want)
	}
}

// TestRunAsLightPassesStdioAndExitStatus: a lane's command reads the
// operator's stdin, writes both outputs, and its exit status is the
// client's, through either binary.
func TestRunAsLightPassesStdioAndExitStatus(t *testing.T) {
	r := testrig.New(t, testrig.Options{})
	got := both(t, r, []byte("hello\n"), nil, "lane-1", "--", "sh", "-c", `read x; echo "out $x"; echo "err $x" >&2; exit 3`)
	if got != (result{"out hello\n", "err hello\n", 3}) {
		t.Errorf("lane command: %+v; want stdout \"out hello\", stderr \"err hello\", exit 3", got)
	}
	got = both(t, r, nil, nil, "--env", "GREETING=hi there", "lane-1", "--cwd", r.Cfg.ScratchDir()+"/home/lane-1", "--", "sh", "-c", `echo "$GREETING"; pwd`)
	if want := "hi there\n" + r.Cfg.ScratchDir() + "/home/lane-1\n"; got.code != 0 || got.stdout != want {
		t.Errorf("flags before the role: %+v; want %q", got, want)
	}
}

// TestRunAsLightRunsAsTheRoleUser: the command runs as the role's user and
// group, not as the root operator who typed it.
func TestRunAsLightRunsAsTheRoleUser(t *testing.T) {
	r := testrig.New(t, testrig.Options{})
	lane := r.Role("lane-1")
	got := both(t, r, nil, nil, "lane-1", "--", "sh", "-c", "id -u; id -g")
	if want := strconv.Itoa(lane.UID) + "\n" + strconv.Itoa(lane.GID) + "\n"; got.code != 0 || got.stdout != want {
		t.Errorf("id -u; id -g as lane-1: %+v; want %q", got, want)
	}
}

// TestRunAsLightRefusesBadInputInOneLine: an unknown role, a flag that
// does not exist, a command line without -- and requests the broker
// refuses each end with one line naming what is wrong, a non-zero exit,
// and the same line from both binaries.
func TestRunAsLightRefusesBadInputInOneLine(t *testing.T) {
	r := testrig.New(t, testrig.Options{})
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"nobody-role", "--", "true"}, `role "nobody-role" is not in the role table`},
		{[]string{"--bogus", "lane-1", "--", "true"}, "unknown flag --bogus"},
		{[]string{"lane-1", "--processes", "many", "--", "true"}, `--processes: "many" is not a whole number`},
		{[]string{"lane-1", "--timeout", "soon", "--", "true"}, `--timeout: "soon" is not a duration`},
		{[]string{"lane-1", "true"}, "give the role, then -- and the command"},
		{[]string{"lane-1", "--"}, "give the role, then -- and the command"},
		{[]string{"lane-1", "--cwd", "/etc", "--", "true"}, "/etc: not inside"},
		{[]string{"lane-1", "--processes", "100000", "--", "true"}, "limits.processes: 100000 is above the rig's limit of 512"},
	} {
		oneLine(t, strings.Join(c.args, " "), both(t, r, nil, nil, c.args...), c.want)
	}
	// A command the broker cannot start: 127.
	got := both(t, r, nil, nil, "lane-1", "--", "no-such-program-here")
	oneLine(t, "missing program", got, "no-such-program-here")
	if got.code != 127 {
		t.Errorf("missing program: exit %d; want 127", got.code)
	}
}

// TestRunAsLightReportsTimeoutAndSignal: a command past its timeout exits
// 124 and one killed by a signal 128+N, each with the line saying so.
func TestRunAsLightReportsTimeoutAndSignal(t *testing.T) {
	r := testrig.New(t, testrig.Options{})
	wall := regexp.MustCompile(`after [0-9.]+m?s`)
	got := both(t, r, nil, func(s string) string { return wall.ReplaceAllString(s, "after D") }, "lane-1", "--timeout", "300ms", "--", "sleep", "30")
	oneLine(t, "timeout", got, "sleep: timed out after")
	if got.code != 124 {
		t.Errorf("timeout: exit %d; want 124", got.code)
	}
	got = both(t, r, nil, nil, "lane-1", "--", "sh", "-c", "kill -KILL $$")
	oneLine(t, "signal", got, "sh: SIGKILL (signaled)")
	if got.code != 137 {
		t.Errorf("signal: exit %d; want 137", got.code)
	}
}

// TestRunAsLightRefusesANonRootCaller: a role's user that runs the client
// is refused before anything reaches the broker.
func TestRunAsLightRefusesANonRootCaller(t *testing.T) {
	r := testrig.New(t, testrig.Options{})
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("needs setpriv (util-linux)")
	}
	uid := strconv.Itoa(r.Role("lane-1").UID)
	cmd := exec.Command("setpriv", "--reuid", uid, "--regid", uid, "--clear-groups", testrig.RunAsBinary(t), "--config", r.Config, "lane-1", "--", "true")
	oneLine(t, "as lane-1", runCmd(t, cmd, nil), "must run as root")
}
