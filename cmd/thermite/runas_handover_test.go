package main

import (
	"strings"
	"testing"
)

// TestRunAsHandsOverBeforeCobra: the command lines that reach run-as go to
// runas.Main with the --config before run-as passed on, and every other
// line is cobra's.
func TestRunAsHandsOverBeforeCobra(t *testing.T) {
	cases := []struct {
		line string
		want string // run-as's arguments, or "cobra"
	}{
		{"run-as lane-1 -- /bin/true", "lane-1 -- /bin/true"},
		{"--config /r.toml run-as lane-1 -- id", "--config /r.toml lane-1 -- id"},
		{"--config=/r.toml run-as --json lane-1 -- id", "--config=/r.toml --json lane-1 -- id"},
		{"--config /a --config /b run-as lane-1 -- id", "--config /a --config /b lane-1 -- id"},
		{"run-as --help", "--help"},
		{"run-as", ""},
		{"status", "cobra"},
		{"--config /r.toml status", "cobra"},
		{"--config", "cobra"},
		{"--verbose run-as lane-1 -- id", "cobra"},
		{"trial run-as", "cobra"},
		{"", "cobra"},
	}
	for _, c := range cases {
		args, ok := runAsArgs(strings.Fields(c.line))
		got := "cobra"
		if ok {
			got = strings.Join(args, " ")
		}
		if got != c.want {
			t.Errorf("%q: got %q, want %q", c.line, got, c.want)
		}
	}
}
