//go:build linux && (amd64 || arm64)

package seccomp

import (
	"fmt"

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
	err          error
}

// pendingJump is a bpf.JumpIf at instruction at, whose skips are not known
// until its labels are placed.
type pendingJump struct {
	at              int
	ifTrue, ifFalse label
}

func newAssembler() *assembler {
	return &assembler{places: map[label]int{}, claimed: map[uint32]string{}}
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
	otherwise := a.newLabel()
	a.jumpIf(cond, value, next, otherwise)
	a.ret(ifTrue)
	a.place(otherwise)
	a.ret(ifFalse)
}

func (a *assembler) and(mask uint32) { a.emit(bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: mask}) }

// claim records that the rule why decides system call nr. The checks for
// one call are a single block that ends in a return on every path, so a
// second block for the same number would never be reached: claiming it
// twice is a mistake in this package, refused when the program is built.
func (a *assembler) claim(nr uint32, why string) {
	if prev, ok := a.claimed[nr]; ok {
		a.fail(fmt.Errorf("seccomp: system call %d decided twice (%s, %s)", nr, prev, why))
		return
	}
	a.claimed[nr] = why
}

// denyCalls returns action for each of nrs, whatever their arguments.
// The accumulator must hold the system call number, and still does after.
func (a *assembler) denyCalls(why string, action uint32, nrs ...uint32) {
	if len(nrs) == 0 {
		return
	}
	matched, skip := a.newLabel(), a.newLabel()
	for _, nr := range nrs {
		a.claim(nr, why)
		a.jumpIf(bpf.JumpEqual, nr, matched, next)
	}
	a.jump(skip)
	a.place(matched)
	a.ret(action)
	a.place(skip)
}

// syscallBlock emits the argument checks of one system call: body runs
// only when the accumulator holds nr, and every path through body must end
// in a return (the accumulator no longer holds the number after it).
func (a *assembler) syscallBlock(why string, nr uint32, body func()) {
	a.claim(nr, why)
	skip := a.newLabel()
	a.jumpIf(bpf.JumpEqual, nr, next, skip)
	body()
	a.place(skip)
}

// assemble resolves the labels and encodes the program for the kernel.
func (a *assembler) assemble() ([]unix.SockFilter, error) {
	if a.err != nil {
		return nil, a.err
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
	target, ok := a.places[l]
	if !ok {
		return 0, fmt.Errorf("seccomp: jump at %d to label %d, which is never placed", at, l)
	}
	skip := target - at - 1
	if skip < 0 || skip > 255 {
		return 0, fmt.Errorf("seccomp: jump at %d to %d does not fit a conditional jump", at, target)
	}
	return uint8(skip), nil
}
