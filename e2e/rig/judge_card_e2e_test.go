package rig

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"thermite/internal/testrig"
)

// TestLaneHoldingHeldCardStoppedAndReopenRefused: two lane processes
// started with card 0 before a timed run on card 0, one keeping the card
// open, one opening it again and again. At the hold's start both are
// stopped, and the ledger says so; during the hold a lane command opening
// the card gets EACCES (the node is the timing user's group's, 0660) and
// one asking for the card is refused; after the run, a lane command with
// card 0 opens it again.
func TestLaneHoldingHeldCardStoppedAndReopenRefused(t *testing.T) {
	r := testrig.New(t, testrig.Options{GPUs: 1, TimingUsers: 1})
	card := cardPath(r, 0)
	home, stderr, code := r.RunAs("lane-1", nil, "sh", "-c", "echo $HOME")
	if code != 0 {
		t.Fatalf("lane-1 HOME: %s", stderr)
	}
	log := filepath.Join(strings.TrimSpace(home), "opens.log")
	// The opener opens in a subshell: a refused redirection on the special
	// built-in ":" ends a POSIX shell, so the loop would end by itself once
	// the hold closes the node, racing the broker that must stop it.
	out, stderr, code := r.RunAs("lane-1", []string{"--gpus", "0"}, "sh", "-c",
		`(exec 3<>"$0"; exec sleep 60) >/dev/null 2>&1 & echo $!
(while :; do if ( : 3<>"$0" ) 2>/dev/null; then echo ok; else echo refused; fi; sleep 0.05; done) >"$1" 2>&1 & echo $!`, card, log)
	if code != 0 {
		t.Fatalf("lane-1 with card 0: exit %d %s", code, stderr)
	}
	var pids []int
	for _, f := range strings.Fields(out) {
		p, _ := strconv.Atoi(f)
		pids = append(pids, p)
		defer syscall.Kill(p, syscall.SIGKILL)
	}
	if len(pids) != 2 {
		t.Fatalf("lane-1 started %q", out)
	}
	holder, opener := pids[0], pids[1]
	if !waitFor(5*time.Second, func() bool {
		data, _ := os.ReadFile(log)
		_, open := holdsOpen(holder, card)
		return open && strings.Contains(string(data), "ok")
	}) {
		t.Fatalf("lane-1 does not have card 0 open before the hold")
	}
	b := sleepKit(t, r, "card", "exec sleep 3", 1)
	done := startTime(t, r, b.ID, "card")
	waitHold(t, r, "run", done)
	for _, p := range []int{holder, opener} {
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(p), "fd")); err == nil {
			if st, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p), "stat")); !strings.Contains(string(st), ") Z ") {
				t.Errorf("lane process %d, given card 0 before the hold, still runs during it", p)
			}
		}
	}
	if got := r.Probe("lane-1", "open-dev", card); got != "EACCES" {
		t.Errorf("lane-1 opens held card 0: %s, want EACCES", got)
	}
	if _, stderr, code := r.RunAs("lane-1", []string{"--gpus", "0"}, "true"); code == 0 || !strings.Contains(stderr, "held by a timed run") {
		t.Errorf("lane-1 asks for held card 0: exit %d %q", code, stderr)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(card, &st); err != nil || int(st.Gid) != r.Role("run").GID || st.Mode&0o777 != 0o660 {
		t.Errorf("held card 0 node: gid %d mode %o, want the timing user's group %d, 0660", st.Gid, st.Mode&0o777, r.Role("run").GID)
	}
	tr := <-done
	if tr.Status != "scored" {
		t.Fatalf("run: %+v", tr)
	}
	export, _, _ := r.Thermite("ledger", "export")
	for _, p := range []int{holder, opener} {
		if !strings.Contains(export, "judge.card_stopped") || !strings.Contains(export, "pid "+strconv.Itoa(p)+" (lane-1) was given card 0: stopped") {
			t.Errorf("the ledger does not record stopped lane process %d:\n%.3000s", p, export)
		}
	}
	if out, stderr, code := r.RunAs("lane-1", []string{"--gpus", "0"}, r.Bin, "__probe", "try", "open-dev", card); code != 0 || strings.TrimSpace(out) != "ok" {
		t.Errorf("after the run lane-1 with card 0 opens it: %q %q", out, stderr)
	}
}

// holdsOpen reports whether pid has path open.
func holdsOpen(pid int, path string) (string, bool) {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", false
	}
	for _, e := range ents {
		if target, _ := os.Readlink(filepath.Join(dir, e.Name())); target == path {
			return e.Name(), true
		}
	}
	return "", false
}
