package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"thermite/controller"
	"thermite/controller/ledger"
	"thermite/internal/config"
	"thermite/internal/confined"
	"thermite/internal/copytree"
	"thermite/internal/rpc"
	"thermite/internal/runas"
	"thermite/internal/termsafe"
	"thermite/roles"
)

// ctlClient speaks to the controller's operator socket.
func ctlClient(cfg config.Config) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", cfg.ControllerSocket())
	}}}
}

// ctlUnreachable says why the controller could not be reached, with the
// rig's phase when the broker answers: a rig still in its self-test, or
// one whose start was refused, says so instead of a bare dial error.
func ctlUnreachable(cfg config.Config, err error) error {
	resp, serr := rpc.Call(cfg.BrokerSocket(), &rpc.Request{Op: rpc.OpStatus})
	if serr != nil {
		return fmt.Errorf("the rig is not running (no broker answers on %s): %w", cfg.BrokerSocket(), err)
	}
	return fmt.Errorf("the controller does not answer on %s; the rig is %s (thermite status --wait waits for it): %w", cfg.ControllerSocket(), phaseLine(resp.Status), err)
}

// ctlCall posts (or gets, when body is nil) and decodes a JSON answer; a
// non-200 answer is an error carrying the controller's one line.
func ctlCall(cfg config.Config, method, path string, body, out any) error {
	return ctlCallWithin(cfg, 0, method, path, body, out)
}

// ctlCallWithin is ctlCall, given up after limit (0: none): status must
// answer even when the controller stops answering between the broker's
// ping and this call.
func ctlCallWithin(cfg config.Config, limit time.Duration, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, "http://controller"+path, rd)
	client := ctlClient(cfg)
	client.Timeout = limit
	resp, err := client.Do(req)
	if err != nil {
		return ctlUnreachable(cfg, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s", problemDetail(resp.Body))
	}
	if out == nil {
		_, err = io.Copy(os.Stdout, resp.Body)
		return err
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// ctlStream posts an exec and copies its output frames to stdout and
// stderr; it exits the way the command did.
func ctlStream(cfg config.Config, path string, body any, what string) error {
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", "http://controller"+path, bytes.NewReader(b))
	resp, err := ctlClient(cfg).Do(req)
	if err != nil {
		return ctlUnreachable(cfg, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s: %s", what, problemDetail(resp.Body))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 8<<20)
	for sc.Scan() {
		var f controller.ExecFrame
		if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
			return fmt.Errorf("%s: bad frame: %w", what, err)
		}
		switch {
		case f.Stream == "stdout":
			os.Stdout.WriteString(f.Data)
			os.Stdout.Write(f.DataB64)
		case f.Stream == "stderr":
			os.Stderr.WriteString(f.Data)
			os.Stderr.Write(f.DataB64)
		case f.Done:
			if f.Truncated {
				fmt.Fprintf(os.Stderr, "thermite: %s: output truncated at %d of %d bytes\n", what, f.OutputCap, f.OutputBytes)
			}
			switch {
			case f.Error != "" && f.ExitCode == -1 && f.Signal == 0:
				return &exitError{code: 127, msg: what + ": " + f.Error}
			case f.Stopped == "timeout":
				return &exitError{code: 124, msg: fmt.Sprintf("%s: timed out after %d ms", what, f.WallMS)}
			case f.Signal != 0:
				return &exitError{code: 128 + f.Signal, msg: fmt.Sprintf("%s: %s (%s)", what, runas.SignalName(f.Signal), f.Stopped)}
			case f.ExitCode != 0 && f.Stopped != "" && f.Stopped != "exited":
				return &exitError{code: f.ExitCode, msg: fmt.Sprintf("%s: exit %d (%s)", what, f.ExitCode, f.Stopped)}
			case f.ExitCode != 0:
				return &exitError{code: f.ExitCode}
			}
			return nil
		}
	}
	return fmt.Errorf("%s: the controller's answer ended early", what)
}

// importProject copies an operator's project into the controller's own
// folder, where no role can open it. owner owns every entry; the top
// folder is the controller's, so that the controller can move a trial's
// import into place as its workspace (the one copy a trial's start makes).
// The copy runs as root: the controller's folder is opened without
// following a symlink, and the copy is made through its descriptor.
func importProject(cfg config.Config, t *roles.Table, src string, owner roles.Role) (string, error) {
	st, err := os.Stat(src)
	if err != nil || !st.IsDir() {
		return "", fmt.Errorf("project %s: not a folder", src)
	}
	ctl := t.Controller()
	dir := filepath.Join(cfg.ControllerDir(), "projects")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	os.Chown(dir, ctl.UID, ctl.GID)
	parent, err := confined.Open(cfg.StateDir, dir, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return "", fmt.Errorf("project import: %w", err)
	}
	defer parent.Close()
	name := time.Now().UTC().Format("20060102T150405") + "-" + randomHex(6)
	dst := filepath.Join(dir, name)
	// Where the kernel does not stop users hard-linking files they cannot
	// read (fs.protected_hardlinks 0), a tree a role wrote could hold a link
	// to a root-only file: this copy runs as root, so it refuses them.
	protected, _ := os.ReadFile("/proc/sys/fs/protected_hardlinks")
	refuse := strings.TrimSpace(string(protected)) != "1"
	o := copytree.Options{UID: owner.UID, GID: owner.GID, TopOwned: true, TopUID: ctl.UID, TopGID: ctl.GID, RefuseLinks: refuse}
	stop := copyProgress(&o, src)
	_, err = copytree.CopyAt(src, parent, name, o)
	stop()
	if err != nil {
		os.RemoveAll(dst)
		return "", err
	}
	return dst, nil
}

// copyProgress shows a long copy's progress on the operator's terminal:
// a line on stderr every second, once the copy has taken a second.
func copyProgress(o *copytree.Options, src string) (stop func()) {
	if _, err := unix.IoctlGetTermios(int(os.Stderr.Fd()), unix.TCGETS); err != nil {
		return func() {}
	}
	var files atomic.Int64
	var bytes atomic.Int64
	o.Progress = func(f int, b int64) { files.Store(int64(f)); bytes.Store(b) }
	done := make(chan struct{})
	finished := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		shown := false
		for {
			select {
			case <-done:
				if shown {
					fmt.Fprintf(os.Stderr, "\rcopying %s: %d files, %d MiB in %s, done\n", termsafe.Line(src), files.Load(), bytes.Load()>>20, time.Since(start).Round(time.Second))
				}
				return
			case <-t.C:
				shown = true
				fmt.Fprintf(os.Stderr, "\rcopying %s: %d files, %d MiB", termsafe.Line(src), files.Load(), bytes.Load()>>20)
			}
		}
	}()
	return func() { close(done); <-finished }
}

// trialCmd is `thermite trial`: one function a subcommand.
func trialCmd() *cobra.Command {
	c := &cobra.Command{Use: "trial", Short: "Trials: a lane's fresh copy of a project, its agent, its token (root)"}
	c.AddCommand(trialStartCmd(),
		trialCommand("exec", "exec TRIAL [--timeout D] -- CMD [ARGS...]", "Run a command as the trial's lane in its workspace, and exit with its code"),
		trialCommand("agent", "agent TRIAL [--harness pi|lane] [--timeout D] [--env K=V] -- CMD [ARGS...]", "Run the trial's worker agent: as agent-N (pi) or as the lane's user (lane, for OpenCode, Claude Code, Codex)"),
		trialEndCmd(), trialListCmd(), trialPruneCmd(), trialEventsCmd())
	return c
}

// trialStartCmd is `thermite trial start`: the project imported as the
// lane's, the trial started on it, the import removed.
func trialStartCmd() *cobra.Command {
	var lane int
	var project, run string
	var asJSON bool
	start := &cobra.Command{
		Use:   "start --lane N --project DIR [--run RUN]",
		Short: "Start a trial on a lane: prints its id, workspace and token file",
		Args:  cobra.NoArgs,
		RunE: askAndPrint[controller.TrialInfo]{
			what:   "trial start",
			asJSON: &asJSON,
			table:  true,
			ask: func(q asked) (controller.TrialInfo, error) {
				var info controller.TrialInfo
				t := q.table
				if project == "" {
					return info, fmt.Errorf("--project is required")
				}
				laneRole, ok := t.Lane(lane)
				if !ok {
					return info, fmt.Errorf("lane %d is out of range 1..%d", lane, q.cfg.Lanes)
				}
				copyDir, err := importProject(q.cfg, t, project, laneRole)
				if err != nil {
					return info, err
				}
				err = ctlCall(q.cfg, "POST", "/v1/trials", controller.StartRequest{Lane: lane, Project: copyDir, Run: run, LaneOwned: true}, &info)
				os.RemoveAll(copyDir)
				return info, err
			},
			show: func(_ asked, info controller.TrialInfo) error {
				fmt.Printf("trial      %s\nlane       %d\nrun        %s\nworkspace  %s\ntoken file %s\n", info.ID, info.Lane, info.Run, info.Workspace, info.TokenFile)
				return nil
			},
		}.runE,
	}
	start.Flags().IntVar(&lane, "lane", 0, "the lane (1..lanes)")
	start.Flags().StringVar(&project, "project", "", "the project folder to copy")
	start.Flags().StringVar(&run, "run", "", "the research run (default \"default\")")
	start.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return start
}

// trialCommand is `thermite trial exec` or `thermite trial agent` (route):
// a command in the trial, its output streamed, its exit code passed on.
func trialCommand(route, use, short string) *cobra.Command {
	var timeout time.Duration
	var harness string
	var env []string
	c := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			what := "trial " + route
			cfg, err := rootConfig(what)
			if err != nil {
				return err
			}
			var body any = controller.ExecRequest{Argv: args[1:], TimeoutMS: timeout.Milliseconds()}
			if route == "agent" {
				body = controller.AgentRequest{Argv: args[1:], TimeoutMS: timeout.Milliseconds(), Harness: harness, Env: env}
			}
			return ctlStream(cfg, "/v1/trials/"+args[0]+"/"+route, body, what)
		},
	}
	if route == "agent" {
		c.Flags().DurationVar(&timeout, "timeout", 0, "wall-clock limit (default and most: the rig's agent.wall_timeout)")
		c.Flags().StringArrayVar(&env, "env", nil, "K=V added to the agent's environment (its provider's address or key, say); repeatable")
		c.Flags().StringVar(&harness, "harness", controller.HarnessPi, "pi: as agent-N, the trial's folder as HOME, tools through the API; lane: as the lane's user in the workspace, its token and MCP configuration in a home of its own")
	} else {
		c.Flags().DurationVar(&timeout, "timeout", 0, "wall-clock limit (default: the rig's)")
	}
	return c
}

// trialEndCmd is `thermite trial end`.
func trialEndCmd() *cobra.Command {
	var reason string
	end := &cobra.Command{
		Use:   "end TRIAL",
		Short: "End a trial: revoke its token, stop its processes, publish its research area",
		Args:  cobra.ExactArgs(1),
		RunE: askAndPrint[ledger.Trial]{
			what: "trial end",
			ask: askController[ledger.Trial]("POST",
				func(args []string) string { return "/v1/trials/" + args[0] + "/end" },
				func([]string) any { return controller.EndRequest{Reason: reason} }),
			show: func(_ asked, t ledger.Trial) error {
				fmt.Printf("trial %s ended: %s\n", t.ID, t.EndReason)
				return nil
			},
		}.runE,
	}
	end.Flags().StringVar(&reason, "reason", "", "why it ended")
	return end
}

// trialListCmd is `thermite trial list`: a row a trial, then an alert for
// every open trial whose disk cannot be measured or is measured late.
func trialListCmd() *cobra.Command {
	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List the trials",
		Args:  cobra.NoArgs,
		RunE: askAndPrint[[]controller.TrialStatus]{
			what:   "trial list",
			asJSON: &asJSON,
			ask:    askController[[]controller.TrialStatus]("GET", fixedPath("/v1/trials"), nil),
			show: func(q asked, ts []controller.TrialStatus) error {
				w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "TRIAL\tLANE\tRUN\tSTATE\tSTARTED\tENDED\tDISK\tREASON")
				for _, t := range ts {
					ended := "-"
					if !t.Ended.IsZero() {
						ended = t.Ended.Format(time.RFC3339)
					}
					state := t.State
					if !t.Removed.IsZero() {
						state += ", removed"
					}
					fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Lane, t.Run, state, t.Started.Format(time.RFC3339), ended, diskCell(t), termsafe.Line(t.EndReason))
				}
				if err := w.Flush(); err != nil {
					return err
				}
				diskAlerts(os.Stderr, ts, q.cfg.Trial.DiskCheck.Duration)
				return nil
			},
		}.runE,
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return list
}

// trialPruneCmd is `thermite trial prune`: exit 1 when a trial's folders
// could not be removed.
func trialPruneCmd() *cobra.Command {
	var olderThan time.Duration
	prune := &cobra.Command{
		Use:   "prune [--older-than D]",
		Short: "Remove the folders of ended trials now (the ledger and published research areas stay)",
		Args:  cobra.NoArgs,
		RunE: askAndPrint[controller.PruneResult]{
			what: "trial prune",
			ask: func(q asked) (controller.PruneResult, error) {
				if olderThan < 0 {
					return controller.PruneResult{}, fmt.Errorf("--older-than %s must be 0 or more", olderThan)
				}
				return askController[controller.PruneResult]("POST", fixedPath("/v1/trials/prune"),
					func([]string) any { return controller.PruneRequest{OlderThan: olderThan.String()} })(q)
			},
			show: func(_ asked, res controller.PruneResult) error {
				fmt.Printf("removed the folders of %d ended trials: %d entries, %d MiB\n", len(res.Trials), res.Entries, res.Bytes>>20)
				for _, e := range res.Errors {
					fmt.Fprintf(os.Stderr, "trial prune: %s\n", termsafe.Line(e))
				}
				if len(res.Errors) > 0 {
					return &exitError{code: 1, msg: fmt.Sprintf("trial prune: %d trials' folders could not be removed", len(res.Errors))}
				}
				return nil
			},
		}.runE,
	}
	prune.Flags().DurationVar(&olderThan, "older-than", 0, "only trials that ended at least this long ago")
	return prune
}

// diskCell is a trial's disk as the list shows it: what it last held, or
// that it cannot be measured.
func diskCell(t controller.TrialStatus) string {
	switch {
	case t.Disk == nil && t.State != "open" && t.Removed.IsZero():
		return fmt.Sprintf("%d MiB kept", t.DiskBytes>>20)
	case t.Disk == nil:
		return "-"
	case t.Disk.Error != "":
		return "UNMEASURED"
	case t.Disk.Checked.IsZero():
		return "not yet measured"
	}
	return fmt.Sprintf("%d MiB", t.Disk.Bytes>>20)
}

// diskAlerts prints a line for every open trial whose folders the rig
// cannot measure: the rig's failure, retried, shown until it clears.
// It also says when a trial's checks fall behind: its folders measured
// again after more than twice disk_check.
func diskAlerts(w io.Writer, ts []controller.TrialStatus, check time.Duration) {
	for _, t := range ts {
		d := t.Disk
		if d == nil {
			continue
		}
		if d.Error != "" {
			fmt.Fprintf(w, "ALERT: trial %s (lane %d): its folders cannot be measured since %s (%d tries; retrying, the trial goes on): %s\n",
				t.ID, t.Lane, d.Since.Format(time.RFC3339), d.Failures, termsafe.Line(d.Error))
		}
		if real := time.Duration(d.IntervalMS) * time.Millisecond; real > 2*check {
			fmt.Fprintf(w, "ALERT: trial %s (lane %d): its disk was measured %s after the check before, more than twice disk_check (%s)\n",
				t.ID, t.Lane, real, check)
		}
	}
}

// diskIntervals is the line status prints about the disk checks of the
// open trials: the setting and the slowest real interval.
func diskIntervals(ts []controller.TrialStatus, check time.Duration) string {
	open, slowest := 0, time.Duration(0)
	for _, t := range ts {
		if t.Disk != nil {
			open++
			slowest = max(slowest, time.Duration(t.Disk.IntervalMS)*time.Millisecond)
		}
	}
	if open == 0 {
		return fmt.Sprintf("disk checks: every %s; no open trial", check)
	}
	return fmt.Sprintf("disk checks: every %s; %d open trials, slowest real interval %s", check, open, slowest)
}

// ledgerCmd is `thermite ledger`; its export copies the controller's
// JSON to stdout as it comes.
func ledgerCmd() *cobra.Command {
	c := &cobra.Command{Use: "ledger", Short: "The controller's ledger"}
	c.AddCommand(ledgerExportCmd())
	return c
}

// ledgerExportCmd is `thermite ledger export`.
func ledgerExportCmd() *cobra.Command {
	var asJSON bool
	export := &cobra.Command{
		Use:   "export [--json]",
		Short: "Write everything in the ledger but the hidden test results, as JSON (root)",
		Args:  cobra.NoArgs,
		RunE: askAndPrint[struct{}]{
			what: "ledger export",
			ask: func(q asked) (struct{}, error) {
				return struct{}{}, ctlCall(q.cfg, "GET", "/v1/ledger/export", nil, nil)
			},
		}.runE,
	}
	export.Flags().BoolVar(&asJSON, "json", true, "JSON (the only form)")
	return export
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// problemDetail is the one line of the controller's error answer (an RFC
// 9457 problem), or what it says of an answer it cannot read.
func problemDetail(body io.Reader) string {
	var p controller.Problem
	if err := json.NewDecoder(io.LimitReader(body, 1<<20)).Decode(&p); err != nil || p.Detail == "" {
		return "the controller's answer is not a problem it explains"
	}
	return p.Detail
}
