package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"thermite/internal/rpc"
	"thermite/selftest"
)

// selftestCmd is `thermite selftest`: isolation and reference.
func selftestCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "selftest",
		Short: "Self-tests of the rig",
	}
	c.AddCommand(selftestIsolationCmd(), selftestReferenceCmd())
	return c
}

// selftestIsolationCmd is `thermite selftest isolation`, through the
// broker: exit 1 when isolation does not hold.
func selftestIsolationCmd() *cobra.Command {
	var asJSON, force bool
	iso := &cobra.Command{
		Use:   "isolation",
		Short: "Run a probe as every role that tries what the role must not do; one sentence says whether isolation holds (root)",
		Args:  cobra.NoArgs,
		RunE: askAndPrint[*rpc.SelftestResult]{
			what:   "selftest isolation",
			asJSON: &asJSON,
			ask: func(q asked) (*rpc.SelftestResult, error) {
				resp, err := rpc.Call(q.cfg.BrokerSocket(), &rpc.Request{Op: rpc.OpSelftest, Selftest: &rpc.SelftestRequest{Force: force}})
				if err != nil {
					return nil, err
				}
				return resp.Selftest, nil
			},
			show: func(_ asked, res *rpc.SelftestResult) error {
				fmt.Println(res.Sentence)
				if res.Controller != "" {
					fmt.Fprintln(os.Stderr, "selftest: "+res.Controller)
				}
				return nil
			},
			exit: func(res *rpc.SelftestResult) error { return failsWith1(res.Holds) },
		}.runE,
	}
	iso.Flags().BoolVar(&asJSON, "json", false, "print every probe's row as JSON")
	iso.Flags().BoolVar(&force, "force", false, "run on a busy rig: each probe stops its role's processes")
	return iso
}

// selftestReferenceCmd is `thermite selftest reference`.
func selftestReferenceCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "reference",
		Short: "Print the rig checks reference (docs/rig-checks.md): every probe of the self-test, every rig row and every host check",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Print(selftest.Reference())
			return nil
		},
	}
}
