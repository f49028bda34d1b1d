package fence

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"thermite/internal/testrig"
	"thermite/roles"
)

// standIn makes dir/dev with n cards and dir/proc with their information.
func standIn(t testing.TB, n int) string {
	t.Helper()
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	dev := filepath.Join(dir, "dev")
	os.MkdirAll(filepath.Join(dev, "nvidia-caps"), 0o755)
	node := func(p string) {
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatalf("mknod %s: %v", p, err)
		}
		os.Chmod(p, 0o666)
	}
	for _, c := range []string{"null", "nvidiactl", "nvidia-uvm", "nvidia-caps/nvidia-cap1"} {
		node(filepath.Join(dev, c))
	}
	for i := 0; i < n; i++ {
		addCard(t, dir, i, node)
	}
	return dir
}

func addCard(t testing.TB, dir string, i int, node func(string)) {
	node(filepath.Join(dir, "dev", fmt.Sprintf("nvidia%d", i)))
	info := filepath.Join(dir, "proc", "driver", "nvidia", "gpus", fmt.Sprintf("0000:%02x:00.0", 0x40-i))
	os.MkdirAll(info, 0o755)
	os.WriteFile(filepath.Join(info, "information"), []byte(fmt.Sprintf("Model: \t\t X\nGPU UUID: \t GPU-%d\nBus Location: \t 0000:%02x:00.0\nDevice Minor: \t %d\n", i, 0x40-i, i)), 0o444)
}

func TestDiscoverStandIns(t *testing.T) {
	testrig.RequireRootForNodes(t)
	dir := standIn(t, 3)
	d, err := Discover(filepath.Join(dir, "dev"), filepath.Join(dir, "proc"))
	if err != nil {
		t.Fatal(err)
	}
	if d.Source != "dev" || len(d.Cards) != 3 || len(d.Control) != 3 {
		t.Fatalf("%+v", d)
	}
	// Bus locations run backwards here: the index follows the bus, not the minor.
	if d.Cards[0].Minor != 2 || d.Cards[0].Index != 0 || d.Cards[0].UUID != "GPU-2" || !strings.HasSuffix(d.Cards[2].Path, "/nvidia0") {
		t.Fatalf("cards %+v", d.Cards)
	}
	if !strings.Contains(d.NVML, "no NVML") {
		t.Errorf("static build: NVML note %q", d.NVML)
	}
}

func TestPlanLayouts(t *testing.T) {
	four := &Devices{}
	for i := 0; i < 4; i++ {
		four.Cards = append(four.Cards, Card{Index: i, Minor: i, UUID: fmt.Sprintf("GPU-%d", i), Path: fmt.Sprintf("/dev/nvidia%d", i)})
	}
	l := Plan("dedicated", four, 4)
	if l.Refused != "" || l.Timing[0] != "run" || l.Timing[1] != "run-2" || l.Group[3] != "gpu-3" {
		t.Fatalf("%+v", l)
	}
	if l := Plan("dedicated", four, 3); !strings.Contains(l.Refused, "card 3 (/dev/nvidia3, GPU-3) has no place") {
		t.Fatalf("refused: %q", l.Refused)
	}
	if l := Plan("shared", four, 1); !strings.Contains(l.Refused, "card 1 (/dev/nvidia1, GPU-1) has no place: the shared layout holds one card") {
		t.Fatalf("refused: %q", l.Refused)
	}
	one := &Devices{Cards: four.Cards[:1]}
	if l := Plan("shared", one, 1); l.Refused != "" || l.Group[0] != "gpu" || l.Timing[0] != "run" {
		t.Fatalf("%+v", l)
	}
	if l := Plan("none", one, 1); !strings.Contains(l.Refused, "gpu.layout is none") {
		t.Fatalf("%q", l.Refused)
	}
	noUUID := &Devices{Cards: []Card{{Index: 0, Minor: 7, Path: "/dev/nvidia7"}}}
	if l := Plan("dedicated", noUUID, 1); !strings.Contains(l.Refused, "/dev/nvidia7) has no UUID") {
		t.Fatalf("%q", l.Refused)
	}
}

func TestCardsFor(t *testing.T) {
	d := &Devices{Control: []string{"/dev/nvidiactl"}}
	for i := 0; i < 2; i++ {
		d.Cards = append(d.Cards, Card{Index: i, Minor: i, UUID: fmt.Sprintf("GPU-%d", i), Path: fmt.Sprintf("/dev/nvidia%d", i)})
	}
	l := Plan("dedicated", d, 2)
	run := roles.Role{Name: "run", Kind: roles.Timing}
	run2 := roles.Role{Name: "run-2", Kind: roles.Timing}
	lane := roles.Role{Name: "lane-1", Kind: roles.Lane}
	builder := roles.Role{Name: "builder", Kind: roles.Builder}
	if c, err := l.CardsFor(run, []int{0}); err != nil || len(c) != 1 {
		t.Fatal(c, err)
	}
	if _, err := l.CardsFor(run, []int{1}); err == nil || !strings.Contains(err.Error(), "run may not open card 1 (its timing user is run-2)") {
		t.Fatal(err)
	}
	if _, err := l.CardsFor(run2, []int{1}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CardsFor(lane, []int{1}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CardsFor(builder, []int{0}); err == nil || !strings.Contains(err.Error(), "builder may not open GPUs") {
		t.Fatal(err)
	}
	if _, err := l.CardsFor(lane, []int{5}); err == nil || !strings.Contains(err.Error(), "card 5 does not exist") {
		t.Fatal(err)
	}
	if deny := l.Deny([]int{1}); strings.Join(deny, ",") != "/dev/nvidia0" {
		t.Fatalf("deny with card 1: %v", deny)
	}
	if deny := l.Deny(nil); strings.Join(deny, ",") != "/dev/nvidia0,/dev/nvidia1,/dev/nvidiactl" {
		t.Fatalf("deny without cards: %v", deny)
	}
	if env := l.Env([]int{1}); env[0] != "CUDA_VISIBLE_DEVICES=GPU-1" || env[1] != "NVIDIA_VISIBLE_DEVICES=GPU-1" {
		t.Fatal(env)
	}
	if g := l.Groups([]int{1}); strings.Join(g, ",") != "gpu,gpu-1" {
		t.Fatal(g)
	}
	refused := Plan("dedicated", d, 1)
	if _, err := refused.CardsFor(lane, []int{0}); err == nil || !strings.Contains(err.Error(), "GPU work is refused on this rig: card 1") {
		t.Fatal(err)
	}
}

func TestFixPermissions(t *testing.T) {
	testrig.RequireRootForNodes(t)
	dir := standIn(t, 2)
	d, _ := Discover(filepath.Join(dir, "dev"), filepath.Join(dir, "proc"))
	l := Plan("dedicated", d, 2)
	gids := map[string]int{"gpu": 45400, "gpu-0": 45401, "gpu-1": 45402}
	fixed, note := FixPermissions(l.Wanted(func(g string) (int, bool) { v, ok := gids[g]; return v, ok }))
	if !fixed || note != "" {
		t.Fatalf("fixed %v note %q", fixed, note)
	}
	var st unix.Stat_t
	unix.Stat(filepath.Join(dir, "dev", "nvidia1"), &st)
	// nvidia1 sits first on the bus here, so it is card 0: gpu-0's.
	if st.Uid != 0 || st.Gid != 45401 || st.Mode&0o7777 != 0o660 {
		t.Fatalf("nvidia1: %d:%d %o, want 0:45401 0660", st.Uid, st.Gid, st.Mode&0o7777)
	}
	unix.Stat(filepath.Join(dir, "dev", "nvidiactl"), &st)
	if st.Gid != 45400 {
		t.Fatalf("nvidiactl group %d, want gpu's", st.Gid)
	}
}
