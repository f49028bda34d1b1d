package selftest

import (
	"errors"
	"strings"
	"testing"

	"thermite/internal/config"
	"thermite/roles"
)

// The CPU weights row against the kernel's weights as the broker reads
// them: it holds for the rig's rule (each group of the rig's own at least
// every lane and agent together, lanes and agents alike), names the group
// at fault when a lane outweighs another or the rig's own work weighs as
// one lane (a flood of lanes then takes the controller's CPU), and says
// off, and why, where the rig has no weights.
func TestCPUWeightsRowCatchesTheRigWeighedAsALane(t *testing.T) {
	cfg := config.Default()
	cfg.Lanes, cfg.TimingUsers = 2, 1
	table, err := roles.FromConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	good := func() map[string]int64 {
		return map[string]int64{"lane-1": 100, "lane-2": 100, "agent-1": 100, "agent-2": 100,
			"builder": 400, "run": 400, "planner": 400, "model-check": 400, "controller.daemon": 400}
	}
	cases := []struct {
		name   string
		change func(c *Context)
		want   string // "" holds; Off: said off
	}{
		{"the rig's rule", func(*Context) {}, ""},
		{"the controller weighed as one lane", func(c *Context) { c.CPUWeights["controller.daemon"] = 100 }, "controller.daemon weighs 100, less than the 4 lanes' and agents' 400 together"},
		{"the builder below the lanes together", func(c *Context) { c.CPUWeights["builder"] = 399 }, "builder weighs 399, less than"},
		{"a lane heavier than another", func(c *Context) { c.CPUWeights["lane-2"] = 200 }, "lane-2 weighs 200, agent-1 100"},
		{"the controller's group not read", func(c *Context) { delete(c.CPUWeights, "controller.daemon") }, "no weight read for the controller daemon's group thermite/controller.daemon"},
		{"a weight unreadable", func(c *Context) { c.CPUWeightsErr = errors.New("cgroup: x/cpu.shares: read: permission denied") }, "permission denied"},
		{"no lane's group", func(c *Context) {
			for _, n := range []string{"lane-1", "lane-2", "agent-1", "agent-2"} {
				delete(c.CPUWeights, n)
			}
		}, "no lane's or agent's group"},
		{"off", func(c *Context) { c.CPUWeightsStatus = "off: no cgroup v1 cpu hierarchy is mounted" }, Off + "no cgroup v1 cpu hierarchy is mounted"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := &Context{Cfg: cfg, Table: table, CtlCgroup: "thermite/controller.daemon", CPUWeights: good(), CPUWeightsStatus: "on: cgroup v2 cpu.weight 400 ..., 100 ..."}
			tc.change(c)
			got := cpuWeightsHold(c)
			switch {
			case tc.want == "" && got != "":
				t.Errorf("fails: %s", got)
			case tc.want != "" && (got == "" || !strings.Contains(got, tc.want)):
				t.Errorf("got %q, want %q", got, tc.want)
			}
			if strings.HasPrefix(got, Off) != strings.HasPrefix(tc.want, Off) {
				t.Errorf("got %q: said off %v, want %v", got, strings.HasPrefix(got, Off), strings.HasPrefix(tc.want, Off))
			}
		})
	}
}
