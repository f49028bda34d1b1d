//go:build linux && (amd64 || arm64)

package seccomp

import (
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// linearProgram is the filter as this package built it before the
// dispatch (up to commit 37fc232): the same rules, tested one after the
// other in the order makeRules makes them, then ALLOW. It is kept here
// only as the reference the dispatched program must agree with.
func linearProgram(o Options) ([]unix.SockFilter, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	a := newAssembler()
	a.inlineReturns = true
	checkArchitecture(a)
	makeRules(a, o)
	a.dispatched = true
	rules := a.rules
	for i := 0; i < len(rules); {
		r := rules[i]
		if r.body != nil {
			// One block: entered for its own number, skipped otherwise.
			skip := a.newLabel()
			a.jumpIf(bpf.JumpEqual, r.nr, next, skip)
			r.body()
			a.place(skip)
			i++
			continue
		}
		// The numbers of one denyCalls: a test each, then one return.
		j := i
		for j < len(rules) && rules[j].body == nil && rules[j].group == r.group {
			j++
		}
		matched, skip := a.newLabel(), a.newLabel()
		for _, g := range rules[i:j] {
			a.jumpIf(bpf.JumpEqual, g.nr, matched, next)
		}
		a.jump(skip)
		a.place(matched)
		a.ret(r.action)
		a.place(skip)
		i = j
	}
	a.ret(actionAllow)
	return a.assemble()
}
