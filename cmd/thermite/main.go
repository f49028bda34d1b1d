// The runtime's cgroup-aware GOMAXPROCS keeps two cgroup files open for
// the life of every Go process; the stop helper and the probe must hold
// nothing but what they were handed, so it is off.
//
//go:debug containermaxprocs=0
//go:debug updatemaxprocs=0

// Command thermite is the rig's isolation layer: one binary that is the
// root broker, the unprivileged controller, the stop helper (`thermite
// __spawn`), the self-test's probe, the worker's client and the operator's
// tools.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"thermite/internal/config"
	"thermite/internal/runas"
	"thermite/internal/trialclient"
	"thermite/roles"
)

// exitError carries an exit code other than 1 out of a command.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// main takes the rig's own ways in first (entryPoints), then the
// operator's commands.
func main() {
	if filepath.Base(os.Args[0]) == trialClientName {
		os.Exit(trialclient.Main(os.Args[1:]))
	}
	if len(os.Args) > 1 {
		if run, ok := entryPoints[os.Args[1]]; ok {
			os.Exit(run(os.Args[2:]))
		}
	}
	// run-as hands over to the light client's path (runas.Main, which
	// thermite-run-as runs) before cobra builds its commands or anything
	// reads the configuration: an operator's command costs what the light
	// client's does, less what this binary's size costs at its start.
	if args, ok := runAsArgs(os.Args[1:]); ok {
		os.Exit(runas.Main(args, os.Stdout, os.Stderr))
	}
	os.Exit(exitStatus(newRoot().Execute()))
}

var configPath string

// runAsArgs says whether a command line is `thermite [--config PATH]
// run-as ...`, and gives what runas.Main takes: run-as's own arguments,
// the --config passed on before them (Parse takes flags and the role in
// any order before "--", and a later --config wins, as cobra's flag did).
// Any other flag before run-as leaves the line to cobra, which says what
// it makes of it.
func runAsArgs(args []string) ([]string, bool) {
	var config []string
	for len(args) > 0 {
		switch a := args[0]; {
		case a == "run-as":
			return append(config, args[1:]...), true
		case a == "--config" && len(args) > 1:
			config, args = append(config, a, args[1]), args[2:]
		case strings.HasPrefix(a, "--config="):
			config, args = append(config, a), args[1:]
		default:
			return nil, false
		}
	}
	return nil, false
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "thermite",
		Short:         "The rig's isolation layer: a root broker, an unprivileged controller, and role users",
		Long:          "thermite with no command is `thermite serve`: the broker, as root.",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE:          func(cmd *cobra.Command, args []string) error { return runServe() },
	}
	root.PersistentFlags().StringVar(&configPath, "config", "", "the rig's TOML configuration (default /etc/thermite/rig.toml when present)")
	serveFlags(root)
	root.AddCommand(
		serveCmd(),
		rolesCmd(), configCmd(),
		runAsCmd(), stopCmd(), statusCmd(),
		selftestCmd(), checkCmd(), gpusCmd(), trialCmd(), ledgerCmd(), kitCmd(), judgeCmd(), openapiCmd(),
	)
	return root
}

// rootConfig is the start of every operator's command that talks to the
// rig: root, and the configuration.
func rootConfig(what string) (config.Config, error) {
	if err := requireRoot(what); err != nil {
		return config.Config{}, err
	}
	return loadConfig()
}

// rootTable is rootConfig with the role table.
func rootTable(what string) (config.Config, *roles.Table, error) {
	if err := requireRoot(what); err != nil {
		return config.Config{}, nil, err
	}
	return loadTable()
}

func requireRoot(what string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%s: must run as root", what)
	}
	return nil
}
