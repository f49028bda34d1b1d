#include "textflag.h"

// func rawVfork(trap, a1, a2, a3 uintptr) (r1 uintptr, errno uintptr)
//
// clone with CLONE_VM|CLONE_VFORK and no new stack: the child runs on the
// parent's stack until it execs or exits. The child returns through this
// frame first and then writes over the stack slot of the return address,
// so the address is kept in R12 across the system call (each task has its
// own registers) and pushed back for the parent's return.
TEXT ·rawVfork(SB),NOSPLIT|NOFRAME,$0-48
	MOVQ	a1+8(FP), DI
	MOVQ	a2+16(FP), SI
	MOVQ	a3+24(FP), DX
	MOVQ	$0, R10
	MOVQ	$0, R8
	MOVQ	$0, R9
	MOVQ	trap+0(FP), AX
	POPQ	R12
	SYSCALL
	PUSHQ	R12
	CMPQ	AX, $0xfffffffffffff001
	JLS	ok
	MOVQ	$-1, r1+32(FP)
	NEGQ	AX
	MOVQ	AX, errno+40(FP)
	RET
ok:
	MOVQ	AX, r1+32(FP)
	MOVQ	$0, errno+40(FP)
	RET
