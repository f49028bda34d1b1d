package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"thermite/broker"
	"thermite/controller"
	"thermite/internal/caps"
	"thermite/internal/config"
	"thermite/internal/rpc"
	"thermite/internal/runas"
	"thermite/internal/weaken"
	"thermite/roles"
	"thermite/selftest"
)

func loadConfig() (config.Config, error) { return config.Load(configPath) }

func loadTable() (config.Config, *roles.Table, error) {
	cfg, err := loadConfig()
	if err != nil {
		return cfg, nil, err
	}
	t, err := roles.FromConfig(cfg)
	return cfg, t, err
}

var controlKey, controlKeySHA string

func serveFlags(c *cobra.Command) {
	c.Flags().StringVar(&controlKey, "control-key", "", "control's key: checked against --control-key-sha256, then installed where only root can write it")
	c.Flags().StringVar(&controlKeySHA, "control-key-sha256", "", "the SHA-256 (hex) the launch names for control's key")
}

func serveCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "serve",
		Short: "Run the broker (as root): prepare the rig, run the self-test, start and supervise the controller",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, args []string) error { return runServe() },
	}
	serveFlags(c)
	return c
}

// stripEnv removes the host's variables (RunPod's among them) before
// anything else starts, so no process of the rig has them.
func stripEnv(env, prefixes []string) []string {
	var out []string
	for _, kv := range env {
		drop := false
		for _, p := range prefixes {
			if strings.HasPrefix(kv, p) {
				drop = true
			}
		}
		if !drop {
			out = append(out, kv)
		}
	}
	return out
}

// runServe checks the configuration, then re-execs as the broker with the
// capability bounding set reduced to the broker's and no_new_privs set.
func runServe() error {
	cfg, err := rootConfig("serve")
	if err != nil {
		return err
	}
	argv := []string{"thermite", broker.Arg}
	if cfg.Source != "" {
		argv = append(argv, "--config", cfg.Source)
	}
	if controlKey != "" || controlKeySHA != "" {
		if _, err := broker.CheckControlKey(controlKey, controlKeySHA); err != nil {
			return err
		}
		argv = append(argv, "--control-key", controlKey, "--control-key-sha256", controlKeySHA)
	}
	// Agent egress keeps caps.Egress where this process has them; where it
	// has not, the broker names agent.egress when it checks its own. The
	// disk measure's caps.Measure is kept where the kernel and container
	// give it; where they do not, the broker says what it cannot measure.
	egress := len(cfg.Agent.Egress) > 0 && caps.Bounded(caps.Egress)
	keep := caps.BrokerFor(egress, caps.Bounded([]int{caps.Measure}))
	// The broker's own /proc, with hidepid, on this thread, which execs
	// next: what it cannot do the broker's kernel policy names.
	runtime.LockOSThread()
	if weaken.Enabled && weaken.Has(weaken.ProcVisible) {
		argv = append(argv, "--"+broker.HideProcessesFlag, "a thermite_weaken build ("+weaken.ProcVisible+")")
	} else if err := broker.HideProcesses(); err != nil {
		argv = append(argv, "--"+broker.HideProcessesFlag, err.Error())
	}
	return caps.ReduceAndExec(keep, argv, stripEnv(os.Environ(), cfg.StripEnvPrefixes))
}

// rolesCmd is `thermite roles`: the role table, and its ensure and remove.
func rolesCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "roles",
		Short: "Print the role table: every role user, its uid, gid, groups and what runs as it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			_, t, err := loadTable()
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(t)
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ROLE\tUSER\tUID\tGID\tGROUPS\tWHAT RUNS AS IT")
			for _, r := range t.Roles {
				fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\t%s\n", r.Name, r.User, r.UID, r.GID, groupNames(t, r.Groups), r.Purpose)
			}
			return w.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.AddCommand(rolesEnsureCmd(), rolesRemoveCmd())
	return c
}

// rolesEnsureCmd is `thermite roles ensure`.
func rolesEnsureCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "ensure",
		Short: "Write the missing role users and groups into /etc/passwd, /etc/group and /etc/shadow (root)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			_, t, err := rootTable("roles ensure")
			if err != nil {
				return err
			}
			added, err := t.Ensure("/etc")
			if err != nil {
				return err
			}
			fmt.Printf("roles: %d users and %d groups in place; added %d entries\n", len(t.Roles), len(t.Roles)+len(t.Groups), len(added))
			return nil
		},
	}
}

// rolesRemoveCmd is `thermite roles remove`.
func rolesRemoveCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "remove",
		Short: "Remove the table's role users and groups from /etc (root)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			_, t, err := rootTable("roles remove")
			if err != nil {
				return err
			}
			removed, err := t.Remove("/etc")
			if err != nil {
				return err
			}
			fmt.Printf("roles: removed %d entries\n", len(removed))
			return nil
		},
	}
}

func groupNames(t *roles.Table, gids []int) string {
	if len(gids) == 0 {
		return "-"
	}
	var out []string
	for _, g := range gids {
		name := fmt.Sprint(g)
		for _, grp := range t.Groups {
			if grp.GID == g {
				name = grp.Unix
			}
		}
		out = append(out, name)
	}
	return strings.Join(out, ",")
}

func configCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "config",
		Short: "Print the effective configuration",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := loadConfig()
			if err != nil {
				return err
			}
			s, err := cfg.Encode()
			if err != nil {
				return err
			}
			fmt.Print(s)
			return nil
		},
	}
}

// runAsCmd hands its arguments to runas.Main, which thermite-run-as runs
// too: one parser, one request, one exit status for both. A --config
// before run-as reaches it among the arguments (cobra parses no flag for
// a command that parses its own); configPath is passed on in case it was
// set some other way.
func runAsCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "run-as ROLE [flags] -- CMD [ARGS...]",
		Short:              "Run one command as a role through the broker, stream its output, and exit with its code (root)",
		Long:               runas.Usage,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if configPath != "" {
				args = append([]string{"--config", configPath}, args...)
			}
			if code := runas.Main(args, os.Stdout, os.Stderr); code != 0 {
				return &exitError{code: code}
			}
			return nil
		},
	}
}

// stopCmd is `thermite stop ROLE`, through the broker.
func stopCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "stop ROLE",
		Short: "Stop every process a role's user runs (root)",
		Args:  cobra.ExactArgs(1),
		RunE: askAndPrint[*rpc.StopUserResult]{
			what: "stop",
			ask: func(q asked) (*rpc.StopUserResult, error) {
				resp, err := rpc.Call(q.cfg.BrokerSocket(), &rpc.Request{Op: rpc.OpStopUser, StopUser: &rpc.StopUserRequest{Role: q.args[0]}})
				if err != nil {
					return nil, err
				}
				return resp.StopUser, nil
			},
			show: func(q asked, r *rpc.StopUserResult) error {
				fmt.Printf("stopped %d processes of %s\n", r.Stopped, q.args[0])
				return nil
			},
		}.runE,
	}
}

func statusCmd() *cobra.Command {
	var (
		asJSON bool
		wait   time.Duration
	)
	c := &cobra.Command{
		Use:   "status",
		Short: "Show the rig's phase, the broker, the controller, the role table and the last self-test; exit 0 only when the rig is ready (root)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := rootConfig("status")
			if err != nil {
				return err
			}
			st, err := rigStatus(cfg.BrokerSocket(), wait)
			if err != nil {
				return &exitError{code: exitNotReady, msg: "status: " + err.Error()}
			}
			host := hostCheck(cfg, st)
			if asJSON {
				if err := printJSON(struct {
					*rpc.Status
					Host selftest.HostVerdict `json:"host"`
				}{st, host}); err != nil {
					return err
				}
			} else {
				printStatus(st)
				if st.ControllerUp {
					var ts []controller.TrialStatus
					if err := ctlCallWithin(cfg, 5*time.Second, "GET", "/v1/trials?state=open", nil, &ts); err == nil {
						fmt.Println(diskIntervals(ts, cfg.Trial.DiskCheck.Duration))
						diskAlerts(os.Stdout, ts, cfg.Trial.DiskCheck.Duration)
					}
					var k controller.Kept
					if err := ctlCallWithin(cfg, 5*time.Second, "GET", "/v1/trials/kept", nil, &k); err == nil {
						fmt.Printf("ended trials kept: %d folders, %d MiB (trial.retain_ended %s; thermite trial prune removes them now)\n", k.Trials, k.Bytes>>20, cfg.Trial.RetainEnded)
					}
				}
				fmt.Print("host check: ")
				printHostCheck(host, false)
			}
			if st.Phase != rpc.PhaseReady {
				return &exitError{code: exitNotReady, msg: "status: the rig is not ready: " + phaseLine(st)}
			}
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.Flags().DurationVar(&wait, "wait", 0, "wait up to this long for the rig to be ready (--wait alone: 2m)")
	c.Flags().Lookup("wait").NoOptDefVal = "2m"
	return c
}

// exitNotReady is status's exit code when the rig does not serve.
const exitNotReady = 3

// rigStatus asks the broker for its status. With wait, it asks again until
// the rig is ready, the start is refused, or wait runs out, and a broker
// that is not listening yet counts as starting.
func rigStatus(socket string, wait time.Duration) (*rpc.Status, error) {
	deadline := time.Now().Add(wait)
	for {
		resp, err := rpc.Call(socket, &rpc.Request{Op: rpc.OpStatus})
		if err == nil && (resp.Status.Phase == rpc.PhaseReady || resp.Status.Phase == rpc.PhaseRefused) {
			return resp.Status, nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return nil, fmt.Errorf("no broker answers on %s: %w", socket, err)
			}
			return resp.Status, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// phaseLine is the phase and why, in one line.
func phaseLine(s *rpc.Status) string {
	if s.PhaseWhy != "" {
		return s.Phase + " (" + s.PhaseWhy + ")"
	}
	return s.Phase
}

func printStatus(s *rpc.Status) {
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "phase\t%s\n", phaseLine(s))
	fmt.Fprintf(w, "broker\tpid %d, since %s, socket %s\n", s.BrokerPID, s.StartedAt, s.Socket)
	ctl := "not running"
	if s.ControllerPID != 0 {
		ans := "does not answer"
		if s.ControllerUp {
			ans = "answers"
		}
		ctl = fmt.Sprintf("pid %d, %s (started %d times)", s.ControllerPID, ans, s.ControllerRuns)
	}
	fmt.Fprintf(w, "controller\t%s\n", ctl)
	fmt.Fprintf(w, "landlock\tABI %d\n", s.LandlockABI)
	fmt.Fprintf(w, "cgroup\t%s\n", s.Cgroup)
	fmt.Fprintf(w, "cpu weights\t%s\n", s.CPUWeights)
	if s.DiskCheck != "" {
		fmt.Fprintf(w, "disk check\t%s\n", s.DiskCheck)
	}
	for _, l := range s.Without {
		fmt.Fprintf(w, "without\t%s\n", l)
	}
	if s.Selftest != nil {
		fmt.Fprintf(w, "self-test\t%s (at %s, %d ms, Landlock ABI %d)\n", s.Selftest.Sentence, s.Selftest.At, s.Selftest.WallMS, s.Selftest.LandlockV)
		if s.Selftest.Controller != "" {
			fmt.Fprintf(w, "\t%s\n", s.Selftest.Controller)
		}
		if s.Selftest.CPUWeights != "" {
			fmt.Fprintf(w, "\tCPU weights %s\n", s.Selftest.CPUWeights)
		}
	} else {
		fmt.Fprintf(w, "self-test\tnot run\n")
	}
	if g := s.GPU; g != nil {
		state := "usable"
		if !g.Usable {
			state = "refused: " + g.Refused
		}
		fmt.Fprintf(w, "gpu\tlayout %s, %d cards, %s\n", g.Layout, len(g.Cards), state)
		if g.PermsNote != "" {
			fmt.Fprintf(w, "\t%s\n", g.PermsNote)
		}
	}
	for _, n := range s.Notes {
		fmt.Fprintf(w, "note\t%s\n", n)
	}
	busy := 0
	for _, r := range s.Roles {
		if r.Processes > 0 {
			busy++
		}
	}
	fmt.Fprintf(w, "roles\t%d roles, %d with processes\n", len(s.Roles), busy)
	w.Flush()
	rs := append([]rpc.RoleStatus(nil), s.Roles...)
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].UID < rs[j].UID })
	w = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  ROLE\tUSER\tUID\tPROCESSES")
	for _, r := range rs {
		fmt.Fprintf(w, "  %s\t%s\t%d\t%d\n", r.Name, r.User, r.UID, r.Processes)
	}
	w.Flush()
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
