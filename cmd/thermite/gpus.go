package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"thermite/internal/rpc"
)

func gpusCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "gpus",
		Short: "Show the discovered cards, the layout, who may open what, whether device permissions can be changed, and the fence's ABI (root)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := rootConfig("gpus")
			if err != nil {
				return err
			}
			resp, err := rpc.Call(cfg.BrokerSocket(), &rpc.Request{Op: rpc.OpStatus})
			if err != nil {
				return fmt.Errorf("gpus: %w", err)
			}
			g := resp.Status.GPU
			if g == nil {
				return fmt.Errorf("gpus: the broker reports no GPU state")
			}
			if asJSON {
				return printJSON(g)
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			state := "usable"
			if !g.Usable {
				state = "GPU work refused: " + g.Refused
			}
			fmt.Fprintf(w, "layout\t%s: %s\n", g.Layout, state)
			fmt.Fprintf(w, "discovery\t%s\n", g.Discovery)
			fmt.Fprintf(w, "fence\tLandlock ABI %d\n", g.FenceABI)
			perms := "fixed by the broker"
			if !g.PermsFixed {
				perms = g.PermsNote
			}
			fmt.Fprintf(w, "device files\t%s\n", perms)
			fmt.Fprintf(w, "control nodes\t%s\n", strings.Join(g.Control, " "))
			w.Flush()
			w = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "CARD\tMINOR\tUUID\tPATH\tGROUP\tWHO MAY OPEN IT")
			for _, c := range g.Cards {
				who := "nobody (layout refused)"
				for _, a := range g.Assignments {
					if a.Card == c.Index {
						who = strings.Join(a.Roles, ", ")
					}
				}
				fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%s\t%s\n", c.Index, c.Minor, c.UUID, c.Path, c.Group, who)
			}
			return w.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}
