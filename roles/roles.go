// Package roles is the role table: every kind of work the rig runs has its
// own Unix user, and this is the one place that says which uid is which.
package roles

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Kind is what a role user is for.
type Kind string

// The kinds of role. The set is closed: policy tables key on these.
const (
	Controller Kind = "controller"
	Builder    Kind = "builder"
	Timing     Kind = "timing"
	Planner    Kind = "planner"
	ModelCheck Kind = "model-check"
	Lane       Kind = "lane"
	Agent      Kind = "agent"
	Supervisor Kind = "supervisor"
)

// Offsets of each role's uid from the base (README.md, "Roles").
const (
	offController  = 0
	offBuilder     = 1
	offRun         = 2
	offPlanner     = 3
	offModelCheck  = 4
	offRunN        = 8 // run-N is base+8+N, so run-2 is base+10
	offLane        = 100
	offAgent       = 200
	offSupervisor  = 300
	offGPUShared   = 400
	offGPUDedicate = 401 // gpu-N is base+401+N
)

// Role is one user of the table.
type Role struct {
	Name    string `json:"name"` // the role's name without the prefix, e.g. "lane-3"
	User    string `json:"user"` // the Unix user name: prefix + name
	UID     int    `json:"uid"`
	GID     int    `json:"gid"`
	Groups  []int  `json:"groups"` // supplementary groups: only the GPU groups its layout gives
	Kind    Kind   `json:"kind"`
	Index   int    `json:"index,omitempty"` // lane or agent number, or timing card number (1-based)
	Purpose string `json:"purpose"`
}

// Group is a group that is not some role's own: the GPU groups.
type Group struct {
	Name    string   `json:"name"` // without the prefix
	Unix    string   `json:"unix"` // prefix + name
	GID     int      `json:"gid"`
	Members []string `json:"members"` // unix user names
}

// Table is the whole role table of one rig.
type Table struct {
	Prefix string  `json:"prefix"`
	Base   int     `json:"uid_base"`
	Roles  []Role  `json:"roles"`
	Groups []Group `json:"groups"`
	byName map[string]int
	byUID  map[int]int
}

// Spec is what the table is made from.
type Spec struct {
	Prefix      string
	Base        int
	Lanes       int
	TimingUsers int
	// GPUGroups names the GPU groups of the layout: "gpu" for one shared
	// card, "gpu-0", "gpu-1"… for dedicated cards. Empty without GPUs.
	GPUGroups []string
	// GroupMembers maps a GPU group to the role names that hold it.
	GroupMembers map[string][]string
}

// New builds the table.
func New(s Spec) (*Table, error) {
	if s.Lanes < 1 || s.Lanes > 99 {
		return nil, fmt.Errorf("roles: %d lanes is out of range 1..99", s.Lanes)
	}
	if s.TimingUsers < 1 || s.TimingUsers > 90 {
		return nil, fmt.Errorf("roles: %d timing users is out of range 1..90", s.TimingUsers)
	}
	t := &Table{Prefix: s.Prefix, Base: s.Base}
	add := func(name string, off int, kind Kind, idx int, purpose string) {
		t.Roles = append(t.Roles, Role{
			Name: name, User: s.Prefix + name, UID: s.Base + off, GID: s.Base + off,
			Groups: []int{}, Kind: kind, Index: idx, Purpose: purpose,
		})
	}
	add("thermite", offController, Controller, 0, "the controller: ledger, judge, planner and scheduler, harness API")
	add("builder", offBuilder, Builder, 0, "the judge's builds of each change")
	add("run", offRun, Timing, 1, "the judge's timed runs (first judge GPU)")
	add("planner", offPlanner, Planner, 0, "the planner's calls")
	add("model-check", offModelCheck, ModelCheck, 0, "the model check")
	for n := 2; n <= s.TimingUsers; n++ {
		add(fmt.Sprintf("run-%d", n), offRunN+n, Timing, n, fmt.Sprintf("the judge's timed runs on judge GPU %d", n))
	}
	for n := 1; n <= s.Lanes; n++ {
		add(fmt.Sprintf("lane-%d", n), offLane+n, Lane, n, fmt.Sprintf("lane %d's commands and file tools", n))
	}
	for n := 1; n <= s.Lanes; n++ {
		add(fmt.Sprintf("agent-%d", n), offAgent+n, Agent, n, fmt.Sprintf("lane %d's worker agent", n))
	}
	add("supervisor", offSupervisor, Supervisor, 0, "the supervisor (one-container images only)")
	t.index()
	for _, g := range s.GPUGroups {
		gid := s.Base + offGPUShared
		if g != "gpu" {
			n, err := strconv.Atoi(strings.TrimPrefix(g, "gpu-"))
			if err != nil || !strings.HasPrefix(g, "gpu-") || n < 0 || n > 98 {
				return nil, fmt.Errorf("roles: GPU group %q is not gpu or gpu-N", g)
			}
			gid = s.Base + offGPUDedicate + n
		}
		grp := Group{Name: g, Unix: s.Prefix + g, GID: gid, Members: []string{}}
		for _, member := range s.GroupMembers[g] {
			ri, ok := t.byName[member]
			if !ok {
				return nil, fmt.Errorf("roles: GPU group %q names unknown role %q", g, member)
			}
			t.Roles[ri].Groups = append(t.Roles[ri].Groups, gid)
			grp.Members = append(grp.Members, t.Roles[ri].User)
		}
		t.Groups = append(t.Groups, grp)
	}
	for i := range t.Roles {
		sort.Ints(t.Roles[i].Groups)
	}
	return t, nil
}

func (t *Table) index() {
	t.byName = make(map[string]int, len(t.Roles))
	t.byUID = make(map[int]int, len(t.Roles))
	for i, r := range t.Roles {
		t.byName[r.Name] = i
		t.byUID[r.UID] = i
	}
}

// Role finds a role by its name without the prefix ("lane-3").
func (t *Table) Role(name string) (Role, bool) {
	i, ok := t.byName[name]
	if !ok {
		return Role{}, false
	}
	return t.Roles[i], true
}

// ByUID finds the role a uid belongs to.
func (t *Table) ByUID(uid int) (Role, bool) {
	i, ok := t.byUID[uid]
	if !ok {
		return Role{}, false
	}
	return t.Roles[i], true
}

// Controller is the controller's role.
func (t *Table) Controller() Role { return t.Roles[t.byName["thermite"]] }

// Lane is lane n's role.
func (t *Table) Lane(n int) (Role, bool) { return t.Role(fmt.Sprintf("lane-%d", n)) }

// Agent is agent n's role.
func (t *Table) Agent(n int) (Role, bool) { return t.Role(fmt.Sprintf("agent-%d", n)) }

// Timing is the timing user for judge card n (1-based: run, run-2, …).
func (t *Table) Timing(n int) (Role, bool) {
	if n == 1 {
		return t.Role("run")
	}
	return t.Role(fmt.Sprintf("run-%d", n))
}

// UIDs lists every role's uid.
func (t *Table) UIDs() []int {
	out := make([]int, len(t.Roles))
	for i, r := range t.Roles {
		out[i] = r.UID
	}
	return out
}

// StopsAfterEachCommand says whether the broker stops what a role's user
// still runs after each of its commands. A lane's leftovers live until its
// trial ends, so that a lane can keep a server running between commands;
// the controller's user is the controller itself, which its supervisor
// stops only when the controller exits.
func (r Role) StopsAfterEachCommand() bool { return r.Kind != Lane && r.Kind != Controller }
