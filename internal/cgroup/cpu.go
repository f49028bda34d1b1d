package cgroup

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// The bounds of a CPU weight, on cgroup v2's scale (cpu.weight): the
// kernel refuses a value outside them, and 100 is what a group gets when
// nobody sets one.
const (
	WeightMin     = 1
	WeightMax     = 10000
	WeightDefault = 100
)

// The bounds of cgroup v1's cpu.shares.
const (
	sharesMin = 2
	sharesMax = 262144
)

// HasCPU reports whether the tree's groups carry the cpu controller, so
// that a CPU weight holds in the kernel; CPUWhy says why not.
func (t *Tree) HasCPU() bool { return t.ctl["cpu"] != nil }

// CPUWhy is why the tree has no cpu controller, "" when it has one.
func (t *Tree) CPUWhy() string {
	if t.HasCPU() {
		return ""
	}
	if t.cpuWhy == "" {
		return "the tree has no cpu controller"
	}
	return t.cpuWhy
}

// CPUWeightFile is the kernel file a group's CPU weight is in: cpu.weight
// on cgroup v2, cpu.shares on v1.
func (t *Tree) CPUWeightFile() string {
	if t.Version == 2 {
		return "cpu.weight"
	}
	return "cpu.shares"
}

// SharesOf is the v1 cpu.shares the kernel gives a v2 cpu.weight of w
// (w×1024/100, rounded to the closest; sched_weight_from_cgroup), kept
// within v1's bounds.
func SharesOf(w int64) int64 {
	return min(max((w*1024+50)/100, sharesMin), sharesMax)
}

// weightOfShares is the v2 cpu.weight the kernel shows for v1 cpu.shares
// s (sched_weight_to_cgroup), kept within v2's bounds.
func weightOfShares(s int64) int64 {
	return min(max((s*100+512)/1024, WeightMin), WeightMax)
}

// setCPUWeight writes the group's CPU weight w (v2's scale) to the
// kernel: cpu.weight on v2, its cpu.shares on v1.
func (g *Group) setCPUWeight(w int64) error {
	d, ok := g.ctl["cpu"]
	if !ok {
		return fmt.Errorf("cgroup: group %s: a CPU weight, but %s", g.Name, g.tree.CPUWhy())
	}
	if w < WeightMin || w > WeightMax {
		return fmt.Errorf("cgroup: group %s: CPU weight %d is out of range %d..%d", g.Name, w, WeightMin, WeightMax)
	}
	v := w
	if g.tree.Version == 1 {
		v = SharesOf(w)
	}
	return g.tree.sys.write(filepath.Join(d, g.tree.CPUWeightFile()), strconv.FormatInt(v, 10))
}

// CPUWeight is the group's CPU weight as the kernel holds it now, on v2's
// scale (a v1 group's cpu.shares turned back), and the file it was read
// from.
func (g *Group) CPUWeight() (int64, string, error) {
	d, ok := g.ctl["cpu"]
	if !ok {
		return 0, "", fmt.Errorf("cgroup: group %s: %s", g.Name, g.tree.CPUWhy())
	}
	p := filepath.Join(d, g.tree.CPUWeightFile())
	s, err := g.tree.sys.read(p)
	if err != nil {
		return 0, p, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return 0, p, fmt.Errorf("cgroup: %s: %q is not a number", p, strings.TrimSpace(s))
	}
	if g.tree.Version == 1 {
		n = weightOfShares(n)
	}
	return n, p, nil
}

// dropController leaves the optional controller c out of the tree after
// its hierarchy (v1) or its enabling (v2) failed; the caller says why. A
// v1 hierarchy left with no controller of the tree's is dropped, its
// parent group removed.
func (t *Tree) dropController(h *hier, c string) {
	delete(t.ctl, c)
	var rest []string
	for _, x := range h.controllers {
		if x != c {
			rest = append(rest, x)
		}
	}
	h.controllers = rest
	if len(rest) > 0 || t.Version == 2 {
		return
	}
	_ = t.sys.rmdir(h.dir)
	for i, x := range t.hier {
		if x == h {
			t.hier = append(t.hier[:i], t.hier[i+1:]...)
			break
		}
	}
}
