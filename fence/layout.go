package fence

import (
	"fmt"
	"sort"
	"strings"

	"thermite/roles"
)

// Layout is where each card has its place: which group holds it and which
// timing user times on it. Refused says why GPU work is refused, or "".
type Layout struct {
	Kind    string   `json:"kind"`
	Cards   []Card   `json:"cards"`
	Control []string `json:"control"`
	// Group is each card's group, by card index: "gpu" for the one shared
	// card, "gpu-N" for dedicated card N.
	Group map[int]string `json:"groups"`
	// Timing is each card's timing role, by card index: run, run-2, …
	Timing  map[int]string `json:"timing"`
	Refused string         `json:"refused,omitempty"`
}

// ControlGroup holds the control nodes: every command with a card has it.
const ControlGroup = "gpu"

// Plan places every discovered card in the configured layout. A card
// without a place refuses the whole layout, naming the card: a rig that
// cannot place its cards neither times nor allows development runs, and
// never falls back to sharing them.
func Plan(kind string, d *Devices, timingUsers int) *Layout {
	l := &Layout{Kind: kind, Cards: d.Cards, Control: d.Control, Group: map[int]string{}, Timing: map[int]string{}}
	name := func(c Card) string { return fmt.Sprintf("card %d (%s, %s)", c.Index, c.Path, c.UUID) }
	for _, c := range d.Cards {
		if c.UUID == "" {
			l.Refused = fmt.Sprintf("card %d (%s) has no UUID: no driver information names device minor %d", c.Index, c.Path, c.Minor)
			l.Group, l.Timing = map[int]string{}, map[int]string{}
			return l
		}
	}
	switch kind {
	case "none":
		if len(d.Cards) > 0 {
			l.Refused = fmt.Sprintf("%s has no place: gpu.layout is none", name(d.Cards[0]))
		}
	case "shared":
		switch {
		case len(d.Cards) == 0:
			l.Refused = "gpu.layout is shared but no card was found"
		case len(d.Cards) > 1:
			l.Refused = fmt.Sprintf("%s has no place: the shared layout holds one card", name(d.Cards[1]))
		default:
			l.Group[0] = ControlGroup
			l.Timing[0] = "run"
		}
	case "dedicated":
		if len(d.Cards) == 0 {
			l.Refused = "gpu.layout is dedicated but no card was found"
		}
		for _, c := range d.Cards {
			if c.Index >= timingUsers {
				l.Refused = fmt.Sprintf("%s has no place: timing_users is %d, so cards 0..%d have timing users", name(c), timingUsers, timingUsers-1)
				break
			}
			l.Group[c.Index] = fmt.Sprintf("gpu-%d", c.Index)
			l.Timing[c.Index] = timingRole(c.Index)
		}
	default:
		l.Refused = fmt.Sprintf("gpu.layout %q is not one of none, shared, dedicated", kind)
	}
	if l.Refused != "" {
		l.Group, l.Timing = map[int]string{}, map[int]string{}
	}
	return l
}

func timingRole(card int) string {
	if card == 0 {
		return "run"
	}
	return fmt.Sprintf("run-%d", card+1)
}

// Card finds a card by index.
func (l *Layout) Card(i int) (Card, bool) {
	for _, c := range l.Cards {
		if c.Index == i {
			return c, true
		}
	}
	return Card{}, false
}

// CardsFor decides which cards a role's command may open. A timing user
// may open only the card it times; a lane's development run any placed
// card it is given; every other role none. Nothing is granted on a
// refused layout.
func (l *Layout) CardsFor(r roles.Role, requested []int) ([]int, error) {
	if len(requested) == 0 {
		return nil, nil
	}
	if l.Refused != "" {
		return nil, fmt.Errorf("gpus: GPU work is refused on this rig: %s", l.Refused)
	}
	seen := map[int]bool{}
	var out []int
	for _, i := range requested {
		if seen[i] {
			continue
		}
		seen[i] = true
		if _, ok := l.Card(i); !ok {
			return nil, fmt.Errorf("gpus: card %d does not exist (the rig has %d)", i, len(l.Cards))
		}
		switch r.Kind {
		case roles.Timing:
			if l.Timing[i] != r.Name {
				return nil, fmt.Errorf("gpus: %s may not open card %d (its timing user is %s)", r.Name, i, l.Timing[i])
			}
		case roles.Lane:
		default:
			return nil, fmt.Errorf("gpus: %s may not open GPUs", r.Name)
		}
		out = append(out, i)
	}
	sort.Ints(out)
	return out, nil
}

// Deny is every GPU device file a command that may open cards must not:
// the other cards, and the control nodes when it has no card.
func (l *Layout) Deny(cards []int) []string {
	allowed := map[int]bool{}
	for _, i := range cards {
		allowed[i] = true
	}
	var out []string
	for _, c := range l.Cards {
		if !allowed[c.Index] {
			out = append(out, c.Path)
		}
	}
	if len(cards) == 0 {
		out = append(out, l.Control...)
	}
	return out
}

// Env is CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES: the UUIDs of the
// cards a command may use, or empty when it has none.
func (l *Layout) Env(cards []int) []string {
	var uuids []string
	for _, i := range cards {
		if c, ok := l.Card(i); ok {
			uuids = append(uuids, c.UUID)
		}
	}
	v := strings.Join(uuids, ",")
	return []string{"CUDA_VISIBLE_DEVICES=" + v, "NVIDIA_VISIBLE_DEVICES=" + v}
}

// Groups are the GPU groups a command with cards gets for its run.
func (l *Layout) Groups(cards []int) []string {
	if len(cards) == 0 {
		return nil
	}
	set := map[string]bool{ControlGroup: true}
	for _, i := range cards {
		set[l.Group[i]] = true
	}
	var out []string
	for g := range set {
		out = append(out, g)
	}
	sort.Strings(out)
	return out
}
