package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"thermite/internal/config"
	"thermite/roles"
)

// asked is what a command's question and its printing are given: the
// rig's configuration, its role table where the command asks for it, and
// the command's arguments.
type asked struct {
	cfg   config.Config
	table *roles.Table
	args  []string
}

// askAndPrint is the shape of every operator's command that asks the rig
// one thing: root and the configuration, the question to the broker or
// the controller, the answer printed (as JSON with --json), then the exit
// status the answer gives.
type askAndPrint[T any] struct {
	// what names the command; every error it returns starts with it.
	what string
	// asJSON is the command's --json flag; nil where it has none.
	asJSON *bool
	// table: the question needs the role table.
	table bool
	// ask puts the question and returns the answer.
	ask func(q asked) (T, error)
	// show prints the answer for the operator; nil where ask printed it.
	show func(q asked, v T) error
	// exit, when set, ends the command once the answer is printed, in
	// either form: a check whose answer is that the rig fails it.
	exit func(v T) error
}

// runE is the command's cobra RunE.
func (a askAndPrint[T]) runE(_ *cobra.Command, args []string) error {
	cfg, err := rootConfig(a.what)
	if err != nil {
		return err
	}
	q := asked{cfg: cfg, args: args}
	if a.table {
		if q.table, err = roles.FromConfig(cfg); err != nil {
			return err
		}
	}
	v, err := a.ask(q)
	if err != nil {
		return fmt.Errorf("%s: %w", a.what, err)
	}
	switch {
	case a.asJSON != nil && *a.asJSON:
		err = printJSON(v)
	case a.show != nil:
		err = a.show(q, v)
	}
	if err != nil || a.exit == nil {
		return err
	}
	return a.exit(v)
}

// askController is an ask that calls the controller: method and path
// from the arguments, the request body (nil for none), the JSON answer.
func askController[T any](method string, path func(args []string) string, body func(args []string) any) func(q asked) (T, error) {
	return func(q asked) (T, error) {
		var v T
		var b any
		if body != nil {
			b = body(q.args)
		}
		err := ctlCall(q.cfg, method, path(q.args), b, &v)
		return v, err
	}
}

// fixedPath is a path that does not depend on the arguments.
func fixedPath(p string) func([]string) string { return func([]string) string { return p } }

// failsWith1 is the exit of a check: 1, with nothing more said, when the
// answer says the check does not hold.
func failsWith1(holds bool) error {
	if !holds {
		return &exitError{code: 1}
	}
	return nil
}
