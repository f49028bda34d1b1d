// Package runas is `thermite run-as`: one command run as a role through the
// broker, its stdio passed as descriptors, its exit status the command's.
// Both `thermite run-as` and the light client thermite-run-as run Main, so
// the two cannot drift. It links only what the client needs (the RPC
// protocol, x/sys/unix): an operator's command pays for no package it does
// not use (TestRunAsLightStaysLight).
package runas

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/rpc"
	"thermite/internal/statedir"
	"thermite/internal/termsafe"
)

// Usage is the command's help.
const Usage = `thermite run-as ROLE [flags] -- CMD [ARGS...]
thermite-run-as ROLE [flags] -- CMD [ARGS...]

Run one command as a role through the broker, stream its output, and exit
with its code (root). A refusal is one line on stderr and exit status 1; a
command the broker could not start exits 127, one past its timeout 124, one
ended by a signal 128+N.

  --config PATH            the rig's TOML configuration (default /etc/thermite/rig.toml when present)
  --cpus LIST              CPU list the command may run on (default: the role's)
  --timeout DURATION       wall-clock limit, e.g. 30s (default: the rig's)
  --cwd DIR                working folder inside scratch (default: the role's home)
  --env NAME=value         for the command's environment (repeatable)
  --gpus N[,N...]          card indexes the command may open (repeatable)
  --processes N            process limit (RLIMIT_NPROC, counts every task of the user)
  --open-files N           open file limit
  --address-space-mb N     address space limit in MiB
  --file-size-mb N         file size limit in MiB
  --cpu-seconds N          CPU time limit in seconds
  --json                   print the broker's result as JSON on stderr
`

// Invocation is a parsed command line.
type Invocation struct {
	Config  string // --config; "" is the default lookup
	Role    string
	Argv    []string
	Env     []string
	Cwd     string
	CPUs    string
	GPUs    []int
	Timeout time.Duration
	Limits  rpc.Limits
	JSON    bool
	Help    bool
}

// errShape is the refusal of a command line without ROLE -- CMD.
var errShape = errors.New("give the role, then -- and the command")

// Parse reads a command line (without the program's name and without
// "run-as"): flags and the role in any order before "--", the command
// after it. Flags take their value as --name=value or --name value.
func Parse(args []string) (*Invocation, error) {
	inv := &Invocation{}
	var pos []string
	dash := false
	for len(args) > 0 {
		a := args[0]
		args = args[1:]
		if a == "--" {
			inv.Argv = args
			dash = true
			break
		}
		if a == "-h" || a == "--help" {
			inv.Help = true
			return inv, nil
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			pos = append(pos, a)
			continue
		}
		name, val, has := strings.Cut(a, "=")
		if name == "--json" {
			if !has {
				val = "true"
			}
			b, err := strconv.ParseBool(val)
			if err != nil {
				return nil, fmt.Errorf("--json: %q is not true or false", val)
			}
			inv.JSON = b
			continue
		}
		set, ok := inv.setter(name)
		if !ok {
			return nil, fmt.Errorf("unknown flag %s; see thermite run-as --help", name)
		}
		if !has {
			if len(args) == 0 {
				return nil, fmt.Errorf("%s needs a value", name)
			}
			val, args = args[0], args[1:]
		}
		if err := set(val); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	if !dash || len(pos) != 1 || len(inv.Argv) == 0 {
		return nil, errShape
	}
	inv.Role = pos[0]
	return inv, nil
}

// setter is the flag's parser, which stores its value.
func (inv *Invocation) setter(name string) (func(string) error, bool) {
	str := func(p *string) func(string) error { return func(v string) error { *p = v; return nil } }
	integer := func(p *int) func(string) error {
		return func(v string) error {
			n, err := strconv.Atoi(v)
			if err != nil {
				return fmt.Errorf("%q is not a whole number", v)
			}
			*p = n
			return nil
		}
	}
	int64ish := func(p *int64) func(string) error {
		return func(v string) error {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return fmt.Errorf("%q is not a whole number", v)
			}
			*p = n
			return nil
		}
	}
	lim := &inv.Limits
	switch name {
	case "--config":
		return str(&inv.Config), true
	case "--cpus":
		return str(&inv.CPUs), true
	case "--cwd":
		return str(&inv.Cwd), true
	case "--env":
		return func(v string) error { inv.Env = append(inv.Env, v); return nil }, true
	case "--timeout":
		return func(v string) error {
			d, err := time.ParseDuration(v)
			if err != nil {
				return fmt.Errorf("%q is not a duration such as 30s or 5m", v)
			}
			inv.Timeout = d
			return nil
		}, true
	case "--gpus":
		return func(v string) error {
			for _, s := range strings.Split(v, ",") {
				n, err := strconv.Atoi(strings.TrimSpace(s))
				if err != nil {
					return fmt.Errorf("%q is not a card index", s)
				}
				inv.GPUs = append(inv.GPUs, n)
			}
			return nil
		}, true
	case "--processes":
		return integer(&lim.Processes), true
	case "--open-files":
		return integer(&lim.OpenFiles), true
	case "--cpu-seconds":
		return integer(&lim.CPUSeconds), true
	case "--address-space-mb":
		return int64ish(&lim.AddressSpaceMB), true
	case "--file-size-mb":
		return int64ish(&lim.FileSizeMB), true
	}
	return nil, false
}

// Request is the broker call an invocation makes: the one place a run-as
// command line becomes a request.
func Request(inv *Invocation) *rpc.Request {
	lim := inv.Limits
	lim.TimeoutMS = inv.Timeout.Milliseconds()
	return &rpc.Request{Op: rpc.OpRun, Run: &rpc.RunRequest{
		Role: inv.Role, Argv: inv.Argv, Env: inv.Env, Cwd: inv.Cwd, CPUs: inv.CPUs, GPUs: inv.GPUs, Limits: lim,
	}}
}

// Outcome is the exit status a broker's answer gives the command, and the
// line to print ("" for none): the command's own status when it exited,
// 124 past its timeout, 128+N for signal N, 127 when the broker could not
// start it, 1 when the broker refused the request.
func Outcome(argv0 string, resp *rpc.Response, err error) (int, string) {
	if err != nil {
		if resp != nil && resp.Run != nil {
			return 127, err.Error()
		}
		return 1, err.Error()
	}
	r := resp.Run
	switch {
	case r == nil:
		return 1, "the broker's answer has no result"
	case r.Stopped == rpc.StoppedTimeout:
		return 124, fmt.Sprintf("%s: timed out after %s", argv0, time.Duration(r.WallNS).Round(time.Millisecond))
	case r.ExitCode >= 0:
		return r.ExitCode, ""
	default:
		return 128 + r.Signal, fmt.Sprintf("%s: %s (%s)", argv0, SignalName(r.Signal), r.Stopped)
	}
}

// dialBroker connects to the broker's socket and checks that root holds
// the other end: the client hands it root's stdin, stdout and stderr, which
// must never reach a socket some role put at that path.
func dialBroker(path string) (*rpc.Conn, error) {
	c, err := rpc.Dial(path)
	if err != nil {
		return nil, err
	}
	cred, err := c.PeerCred()
	if err == nil && cred.Uid != 0 {
		err = fmt.Errorf("broker socket %s: held by uid %d, not root", path, cred.Uid)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// SignalName is the name of signal s, as a command's end is reported.
func SignalName(s int) string {
	if n := unix.SignalName(syscall.Signal(s)); n != "" {
		return n
	}
	return fmt.Sprintf("signal %d", s)
}

// Main runs the command with args (what follows "run-as", or the light
// client's name) and returns its exit status. The command gets this
// process's descriptors 0, 1 and 2 themselves; stdout and stderr here are
// for the help, --json and the refusals, which are one line each, escaped
// for the terminal.
func Main(args []string, stdout, stderr io.Writer) int {
	fail := func(code int, msg string) int {
		if msg != "" {
			fmt.Fprintln(stderr, "thermite: run-as: "+termsafe.Escape(msg))
		}
		return code
	}
	inv, err := Parse(args)
	if err != nil {
		return fail(1, err.Error())
	}
	if inv.Help {
		io.WriteString(stdout, Usage)
		return 0
	}
	if os.Geteuid() != 0 {
		return fail(1, "must run as root")
	}
	dir, err := statedir.Lookup(inv.Config)
	if err != nil {
		return fail(1, err.Error())
	}
	c, err := dialBroker(statedir.BrokerSocket(dir))
	if err != nil {
		return fail(1, err.Error())
	}
	defer c.Close()
	fds, finish, err := relayTerminals()
	if err != nil {
		return fail(1, err.Error())
	}
	resp, err := c.Call(Request(inv), fds[0], fds[1], fds[2])
	finish()
	if inv.JSON && resp != nil && resp.Run != nil {
		json.NewEncoder(stderr).Encode(resp.Run)
	}
	return fail(Outcome(inv.Argv[0], resp, err))
}

// relayTerminals gives the command a pipe for each of descriptors 0, 1 and
// 2 that is a terminal, and copies between the two while it runs: a
// terminal is never the role's. A process the command leaves behind, in a
// session of its own, could otherwise read the operator's terminal after
// the command ended, getting what is typed at root's shell (a password),
// or change its settings; TIOCSTI is refused in every role's filter, but
// reading needs no ioctl. Descriptors that are not terminals (files,
// pipes) are passed themselves. finish, once the command has ended,
// copies what it wrote, up to relayGrace of silence when something of
// the role keeps the pipe open, and stops reading the terminal.
func relayTerminals() (fds [3]int, finish func(), err error) {
	fds = [3]int{0, 1, 2}
	var passed []*os.File // the command's ends, closed here once it is started
	var outs []*os.File
	var done []chan struct{}
	var stdinW *os.File
	for fd := 0; fd < 3; fd++ {
		if _, err := unix.IoctlGetTermios(fd, unix.TCGETS); err != nil {
			continue // not a terminal: passed itself
		}
		r, w, err := os.Pipe()
		if err != nil {
			for _, f := range append(passed, outs...) {
				f.Close()
			}
			return fds, nil, fmt.Errorf("a pipe for descriptor %d, a terminal, which the command must not hold: %w", fd, err)
		}
		if fd == 0 {
			stdinW = w
			go func() {
				io.Copy(w, os.Stdin)
				w.Close() // the command reads the end of input
			}()
			passed, fds[0] = append(passed, r), int(r.Fd())
			continue
		}
		term := os.NewFile(uintptr(fd), "terminal")
		ch := make(chan struct{})
		go func() {
			io.Copy(term, r)
			close(ch)
		}()
		passed, fds[fd] = append(passed, w), int(w.Fd())
		outs, done = append(outs, r), append(done, ch)
	}
	finish = func() {
		for _, f := range passed {
			f.Close()
		}
		for i, r := range outs {
			r.SetReadDeadline(time.Now().Add(relayGrace))
			<-done[i]
			r.Close()
		}
		if stdinW != nil {
			stdinW.Close()
		}
	}
	return fds, finish, nil
}

// relayGrace is how long the relay waits, after the command ended, for the
// end of its output while something of the role still holds the pipe.
const relayGrace = 200 * time.Millisecond
