package selftest

import (
	"fmt"
	"strings"

	"thermite/roles"
)

// The rig checks reference (docs/rig-checks.md) is written from the tables
// in this package, so it lists every probe there is and nothing else; a
// test fails when the committed file and the tables differ.

// referenceKinds are the role kinds in the order the reference names them,
// each with a role standing for its kind.
var referenceKinds = []roles.Role{
	{Name: "thermite", Kind: roles.Controller},
	{Name: "builder", Kind: roles.Builder},
	{Name: "run", Kind: roles.Timing},
	{Name: "planner", Kind: roles.Planner},
	{Name: "model-check", Kind: roles.ModelCheck},
	{Name: "lane-1", Kind: roles.Lane, Index: 1},
	{Name: "agent-1", Kind: roles.Agent, Index: 1},
	{Name: "supervisor", Kind: roles.Supervisor},
}

// whoFor spells which kinds of role a row applies to.
func whoFor(w Who) string {
	var in, out []string
	for _, r := range referenceKinds {
		if w(r) {
			in = append(in, string(r.Kind))
		} else {
			out = append(out, string(r.Kind))
		}
	}
	switch {
	case len(out) == 0:
		return "every role"
	case len(in) == 0:
		return "none"
	case len(out) < len(in):
		return "every role but " + strings.Join(out, ", ")
	}
	return strings.Join(in, ", ")
}

// Reference is docs/rig-checks.md: every probe of the isolation self-test,
// every rig row, and every host check, from the tables themselves.
func Reference() string {
	var b strings.Builder
	b.WriteString(`# Rig checks reference

Written from the tables in ` + "`selftest/`" + ` by ` + "`thermite selftest reference`" + `; a test
fails when this file and the tables differ. Do not edit it by hand.

## The isolation self-test

` + "`thermite selftest isolation`" + ` (and the broker at every start) runs a probe as
every role of the table, through the spawn path a real command of that role
takes. Each row below is one attempt: the roles it applies to, and the
outcomes that count as right. Anything else, "the target was not there"
(ENOENT) and "the probe could not run" included, is a failure that the
verdict names. Rows marked *alone* run in a probe process of their own; rows
marked *while a timing user holds* run in a phase of their own, while the
first timing user holds its judge CPUs (and card) exactly as a timed run does;
rows marked *while its commands start* run last, as the first lane: its probe
stops its own processes in a loop for ` + stopperFor.String() + ` while the self-test has the
broker start, through its own start path, the lane's commands one after
another and the builder's beside them; each of the builder's must start and
end within ` + startsBound.String() + `. The probe then leaves what it stopped stopped (at most
` + stopperHold.String() + `, so that a start the broker left stopped holds it longer than that
bound) until one more start of each has ended after its stops, and the
lane's next command must run. (Every role's filter refuses stop signals, so
its stops reach nothing unless that rule is gone; the row after it proves
the rule.)

| # | attempt | roles | right outcome |
|---|---|---|---|
`)
	for i, row := range Policy {
		want := strings.Join(row.Want, " or ")
		if row.WantFor != nil && len(row.Want) > 0 {
			want += ", or as the host says"
		} else if row.WantFor != nil {
			want = "as the layout and policy say for the role"
		}
		if row.Check != nil {
			want += ", then checked"
		}
		if row.Alone {
			want += " (alone)"
		}
		if row.Held {
			want += " (while a timing user holds its judge CPUs and card)"
		}
		if row.Starts {
			want += " (while its commands start)"
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %s |\n", i+1, cell(row.Attempt), whoFor(row.Who), cell(want))
	}
	b.WriteString(`
### The controller daemon

A probe confined exactly as the controller daemon runs (the broker's
` + "`confineController`" + `: its Landlock rule set, its seccomp filter, its cgroup)
tries what a flaw in the controller's parsing would try. Its rows are
reported as the role "` + DaemonLabel + `".

| # | attempt | right outcome |
|---|---|---|
`)
	for i, row := range DaemonRows {
		want := strings.Join(row.Want, " or ")
		if row.Check != nil {
			want += ", then checked"
		}
		if row.Alone {
			want += " (alone)"
		}
		fmt.Fprintf(&b, "| %d | %s | %s |\n", i+1, cell(row.Attempt), cell(want))
	}
	b.WriteString(`
### The disk check

Run for the first lane, in a phase of its own: the broker measures the
lane's folders before the probe's attempt, between its steps and after it,
and the last measure must count at least what a full walk of the same
folders finds.

| # | attempt | roles | right outcome |
|---|---|---|---|
`)
	for i, row := range DiskRows {
		want := strings.Join(row.Want, " or ")
		if row.Check != nil {
			want += ", then checked"
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %s |\n", i+1, cell(row.Attempt), whoFor(row.Who), cell(want))
	}
	b.WriteString(`
## The rig's own rows

Checked by the broker as root during the self-test; each must hold.

| # | row |
|---|---|
`)
	for i, rc := range RigChecks {
		fmt.Fprintf(&b, "| %d | %s |\n", i+1, cell(rc.Attempt))
	}
	b.WriteString(`
## The host check

` + "`thermite check`" + ` (and ` + "`thermite status`" + `) reads the host's settings. A failing
*isolation* row makes the verdict say the host weakens isolation; a
*warning* row is hardening beyond what thermite needs, or timing hygiene.
Each failing row prints the exact setting to change.

| # | check | severity | want | why |
|---|---|---|---|---|
`)
	for i, h := range HostChecks {
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s |\n", i+1, cell(h.Name), h.Severity, cell(h.Want), cell(h.Why))
	}
	return b.String()
}

func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
