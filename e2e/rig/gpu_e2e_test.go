package rig

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"thermite/internal/rpc"
	"thermite/internal/testrig"
)

func cardPath(r *testrig.Rig, i int) string {
	return filepath.Join(r.Dir, "dev", "nvidia"+itoa(i))
}

func itoa(i int) string { return strconv.Itoa(i) }

// twoJudgeCPUs gives cards 0 and 1 a judge CPU each (0 and 1): each card's
// timed runs need CPUs of their own, and the checks use run and run-2.
const twoJudgeCPUs = "judge_cpus = \"0-1\"\n"

// openAs runs the probe's open-dev as a role with the given flags.
func openAs(t *testing.T, r *testrig.Rig, role string, flags []string, op, path string) string {
	t.Helper()
	out, stderr, code := r.RunAs(role, flags, r.Bin, "__probe", "try", op, path)
	if code != 0 {
		return "refused to run: " + strings.TrimSpace(stderr)
	}
	return strings.TrimSpace(out)
}

// dedicatedChecks is what the dedicated layout of 4 cards must give, with
// the device files fixed by the broker or left open to everyone.
func dedicatedChecks(t *testing.T, r *testrig.Rig) {
	cases := []struct {
		role  string
		flags []string
		op    string
		card  int
		want  string
	}{
		{"run", []string{"--gpus", "0"}, "open-dev", 0, "ok"},
		{"run", []string{"--gpus", "0"}, "open-dev", 1, "EACCES"},
		{"run", []string{"--gpus", "0"}, "ioctl3", 1, "EACCES"},
		{"run", []string{"--gpus", "0"}, "ioctl3", 0, "ok"},
		{"run-2", []string{"--gpus", "1"}, "open-dev", 1, "ok"},
		{"run-2", []string{"--gpus", "1"}, "open-dev", 0, "EACCES"},
		{"run-2", []string{"--gpus", "1"}, "open-dev", 2, "EACCES"},
		{"lane-1", []string{"--gpus", "2"}, "open-dev", 2, "ok"},
		{"lane-1", []string{"--gpus", "2"}, "open-dev", 0, "EACCES"},
		{"lane-1", []string{"--gpus", "2"}, "open-dev", 3, "EACCES"},
		{"lane-1", []string{"--gpus", "2"}, "ioctl3", 3, "EACCES"},
		{"lane-1", nil, "open-dev", 2, "EACCES"},
		{"lane-1", nil, "ioctl3", 0, "EACCES"},
		{"builder", nil, "open-dev", 0, "EACCES"},
		{"agent-1", nil, "ioctl3", 3, "EACCES"},
	}
	for _, c := range cases {
		if got := openAs(t, r, c.role, c.flags, c.op, cardPath(r, c.card)); got != c.want {
			t.Errorf("%s %v %s card %d: got %q, want %q", c.role, c.flags, c.op, c.card, got, c.want)
		}
	}
	for _, ctl := range []string{"nvidiactl", "nvidia-uvm", "nvidia-caps/nvidia-cap1"} {
		p := filepath.Join(r.Dir, "dev", ctl)
		if got := openAs(t, r, "lane-1", nil, "open-dev", p); got != "EACCES" {
			t.Errorf("lane-1 without a card opens %s: %s", ctl, got)
		}
		if got := openAs(t, r, "run", []string{"--gpus", "0"}, "open-dev", p); got != "ok" {
			t.Errorf("run with its card cannot open %s: %s", ctl, got)
		}
	}
	refusals := []struct {
		role  string
		flags []string
		want  string
	}{
		{"run", []string{"--gpus", "1"}, "gpus: run may not open card 1 (its timing user is run-2)"},
		{"builder", []string{"--gpus", "0"}, "gpus: builder may not open GPUs"},
		{"lane-1", []string{"--gpus", "7"}, "gpus: card 7 does not exist"},
	}
	for _, c := range refusals {
		_, stderr, code := r.RunAs(c.role, c.flags, "true")
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("%s %v: exit %d %q, want %q", c.role, c.flags, code, stderr, c.want)
		}
	}
	// The card's UUID, and nothing for a role without one.
	out, _, _ := r.RunAs("run-2", []string{"--gpus", "1"}, "sh", "-c", "echo $CUDA_VISIBLE_DEVICES $NVIDIA_VISIBLE_DEVICES")
	if strings.TrimSpace(out) != testrig.CardUUID(1)+" "+testrig.CardUUID(1) {
		t.Errorf("run-2's CUDA variables: %q", out)
	}
	out, _, _ = r.RunAs("run-2", []string{"--gpus", "1"}, "id", "-G")
	if g := strings.Fields(out); len(g) != 3 {
		t.Errorf("run-2 with card 1 has groups %v, want its own, gpu and gpu-1", g)
	}
	out, _, _ = r.RunAs("lane-1", []string{"--gpus", "2"}, "id", "-G")
	if g := strings.Fields(out); len(g) != 3 {
		t.Errorf("lane-1's development run on card 2 has groups %v, want its own, gpu and gpu-2", g)
	}
	// The self-test's GPU rows hold.
	res, code := selftestJSON(t, r)
	if code != 0 || !res.Holds {
		t.Fatalf("self-test: %s", res.Sentence)
	}
	n := 0
	for _, p := range res.Probes {
		if strings.Contains(p.Attempt, "card") {
			n++
		}
	}
	if n < 3*len(r.Table.Roles) {
		t.Errorf("only %d GPU rows in the self-test", n)
	}
}

func TestGPUDedicatedLayout(t *testing.T) {
	r := testrig.New(t, testrig.Options{GPUs: 4, TimingUsers: 4, Extra: twoJudgeCPUs})
	dedicatedChecks(t, r)
	// The broker put the device files in their groups, 0660.
	var st syscall.Stat_t
	syscall.Stat(cardPath(r, 1), &st)
	if st.Mode&0o7777 != 0o660 || st.Uid != 0 {
		t.Errorf("nvidia1: %o %d:%d", st.Mode&0o7777, st.Uid, st.Gid)
	}
	var g rpc.GPUStatus
	out, _, _ := r.Thermite("gpus", "--json")
	testrig.JSON(t, out, &g)
	if g.Layout != "dedicated" || !g.Usable || len(g.Cards) != 4 || !g.PermsFixed || g.FenceABI < 5 || len(g.Control) != 5 {
		t.Fatalf("gpus: %+v", g)
	}
	out, _, code := r.Thermite("gpus")
	if code != 0 || !strings.Contains(out, "run-2") || !strings.Contains(out, testrig.CardUUID(3)) {
		t.Fatalf("gpus:\n%s", out)
	}
}

// With device files nobody can change (RunPod), left open to everyone,
// the fence alone keeps every role off the cards it was not given.
func TestGPUFenceAloneWhenPermissionsCannotChange(t *testing.T) {
	r := testrig.New(t, testrig.Options{GPUs: 4, TimingUsers: 4, NoStart: true, Extra: twoJudgeCPUs})
	r.FreezeDev()
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	syscall.Stat(cardPath(r, 0), &st)
	if st.Mode&0o777 != 0o666 {
		t.Fatalf("stand-in node is %o: the test needs it open to everyone", st.Mode&0o777)
	}
	dedicatedChecks(t, r)
	s := r.Status()
	if s.GPU.PermsFixed || !strings.Contains(s.GPU.PermsNote, "cannot be changed") {
		t.Errorf("status does not say the permissions cannot be changed: %+v", s.GPU)
	}
	out, _, _ := r.Thermite("status")
	if !strings.Contains(out, "the fence alone keeps roles off the cards") {
		t.Errorf("status:\n%s", out)
	}
	if n := strings.Count(r.LogText(), "device permissions cannot be changed"); n != 1 {
		t.Errorf("the log says it %d times, want once", n)
	}
}

func TestGPUSharedLayout(t *testing.T) {
	r := testrig.New(t, testrig.Options{GPUs: 1, GPULayout: "shared"})
	for _, c := range []struct {
		role  string
		flags []string
		want  string
	}{
		{"run", []string{"--gpus", "0"}, "ok"},
		{"lane-2", []string{"--gpus", "0"}, "ok"},
		{"lane-2", nil, "EACCES"},
		{"planner", nil, "EACCES"},
	} {
		if got := openAs(t, r, c.role, c.flags, "open-dev", cardPath(r, 0)); got != c.want {
			t.Errorf("%s %v: %s, want %s", c.role, c.flags, got, c.want)
		}
	}
	if _, stderr, code := r.RunAs("planner", []string{"--gpus", "0"}, "true"); code == 0 || !strings.Contains(stderr, "planner may not open GPUs") {
		t.Errorf("planner with a card: %d %s", code, stderr)
	}
}

func TestGPUUnplacedCardRefusesGPUWork(t *testing.T) {
	r := testrig.New(t, testrig.Options{GPUs: 4, TimingUsers: 4, Extra: twoJudgeCPUs})
	if got := openAs(t, r, "run", []string{"--gpus", "0"}, "open-dev", cardPath(r, 0)); got != "ok" {
		t.Fatalf("before: %s", got)
	}
	testrig.AddCard(t, r.Dir, 4)
	_, stderr, code := r.RunAs("run", []string{"--gpus", "0"}, "true")
	if code == 0 || !strings.Contains(stderr, "GPU work is refused on this rig: card 4") || !strings.Contains(stderr, "has no place") {
		t.Fatalf("a fifth card: exit %d %q", code, stderr)
	}
	if s := r.Status(); s.GPU.Usable || !strings.Contains(s.GPU.Refused, "card 4") {
		t.Errorf("status: %+v", s.GPU)
	}
	// Without GPUs, commands still run, and no role can open any card.
	for i := 0; i < 5; i++ {
		if got := openAs(t, r, "lane-1", nil, "open-dev", cardPath(r, i)); got != "EACCES" {
			t.Errorf("card %d: %s", i, got)
		}
	}
}

func TestGPUNodeMadeLaterIsDenied(t *testing.T) {
	r := testrig.New(t, testrig.Options{GPUs: 2, TimingUsers: 2, Extra: twoJudgeCPUs})
	later := filepath.Join(r.Dir, "dev", "late-node")
	ready := filepath.Join(r.Cfg.ScratchDir(), "tmp", "lane-1", "ready")
	done := make(chan string)
	go func() {
		// The command's fence is built before it starts, so before "ready".
		out, _, _ := r.RunAs("lane-1", nil, "sh", "-c", "touch $TMPDIR/ready; while [ ! -e $TMPDIR/go ]; do sleep 0.05; done; "+r.Bin+" __probe try open-dev "+later)
		done <- strings.TrimSpace(out)
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the command did not start")
		}
	}
	testrig.MakeNode(t, later)
	os.WriteFile(filepath.Join(filepath.Dir(ready), "go"), nil, 0o644)
	if got := <-done; got != "EACCES" {
		t.Fatalf("a node made after the fence was built: %s", got)
	}
	os.Remove(later)
}

func TestGPUWorkRefusedWithoutTheLandlockABI(t *testing.T) {
	r := testrig.New(t, testrig.Options{GPUs: 2, TimingUsers: 2, GPUExtra: "fence_min_abi = 99"})
	_, stderr, code := r.RunAs("run", []string{"--gpus", "0"}, "true")
	if code == 0 || !strings.Contains(stderr, "need 99") || !strings.Contains(stderr, "landlock ABI") {
		t.Fatalf("GPU run on a kernel without the fence's ABI: exit %d %q", code, stderr)
	}
	if s := r.Status(); s.GPU.Usable {
		t.Errorf("status says GPUs are usable: %+v", s.GPU)
	}
	// The device files are fixed (root:gpu-N 0660), so commands without
	// cards still run, kept off the cards by their permissions.
	if got := openAs(t, r, "lane-1", nil, "open-dev", cardPath(r, 0)); got != "EACCES" {
		t.Errorf("lane-1 opens card 0: %s", got)
	}
}
