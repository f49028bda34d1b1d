package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"thermite/internal/rpc"
)

// gpusCmd is `thermite gpus`: the broker's GPU state.
func gpusCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "gpus",
		Short: "Show the discovered cards, the layout, who may open what, whether device permissions can be changed, and the fence's ABI (root)",
		Args:  cobra.NoArgs,
		RunE: askAndPrint[*rpc.GPUStatus]{
			what:   "gpus",
			asJSON: &asJSON,
			ask: func(q asked) (*rpc.GPUStatus, error) {
				resp, err := rpc.Call(q.cfg.BrokerSocket(), &rpc.Request{Op: rpc.OpStatus})
				if err != nil {
					return nil, err
				}
				if resp.Status.GPU == nil {
					return nil, errors.New("the broker reports no GPU state")
				}
				return resp.Status.GPU, nil
			},
			show: func(_ asked, g *rpc.GPUStatus) error { return printGPUs(g) },
		}.runE,
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// printGPUs prints the layout and the cards, each with who may open it.
func printGPUs(g *rpc.GPUStatus) error {
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
}
