package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"thermite/broker"
	"thermite/controller"
	"thermite/internal/lanefs"
	"thermite/internal/rpc"
	"thermite/internal/spawn"
	"thermite/internal/termsafe"
	"thermite/internal/trialclient"
	"thermite/selftest"
)

// entryPoints are the binary's ways in that the rig takes itself, by the
// first argument: each runs before the operator's commands are set up,
// since it runs as a role user, often, and must stay small and quick.
// thermite-trial, the worker's client, is the same binary by another name
// (trialClientName), or `thermite trial-client`.
var entryPoints = map[string]func(args []string) int{
	"trial-client":       trialclient.Main,
	spawn.Arg:            stopHelperMain,
	selftest.ProbeArg:    selftest.ProbeMain,
	controller.LaneFSArg: lanefs.ServeMain,
	broker.Arg:           brokerMain,
	broker.ControllerArg: controllerMain,
}

// trialClientName is the worker's client's name for the binary.
const trialClientName = "thermite-trial"

// stopHelperMain is the stop helper's way in; spawn.Main does not return.
func stopHelperMain([]string) int {
	spawn.Main()
	return 0
}

// brokerMain is the broker, as `thermite serve` re-execs it: root, with
// the bounding set reduced and no_new_privs set.
func brokerMain(args []string) int {
	fs := flag.NewFlagSet(broker.Arg, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&configPath, "config", "", "the rig's TOML configuration")
	fs.StringVar(&controlKey, "control-key", "", "control's key")
	fs.StringVar(&controlKeySHA, "control-key-sha256", "", "the SHA-256 (hex) the launch names for control's key")
	procHideErr := fs.String(broker.HideProcessesFlag, "", "why thermite serve could not mount the broker's own /proc")
	if err := fs.Parse(args); err != nil {
		return exitStatus(fmt.Errorf("%s: %w", broker.Arg, err))
	}
	if fs.NArg() > 0 {
		return exitStatus(fmt.Errorf("%s: takes no arguments, got %q", broker.Arg, fs.Args()))
	}
	cfg, err := loadConfig()
	if err != nil {
		return exitStatus(err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("proc", "broker")
	b, err := broker.New(cfg, log)
	if err != nil {
		return exitStatus(err)
	}
	b.SetControlKey(controlKey, controlKeySHA)
	b.SetProcHideError(*procHideErr)
	b.SetSelftest(func() *rpc.SelftestResult { return selftest.Run(b) })
	if err := b.Serve(); err != nil {
		log.Error("broker refused to start", "err", err.Error())
		return exitStatus(err)
	}
	return 0
}

// controllerMain is the controller, as the broker starts it.
func controllerMain(args []string) int {
	if len(args) > 0 {
		return exitStatus(fmt.Errorf("%s: takes no arguments, got %q", broker.ControllerArg, args))
	}
	return exitStatus(controller.Main())
}

// exitStatus prints err for the operator, if any, and returns the exit
// status it carries: 0 for none, 1 but for an exitError.
func exitStatus(err error) int {
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.msg != "" {
			fmt.Fprintln(os.Stderr, "thermite: "+termsafe.Escape(ee.msg))
		}
		return ee.code
	}
	// An error can carry what a role wrote (a build's error, a file's
	// name): escaped, as everything printed for the operator.
	fmt.Fprintln(os.Stderr, "thermite: "+termsafe.Escape(err.Error()))
	return 1
}
