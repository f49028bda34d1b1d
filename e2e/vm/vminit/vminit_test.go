//go:build linux

package vminit

import "testing"

func TestParamInTakesTheFirstValueOfItsName(t *testing.T) {
	line := "console=ttyS0 thermite.run=TestX thermite.runner=no thermite.run=TestY panic=-1\n"
	for _, c := range []struct{ name, def, want string }{
		{"thermite.run", "", "TestX"},
		{"thermite.runner", "", "no"},
		{"thermite.timeout", "10m", "10m"},
		{"thermite.ru", "none", "none"},
	} {
		if got := paramIn(line, c.name, c.def); got != c.want {
			t.Errorf("paramIn(%q, %q) = %q, want %q", c.name, c.def, got, c.want)
		}
	}
}
