// Package cpuset parses and prints CPU lists in the kernel's form ("0-3,8").
package cpuset

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

// Set is a sorted list of distinct CPU numbers.
type Set []int

// MaxCPU bounds CPU numbers so a typo cannot ask for a huge mask.
const MaxCPU = 4095

// Parse reads a list such as "0-3,8". An empty string is the empty set.
func Parse(s string) (Set, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	seen := map[int]bool{}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 || a > MaxCPU {
			return nil, fmt.Errorf("%q is not a CPU list like 0-3,8", s)
		}
		b := a
		if isRange {
			b, err = strconv.Atoi(hi)
			if err != nil || b < a || b > MaxCPU {
				return nil, fmt.Errorf("%q is not a CPU list like 0-3,8", s)
			}
		}
		for i := a; i <= b; i++ {
			seen[i] = true
		}
	}
	out := make(Set, 0, len(seen))
	for c := range seen {
		out = append(out, c)
	}
	sort.Ints(out)
	return out, nil
}

// String prints the set in the kernel's list form.
func (s Set) String() string {
	var b strings.Builder
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if j == i {
			fmt.Fprintf(&b, "%d", s[i])
		} else {
			fmt.Fprintf(&b, "%d-%d", s[i], s[j])
		}
		i = j + 1
	}
	return b.String()
}

// Contains reports whether every CPU of o is in s.
func (s Set) Contains(o Set) bool {
	m := make(map[int]bool, len(s))
	for _, c := range s {
		m[c] = true
	}
	for _, c := range o {
		if !m[c] {
			return false
		}
	}
	return true
}

// Minus is s without the CPUs of o.
func (s Set) Minus(o Set) Set {
	m := make(map[int]bool, len(o))
	for _, c := range o {
		m[c] = true
	}
	var out Set
	for _, c := range s {
		if !m[c] {
			out = append(out, c)
		}
	}
	return out
}

// Intersects reports whether s and o share a CPU.
func (s Set) Intersects(o Set) bool {
	return len(s.Minus(o)) != len(s)
}

// Online is the set of CPUs this process may run on: its own affinity,
// which inside a container is what the container was given.
func Online() (Set, error) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			return Parse(v)
		}
	}
	return nil, fmt.Errorf("/proc/self/status has no Cpus_allowed_list")
}
