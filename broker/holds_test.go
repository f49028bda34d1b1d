package broker

import (
	"reflect"
	"testing"

	"thermite/internal/cpuset"
)

// Two timed runs hold CPUs and cards: every role's group leaves out the
// CPUs of both, each timing user's group is its own CPUs alone, and a
// released hold gives its CPUs and card back. No root needed.
func TestHoldSetSaysWhatIsHeldAndByWhom(t *testing.T) {
	h := newHoldSet()
	h.add("hold-1", 501, cpuset.Set{6, 7}, []int{1})
	h.add("hold-2", 502, cpuset.Set{5, 4}, []int{0})
	if got := h.heldCPUs(); !reflect.DeepEqual(got, cpuset.Set{4, 5, 6, 7}) {
		t.Errorf("held CPUs %v, want 4-7 in order", got)
	}
	if held, own := h.cpusOf(502); !reflect.DeepEqual(held, cpuset.Set{4, 5, 6, 7}) || !reflect.DeepEqual(own, cpuset.Set{4, 5}) {
		t.Errorf("cpusOf(502): held %v own %v, want 4-7 and 4-5", held, own)
	}
	if _, own := h.cpusOf(503); own != nil {
		t.Errorf("a user holding nothing owns %v", own)
	}
	if got := h.heldCards(); !reflect.DeepEqual(got, map[int]bool{0: true, 1: true}) {
		t.Errorf("held cards %v", got)
	}
	if got := h.cardHolders(); !reflect.DeepEqual(got, map[int]int{0: 502, 1: 501}) {
		t.Errorf("card holders %v, want card 0 by 502 and card 1 by 501", got)
	}
	h.drop("hold-1")
	if got := h.heldCPUs(); !reflect.DeepEqual(got, cpuset.Set{4, 5}) {
		t.Errorf("after a release: held CPUs %v, want 4-5", got)
	}
	if got := h.cardHolders(); !reflect.DeepEqual(got, map[int]int{0: 502}) {
		t.Errorf("after a release: card holders %v", got)
	}
	h.drop("hold-2")
	if cpus, cards := h.heldCPUs(), h.heldCards(); cpus != nil || len(cards) != 0 {
		t.Errorf("all released: CPUs %v cards %v still held", cpus, cards)
	}
}
