//go:build linux && (amd64 || arm64)

package seccomp

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The fields of struct seccomp_data, the input every filter reads:
//
//	struct seccomp_data { int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]; };
//
// A classic BPF program reads it in 32-bit words only, in the machine's
// byte order (the kernel rewrites each load as a native 32-bit load).
const (
	offsetNr   = 0
	offsetArch = 4
	offsetArgs = 16
)

// maxInstructions is BPF_MAXINSNS: the kernel refuses a longer program.
const maxInstructions = 4096

// label names a place in a program under construction; jumps to it are
// resolved when the program is assembled. The zero label is "the next
// instruction".
type label int

const next label = 0

// assembler collects a classic BPF program whose conditional jumps name
// labels instead of counted offsets, so that no decision depends on
// counting instructions by hand.
type assembler struct {
	instructions []bpf.Instruction
	places       map[label]int // where each placed label is
	jumps        []pendingJump
	labels       label // the last label handed out
	claimed      map[uint32]string
	rules        []rule // in the order they were made
	groups       int
	dispatched   bool
	aliases      map[label]label // a label that stands where another does
	returns      map[uint32]label
	// inlineReturns makes decide return in place, as the linear
	// reference in the tests builds it; otherwise every decision jumps
	// to one shared return per action, placed at the end.
	inlineReturns bool
	err           error
}

// pendingJump is a bpf.JumpIf at instruction at, whose skips are not known
// until its labels are placed.
type pendingJump struct {
	at              int
	ifTrue, ifFalse label
}

func newAssembler() *assembler {
	return &assembler{places: map[label]int{}, claimed: map[uint32]string{}, aliases: map[label]label{}, returns: map[uint32]label{}}
}

func (a *assembler) fail(err error) {
	if a.err == nil {
		a.err = err
	}
}

// newLabel returns a label not yet used in this program.
func (a *assembler) newLabel() label {
	a.labels++
	return a.labels
}

// place puts l at the next instruction.
func (a *assembler) place(l label) {
	if _, ok := a.places[l]; ok {
		a.fail(fmt.Errorf("seccomp: label %d placed twice", l))
		return
	}
	a.places[l] = len(a.instructions)
}

func (a *assembler) emit(in bpf.Instruction) { a.instructions = append(a.instructions, in) }

// jumpIf compares the accumulator with value and goes on at ifTrue or ifFalse.
func (a *assembler) jumpIf(cond bpf.JumpTest, value uint32, ifTrue, ifFalse label) {
	a.jumps = append(a.jumps, pendingJump{at: len(a.instructions), ifTrue: ifTrue, ifFalse: ifFalse})
	a.emit(bpf.JumpIf{Cond: cond, Val: value})
}

// jump goes on at l unconditionally.
func (a *assembler) jump(l label) { a.jumpIf(bpf.JumpEqual, 0, l, l) }

func (a *assembler) ret(action uint32) { a.emit(bpf.RetConstant{Val: action}) }

func (a *assembler) loadNr()   { a.emit(bpf.LoadAbsolute{Off: offsetNr, Size: 4}) }
func (a *assembler) loadArch() { a.emit(bpf.LoadAbsolute{Off: offsetArch, Size: 4}) }

// loadArgLow loads the low 32 bits of argument i. The kernel reads int,
// unsigned int, umode_t and the clone flags arguments from these bits only,
// so a check on them cannot be dodged with garbage in the high half.
func (a *assembler) loadArgLow(i int) {
	a.emit(bpf.LoadAbsolute{Off: uint32(offsetArgs + 8*i + argLowWord), Size: 4})
}

// loadArgHigh loads the high 32 bits of argument i, for an argument the
// kernel reads as a whole long.
func (a *assembler) loadArgHigh(i int) {
	a.emit(bpf.LoadAbsolute{Off: uint32(offsetArgs + 8*i + argHighWord), Size: 4})
}

// decide ends a block: it returns ifTrue when the accumulator passes the
// test, ifFalse when it does not.
func (a *assembler) decide(cond bpf.JumpTest, value uint32, ifTrue, ifFalse uint32) {
	if !a.inlineReturns {
		a.jumpIf(cond, value, a.returnOf(ifTrue), a.returnOf(ifFalse))
		return
	}
	otherwise := a.newLabel()
	a.jumpIf(cond, value, next, otherwise)
	a.ret(ifTrue)
	a.place(otherwise)
	a.ret(ifFalse)
}

// returnOf is the label of the program's one shared return of action,
// placed at its end by placeReturns. Sharing them keeps the program short:
// the kernel compiles every instruction each time a filter is attached.
func (a *assembler) returnOf(action uint32) label {
	l, ok := a.returns[action]
	if !ok {
		l = a.newLabel()
		a.returns[action] = l
	}
	return l
}

// exitLabel is a label a block may jump to from anywhere to return
// action: the shared return; where decisions return in place (the linear
// reference), a label the block places with placeExit after its last
// decision.
func (a *assembler) exitLabel(action uint32) label {
	if !a.inlineReturns {
		return a.returnOf(action)
	}
	return a.newLabel()
}

// placeExit places what exitLabel made, when it must be placed.
func (a *assembler) placeExit(l label, action uint32) {
	if a.inlineReturns {
		a.place(l)
		a.ret(action)
	}
}

// placeReturns ends the program with the shared returns, ALLOW last: the
// answer for every call no rule names.
func (a *assembler) placeReturns() {
	for _, action := range slices.Sorted(maps.Keys(a.returns)) {
		if action != actionAllow {
			a.place(a.returns[action])
			a.ret(action)
		}
	}
	if l, ok := a.returns[actionAllow]; ok {
		a.place(l)
		a.ret(actionAllow)
	}
}

// alias makes l stand wherever target is placed.
func (a *assembler) alias(l, target label) {
	if _, ok := a.aliases[l]; ok {
		a.fail(fmt.Errorf("seccomp: label %d aliased twice", l))
		return
	}
	a.aliases[l] = target
}

func (a *assembler) and(mask uint32) { a.emit(bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: mask}) }

// rule is how the filter decides one system call: by its number alone
// (body nil: action, whatever the arguments), or by body's argument checks.
type rule struct {
	nr     uint32
	why    string
	action uint32
	body   func()
	group  int // the denyCalls call that made it (for the linear reference in the tests)
}

// claim records that the rule why decides system call nr. Each number is
// decided by one rule, whose block ends in a return on every path:
// deciding it twice is a mistake in this package, refused when the
// program is built.
func (a *assembler) claim(r rule) {
	if prev, ok := a.claimed[r.nr]; ok {
		a.fail(fmt.Errorf("seccomp: system call %d decided twice (%s, %s)", r.nr, prev, r.why))
		return
	}
	a.claimed[r.nr] = r.why
	a.rules = append(a.rules, r)
}

// denyCalls returns action for each of nrs, whatever their arguments.
func (a *assembler) denyCalls(why string, action uint32, nrs ...uint32) {
	a.groups++
	for _, nr := range nrs {
		a.claim(rule{nr: nr, why: why, action: action, group: a.groups})
	}
}

// syscallBlock decides nr by the argument checks body emits. body runs
// with the accumulator holding nr, and every path through it must end in
// a return.
func (a *assembler) syscallBlock(why string, nr uint32, body func()) {
	a.claim(rule{nr: nr, why: why, body: body})
}

// segment is a run of system-call numbers [lo, hi] that one leaf of the
// dispatch decides: a rule's block, or a constant action for the whole run.
type segment struct {
	lo, hi uint32
	action uint32
	body   func()
}

// segments cuts the whole number space into runs, in order: each rule with
// a block is a run of one number; neighbouring numbers with the same
// constant action (a rule's, or otherwise for the numbers no rule decides)
// are one run.
func segments(rules []rule, otherwise uint32) []segment {
	sorted := slices.Clone(rules)
	slices.SortFunc(sorted, func(x, y rule) int { return cmp.Compare(x.nr, y.nr) })
	var out []segment
	add := func(s segment) {
		if n := len(out); n > 0 && s.body == nil && out[n-1].body == nil && out[n-1].action == s.action {
			out[n-1].hi = s.hi
			return
		}
		out = append(out, s)
	}
	lo := uint32(0)
	for _, r := range sorted {
		if r.nr > lo {
			add(segment{lo: lo, hi: r.nr - 1, action: otherwise})
		}
		add(segment{lo: r.nr, hi: r.nr, action: r.action, body: r.body})
		lo = r.nr + 1 // no rule claims 0xFFFFFFFF, the skipped call
	}
	add(segment{lo: lo, hi: math.MaxUint32, action: otherwise})
	return out
}

// dispatch ends the program: with the accumulator holding the system-call
// number, a balanced binary search over the rules' numbers reaches the one
// rule for it, or otherwise; then the shared returns. The kernel runs the
// filter for every call that needs arguments, and when a filter is
// attached emulates it for every system-call number to find the calls it
// always allows (seccomp_cache_prepare_bitmap, since 5.11): a search costs
// both about log2(rules) comparisons, where a list in sequence costs one
// per rule. Every jump goes forward at most 255 instructions (classic
// BPF's reach); the program is far shorter, and assemble refuses one that
// is not.
func (a *assembler) dispatch(otherwise uint32) {
	a.dispatched = true
	start := len(a.instructions)
	entry := a.search(segments(a.rules, otherwise))
	a.placeReturns()
	// The search begins right here; with no rule at all, it is the one
	// shared return, placed here too.
	if at, ok := a.resolve(entry); !ok || at != start {
		a.fail(fmt.Errorf("seccomp: the dispatch starts at %d, not where the architecture check ends (%d)", at, start))
	}
}

// newLabelHere is a new label placed at the next instruction.
func (a *assembler) newLabelHere() label {
	l := a.newLabel()
	a.place(l)
	return l
}

// search emits the decision for segs, which cover a contiguous run of
// numbers the accumulator is known to lie in, and returns where that
// decision starts: a constant answer is the shared return itself.
func (a *assembler) search(segs []segment) label {
	if len(segs) == 1 {
		s := segs[0]
		if s.body == nil {
			return a.returnOf(s.action)
		}
		// The search has narrowed the number to [lo, hi]: a block must
		// be reached for its own call alone.
		if s.lo != s.hi {
			a.fail(fmt.Errorf("seccomp: a block for the %d numbers %d to %d", s.hi-s.lo+1, s.lo, s.hi))
		}
		start := a.newLabelHere()
		s.body()
		return start
	}
	mid := len(segs) / 2
	start, lower, upper := a.newLabelHere(), a.newLabel(), a.newLabel()
	a.jumpIf(bpf.JumpGreaterOrEqual, segs[mid].lo, upper, lower)
	a.alias(lower, a.search(segs[:mid]))
	a.alias(upper, a.search(segs[mid:]))
	return start
}

// assemble resolves the labels and encodes the program for the kernel.
func (a *assembler) assemble() ([]unix.SockFilter, error) {
	if a.err != nil {
		return nil, a.err
	}
	if len(a.rules) > 0 && !a.dispatched {
		return nil, fmt.Errorf("seccomp: %d rules made but never dispatched", len(a.rules))
	}
	for _, j := range a.jumps {
		in := a.instructions[j.at].(bpf.JumpIf)
		skipTrue, err := a.skipTo(j.at, j.ifTrue)
		if err != nil {
			return nil, err
		}
		skipFalse, err := a.skipTo(j.at, j.ifFalse)
		if err != nil {
			return nil, err
		}
		in.SkipTrue, in.SkipFalse = skipTrue, skipFalse
		a.instructions[j.at] = in
	}
	if n := len(a.instructions); n == 0 || n > maxInstructions {
		return nil, fmt.Errorf("seccomp: the program has %d instructions, not 1 to %d", n, maxInstructions)
	}
	if _, ok := a.instructions[len(a.instructions)-1].(bpf.RetConstant); !ok {
		return nil, fmt.Errorf("seccomp: the program does not end in a return")
	}
	raw, err := bpf.Assemble(a.instructions)
	if err != nil {
		return nil, fmt.Errorf("seccomp: assembling the program: %w", err)
	}
	out := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		out[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return out, nil
}

// skipTo is the 8-bit forward offset from the jump at `at` to l. Classic
// BPF only jumps forward, so a program cannot loop.
func (a *assembler) skipTo(at int, l label) (uint8, error) {
	if l == next {
		return 0, nil
	}
	target, ok := a.resolve(l)
	if !ok {
		return 0, fmt.Errorf("seccomp: jump at %d to label %d, which is never placed", at, l)
	}
	skip := target - at - 1
	if skip < 0 || skip > 255 {
		return 0, fmt.Errorf("seccomp: jump at %d to %d does not fit a conditional jump", at, target)
	}
	return uint8(skip), nil
}

// resolve is where l is placed, through its aliases.
func (a *assembler) resolve(l label) (int, bool) {
	for range len(a.aliases) + 1 {
		to, ok := a.aliases[l]
		if !ok {
			break
		}
		l = to
	}
	at, ok := a.places[l]
	return at, ok
}
