package main

import (
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"thermite/internal/config"
	"thermite/internal/landlock"
	"thermite/internal/rpc"
	"thermite/selftest"
)

// hostCheck runs the rig check's host rows for cfg. The cgroup row takes
// the broker's word when one answers: the broker decides at its start.
func hostCheck(cfg config.Config, st *rpc.Status) selftest.HostVerdict {
	judge, _ := cfg.JudgeCPUSet()
	e := selftest.HostEnv{
		ProcRoot: cfg.Host.ProcRoot, SysRoot: cfg.Host.SysRoot,
		JudgeCPUs: judge, SetIDDirs: cfg.Host.SetIDDirs,
		LandlockABI: landlock.ABI(), PolicyABI: landlock.PolicyABI,
	}
	if st != nil {
		e.Cgroup, e.ProcView, e.CPUWeights = st.Cgroup, st.ProcView, st.CPUWeights
	}
	return selftest.CheckHost(e)
}

// checkCmd is `thermite check`: exit 1 when the host fails it.
func checkCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "check",
		Short: "Check the host's hygiene: kernel settings, debugfs, set-id files, cgroups, Landlock, timing; each failing row says what to change (root)",
		Args:  cobra.NoArgs,
		RunE: askAndPrint[selftest.HostVerdict]{
			what:   "check",
			asJSON: &asJSON,
			ask: func(q asked) (selftest.HostVerdict, error) {
				var st *rpc.Status
				if resp, err := rpc.Call(q.cfg.BrokerSocket(), &rpc.Request{Op: rpc.OpStatus}); err == nil {
					st = resp.Status
				}
				return hostCheck(q.cfg, st), nil
			},
			show: func(_ asked, v selftest.HostVerdict) error {
				printHostCheck(v, true)
				return nil
			},
			exit: func(v selftest.HostVerdict) error { return failsWith1(v.Holds) },
		}.runE,
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print every row as JSON")
	return c
}

// printHostCheck prints the verdict, then every row (all, or only those
// that failed), each failure with its fix.
func printHostCheck(v selftest.HostVerdict, all bool) {
	fmt.Println(v.Sentence)
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	for _, r := range v.Rows {
		if r.OK && !all {
			continue
		}
		mark := "ok"
		if !r.OK {
			mark = "FAIL"
			if r.Severity == selftest.SevWarning {
				mark = "warn"
			}
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\n", mark, r.Name, r.Got)
		if !r.OK && r.Fix != "" {
			fmt.Fprintf(w, "  \t\tfix: %s\n", r.Fix)
		}
	}
	w.Flush()
}
