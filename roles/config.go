package roles

import (
	"fmt"

	"thermite/internal/config"
)

// FromConfig builds the rig's table from its configuration. The GPU layout
// decides the GPU groups: one shared group "gpu" held by the timing user,
// or one group per dedicated card, gpu-N, held by that card's timing user.
// A lane's development run gets a card's group for that run only.
func FromConfig(c config.Config) (*Table, error) {
	s := Spec{Prefix: c.RolePrefix, Base: c.UIDBase, Lanes: c.Lanes, TimingUsers: c.TimingUsers, GroupMembers: map[string][]string{}}
	switch c.GPU.Layout {
	case "shared":
		s.GPUGroups = []string{"gpu"}
		s.GroupMembers["gpu"] = []string{"run"}
	case "dedicated":
		// "gpu" holds the control nodes every command with a card needs;
		// gpu-N holds card N.
		s.GPUGroups = []string{"gpu"}
		for n := 0; n < c.TimingUsers; n++ {
			g := fmt.Sprintf("gpu-%d", n)
			s.GPUGroups = append(s.GPUGroups, g)
			timing := "run"
			if n > 0 {
				timing = fmt.Sprintf("run-%d", n+1)
			}
			s.GroupMembers[g] = []string{timing}
			s.GroupMembers["gpu"] = append(s.GroupMembers["gpu"], timing)
		}
	}
	return New(s)
}
