package confined

import (
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func measureBoth(t testing.TB, w *Watched, d string) (inc, full int64) {
	top, err := Open(filepath.Dir(d), d, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		t.Fatal(err)
	}
	defer top.Close()
	inc, ie, err := w.Measure(top)
	if err != nil {
		t.Fatal(err)
	}
	full, fe, err := Usage(top)
	if err != nil {
		t.Fatal(err)
	}
	if ie != fe {
		t.Errorf("entries: incremental %d, walk %d", ie, fe)
	}
	return inc, full
}

func TestWatchedEquivalentToWalk(t *testing.T) {
	d := t.TempDir()
	w := &Watched{}
	defer w.Close()
	r := rand.New(rand.NewSource(1))
	var dirs = []string{d}
	var files []string
	pick := func(s []string) string { return s[r.Intn(len(s))] }
	for round := 0; round < 200; round++ {
		for op := 0; op < 20; op++ {
			dir := pick(dirs)
			p := filepath.Join(dir, fmt.Sprintf("n%d", r.Intn(1000)))
			switch r.Intn(10) {
			case 0:
				if os.Mkdir(p, 0o755) == nil {
					dirs = append(dirs, p)
				}
			case 1, 2:
				if os.WriteFile(p, make([]byte, r.Intn(20000)), 0o644) == nil {
					files = append(files, p)
				}
			case 3:
				if len(files) > 0 {
					f, err := os.OpenFile(pick(files), os.O_WRONLY|os.O_APPEND, 0)
					if err == nil {
						f.Write(make([]byte, r.Intn(50000)))
						f.Close()
					}
				}
			case 4:
				if len(files) > 0 {
					os.Truncate(pick(files), int64(r.Intn(1<<20)))
				}
			case 5:
				if len(files) > 0 {
					os.Rename(pick(files), p)
					files = append(files, p)
				}
			case 6:
				if len(dirs) > 1 {
					src := pick(dirs[1:])
					if os.Rename(src, p) == nil {
						dirs = append(dirs, p)
					}
				}
			case 7:
				if len(files) > 0 {
					os.Link(pick(files), p)
					files = append(files, p)
				}
			case 8:
				os.Symlink("/etc", p)
			case 9:
				if len(files) > 0 {
					os.Remove(pick(files))
				}
				if len(dirs) > 1 {
					os.Remove(pick(dirs[1:]))
				}
			}
		}
		if inc, full := measureBoth(t, w, d); inc != full {
			t.Fatalf("round %d: incremental %d, walk %d", round, inc, full)
		}
	}
	t.Logf("full walks: %d of 200", w.Full)
}

func TestWatchedSeesMmapIntoHoles(t *testing.T) {
	d := t.TempDir()
	w := &Watched{}
	defer w.Close()
	p := filepath.Join(d, "sparse")
	f, _ := os.Create(p)
	defer f.Close()
	f.Truncate(8 << 20)
	measureBoth(t, w, d)
	m, err := unix.Mmap(int(f.Fd()), 0, 8<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(m); i += 4096 {
		m[i] = 1
	}
	unix.Msync(m, unix.MS_SYNC)
	if inc, full := measureBoth(t, w, d); inc != full || full < 8<<20 {
		t.Fatalf("incremental %d, walk %d", inc, full)
	}
}

func TestWatchedOverflowWalksAll(t *testing.T) {
	d := t.TempDir()
	w := &Watched{}
	defer w.Close()
	measureBoth(t, w, d)
	for i := 0; i < 20000; i++ {
		os.WriteFile(filepath.Join(d, fmt.Sprint(i)), []byte("x"), 0o644)
	}
	if inc, full := measureBoth(t, w, d); inc != full || w.Full != 2 {
		t.Fatalf("incremental %d, walk %d, full walks %d", inc, full, w.Full)
	}
}

// measureTree is one tree's incremental measure and a plain walk's.
// A lane links a file of one of its folders into another, opens it there,
// removes that name and writes through the descriptor: no event names the
// first folder's file. The write on the gone name puts the measure in
// doubt, and the next measure of the role's trees is right.
func TestWatchedWriteThroughGoneLinkInAnotherTree(t *testing.T) {
	lt := newLinkedTrees(t)
	d, out, g, h := lt.d, lt.out, lt.g, lt.h
	links, wd, wo := lt.links, lt.wd, lt.wo
	os.Remove(g)
	measureBoth(t, wd, d)
	measureBoth(t, wo, out)
	h.Write(make([]byte, 1<<20))
	// The role's round: every tree, then again if a link was learnt.
	gen := links.Gen()
	measureBoth(t, wo, out)
	if links.Gen() != gen {
		t.Log("a link was learnt: the round is taken again")
	}
	if inc, full := measureBoth(t, wd, d); inc != full {
		t.Fatalf("workspace after a write through a gone link elsewhere: incremental %d, walk %d", inc, full)
	}
}

// A lane links a file of one of its folders into another, writes through
// that name and removes it, all between two measures: the second folder
// saw a name come, be written and go, and nothing names the first
// folder's file. A written name gone unmeasured puts the measure in doubt.
func TestWatchedWriteThroughLinkRemovedBeforeTheMeasure(t *testing.T) {
	lt := newLinkedTrees(t)
	d, out, g, h := lt.d, lt.out, lt.g, lt.h
	wd, wo := lt.wd, lt.wo
	h.Write(make([]byte, 1<<20))
	h.Close()
	os.Remove(g)
	measureBoth(t, wo, out)
	if inc, full := measureBoth(t, wd, d); inc != full || full < 1<<20 {
		t.Fatalf("workspace after a write through a link removed before the measure: incremental %d, walk %d", inc, full)
	}
}

// The usual way to replace a file, writing a new one and renaming it over
// the old, is measured from the events alone: no full walk.
func TestWatchedWriteThenRenameStaysIncremental(t *testing.T) {
	d := t.TempDir()
	w := &Watched{}
	defer w.Close()
	os.Mkdir(filepath.Join(d, "sub"), 0o755)
	os.WriteFile(filepath.Join(d, "final"), make([]byte, 4096), 0o644)
	measureBoth(t, w, d)
	for i := 0; i < 5; i++ {
		tmp := filepath.Join(d, "sub", "tmp")
		os.WriteFile(tmp, make([]byte, 10000*(i+1)), 0o644)
		if err := os.Rename(tmp, filepath.Join(d, "final")); err != nil {
			t.Fatal(err)
		}
		if inc, full := measureBoth(t, w, d); inc != full {
			t.Fatalf("after rename %d: incremental %d, walk %d", i, inc, full)
		}
	}
	if w.Full != 1 {
		t.Fatalf("full walks: %d, want 1 (the first measure)", w.Full)
	}
}

// inotifyFDs counts this process's inotify instances.
func inotifyFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); l == "anon_inode:inotify" {
			n++
		}
	}
	return n
}

// Root has 128 inotify instances (fs.inotify.max_user_instances) for
// every folder of every role: a role's trees share one, and each still
// sees only its own events.
func TestWatchedTreesOfOneRoleShareOneInotifyInstance(t *testing.T) {
	before := inotifyFDs(t)
	links := &Links{}
	defer links.Close()
	var dirs []string
	var ws []*Watched
	for i := 0; i < 3; i++ {
		d := t.TempDir()
		os.WriteFile(filepath.Join(d, "f"), make([]byte, 4096), 0o644)
		w := &Watched{Links: links}
		defer w.Close()
		measureBoth(t, w, d)
		dirs, ws = append(dirs, d), append(ws, w)
	}
	if got := inotifyFDs(t) - before; got != 1 {
		t.Fatalf("three trees of one role hold %d inotify instances, want 1", got)
	}
	for round := 0; round < 3; round++ {
		for i, d := range dirs {
			os.WriteFile(filepath.Join(d, fmt.Sprintf("g%d", round)), make([]byte, 5000*(i+1)), 0o644)
		}
		for i, d := range dirs {
			if inc, full := measureBoth(t, ws[i], d); inc != full {
				t.Fatalf("round %d tree %d: incremental %d, walk %d", round, i, inc, full)
			}
		}
	}
	for i, w := range ws {
		if w.Full != 1 {
			t.Errorf("tree %d: %d full walks, want 1", i, w.Full)
		}
	}
}

// A folder measured as two trees of one role is watched by the first
// alone: the second is walked whole at each measure, and says why.
func TestWatchedSameFolderTwiceWalksTheSecond(t *testing.T) {
	d := t.TempDir()
	links := &Links{}
	defer links.Close()
	a, b := &Watched{Links: links}, &Watched{Links: links}
	defer a.Close()
	defer b.Close()
	measureBoth(t, a, d)
	measureBoth(t, b, d)
	if b.Unwatched == nil || a.Unwatched != nil {
		t.Fatalf("first tree: %v, second: %v; want the second unwatched", a.Unwatched, b.Unwatched)
	}
	os.WriteFile(filepath.Join(d, "f"), make([]byte, 8192), 0o644)
	for _, w := range []*Watched{a, b} {
		if inc, full := measureBoth(t, w, d); inc != full {
			t.Fatalf("incremental %d, walk %d", inc, full)
		}
	}
}

func BenchmarkWatched100k(b *testing.B) {
	d, _ := os.MkdirTemp("", "thermite-usagewatch-bench-")
	b.Cleanup(func() { os.RemoveAll(d) })
	for i := 0; i < 1000; i++ {
		sub := filepath.Join(d, fmt.Sprintf("d%03d", i))
		os.Mkdir(sub, 0o755)
		for j := 0; j < 100; j++ {
			os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%03d", j)), []byte("x"), 0o644)
		}
	}
	cpu := func() time.Duration {
		var ru unix.Rusage
		unix.Getrusage(unix.RUSAGE_THREAD, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	top, _ := Open(filepath.Dir(d), d, unix.O_PATH|unix.O_DIRECTORY)
	defer top.Close()
	change := func(i int) {
		for k := 0; k < 10; k++ {
			p := filepath.Join(d, fmt.Sprintf("d%03d/f%03d", (i*10+k)%1000, k))
			os.WriteFile(p, make([]byte, 5000+i%3000), 0o644)
		}
	}
	b.Run("walk", func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var spent time.Duration
		for i := 0; i < b.N; i++ {
			change(i)
			s := cpu()
			Usage(top)
			spent += cpu() - s
		}
		b.ReportMetric(float64(spent)/float64(b.N)/1e6, "cpu-ms/op")
	})
	b.Run("build", func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var spent time.Duration
		for i := 0; i < b.N; i++ {
			w := &Watched{}
			s := cpu()
			w.Measure(top)
			spent += cpu() - s
			w.Close()
		}
		b.ReportMetric(float64(spent)/float64(b.N)/1e6, "cpu-ms/op")
	})
	b.Run("incremental", func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		w := &Watched{}
		defer w.Close()
		w.Measure(top)
		var spent time.Duration
		for i := 0; i < b.N; i++ {
			change(i)
			s := cpu()
			w.Measure(top)
			spent += cpu() - s
		}
		if w.Full != 1 {
			b.Fatalf("full walks %d", w.Full)
		}
		b.ReportMetric(float64(spent)/float64(b.N)/1e6, "cpu-ms/op")
	})
}

// A symlink whose target is over 60 bytes takes a block of its own on
// ext4 (and tmpfs counts its page): a lane could keep 4 KiB in each of
// millions of them. Both measures count them, and never follow them.
func TestLaneKeepsBytesInSymlinkTargetsCounted(t *testing.T) {
	d := t.TempDir()
	w := &Watched{}
	defer w.Close()
	long := string(make([]byte, 0, 4000))
	for len(long) < 4000 {
		long += "a"
	}
	inc0, full0 := measureBoth(t, w, d)
	for i := 0; i < 100; i++ {
		if err := os.Symlink(long, filepath.Join(d, fmt.Sprint("l", i))); err != nil {
			t.Fatal(err)
		}
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(d, "l0"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks == 0 {
		t.Skipf("this file system keeps a %d-byte symlink target in no block of its own", len(long))
	}
	want := 100 * st.Blocks * 512
	inc, full := measureBoth(t, w, d)
	if full-full0 < want {
		t.Errorf("the walk counts %d bytes more after 100 long symlinks, want at least %d", full-full0, want)
	}
	if inc-inc0 < want || inc != full {
		t.Errorf("the incremental measure counts %d bytes more (walk %d), want at least %d", inc-inc0, full-full0, want)
	}
	// Removed, they are gone from both.
	for i := 0; i < 100; i++ {
		os.Remove(filepath.Join(d, fmt.Sprint("l", i)))
	}
	if inc, full := measureBoth(t, w, d); inc != full {
		t.Errorf("after removing them: incremental %d, walk %d", inc, full)
	}
}

// A tree with more folders than its role may watch, or than the broker's
// budget has left, is walked whole (ErrWatchBudget), measured all the
// same, and gives back every watch it took; it tries again only after
// ResyncEvery walks.
func TestLaneFoldersPastTheWatchBudgetWalkedWhole(t *testing.T) {
	d := t.TempDir()
	for i := 0; i < 10; i++ {
		os.MkdirAll(filepath.Join(d, fmt.Sprint(i), "x"), 0o755)
		os.WriteFile(filepath.Join(d, fmt.Sprint(i), "x", "f"), make([]byte, 9000), 0o644)
	}
	budget := NewWatchBudget(100)
	for _, c := range []struct {
		name  string
		links *Links
	}{
		{"over its role's bound", &Links{MaxWatches: 5, Budget: budget}},
		{"over the broker's budget", &Links{Budget: NewWatchBudget(5)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := &Watched{Links: c.links, ResyncEvery: 3}
			defer w.Close()
			for i := 0; i < 5; i++ {
				if inc, full := measureBoth(t, w, d); inc != full {
					t.Fatalf("measure %d: %d, walk %d", i, inc, full)
				}
			}
			if !errors.Is(w.Unwatched, ErrWatchBudget) {
				t.Fatalf("Unwatched = %v, want ErrWatchBudget", w.Unwatched)
			}
			if len(c.links.owner) != 0 {
				t.Errorf("%d watches kept after the walk", len(c.links.owner))
			}
			// One try to watch, three walks, then one more try.
			if w.Full != 2 {
				t.Errorf("%d tries to watch in 5 measures, want 2", w.Full)
			}
		})
	}
	if budget.Left() != 100 {
		t.Errorf("the shared budget has %d left, want its 100 back", budget.Left())
	}
}

// linkedTrees are two trees of one role, measured once each, and the
// workspace's file f linked into the other tree as g, open for appending
// there (h): what the attacks on links write through.
type linkedTrees struct {
	d, out, g string
	links     *Links
	wd, wo    *Watched
	h         *os.File
}

func newLinkedTrees(t *testing.T) *linkedTrees {
	t.Helper()
	lt := &linkedTrees{d: t.TempDir(), out: t.TempDir(), links: &Links{}}
	t.Cleanup(func() { lt.links.Close() })
	lt.wd, lt.wo = &Watched{Links: lt.links}, &Watched{Links: lt.links}
	t.Cleanup(func() { lt.wd.Close(); lt.wo.Close() })
	os.WriteFile(filepath.Join(lt.d, "f"), make([]byte, 4096), 0o644)
	measureBoth(t, lt.wd, lt.d)
	measureBoth(t, lt.wo, lt.out)
	lt.g = filepath.Join(lt.out, "g")
	if err := os.Link(filepath.Join(lt.d, "f"), lt.g); err != nil {
		t.Fatal(err)
	}
	h, err := os.OpenFile(lt.g, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	lt.h = h
	t.Cleanup(func() { h.Close() })
	return lt
}

// TestLanesFloodingFoldersLeaveTheNextLaneItsWatches: lanes 1..3 each
// make folders, tree after tree, until the budget refuses them one
// (ErrWatchBudget), and keep every tree it watched. Lane 4's tree, no
// larger than a role's guaranteed share, is still watched and measured
// incrementally: the budget is shared fairly (NewFairWatchBudget), not
// first come, first served, where lanes 1 and 2 alone took it all.
func TestLanesFloodingFoldersLeaveTheNextLaneItsWatches(t *testing.T) {
	const total, perRole, roles = 200, 100, 4
	budget := NewFairWatchBudget(total, perRole, roles)
	floor := budget.Guaranteed()
	if floor != total/2/roles {
		t.Fatalf("guaranteed %d watches a role, want %d (half the budget in floors: a role may use %d)", floor, total/2/roles, perRole)
	}
	tree := func(d string, folders int) string {
		for i := 1; i < folders; i++ {
			os.MkdirAll(filepath.Join(d, fmt.Sprint("f", i)), 0o755)
		}
		os.WriteFile(filepath.Join(d, "file"), make([]byte, 5000), 0o644)
		return d
	}
	base := t.TempDir()
	for lane := 1; lane <= 3; lane++ {
		links := &Links{MaxWatches: perRole, Budget: budget, Holder: fmt.Sprint("lane-", lane)}
		refused := false
		for i := 0; i < perRole && !refused; i++ {
			w := &Watched{Links: links, ResyncEvery: 1000}
			t.Cleanup(w.Close)
			d := tree(filepath.Join(base, fmt.Sprint("lane", lane, "-", i)), 10)
			if inc, full := measureBoth(t, w, d); inc != full {
				t.Fatalf("lane %d's tree %d: incremental %d, walk %d", lane, i, inc, full)
			}
			refused = errors.Is(w.Unwatched, ErrWatchBudget)
		}
		if !refused {
			t.Fatalf("lane %d made %d trees and none was refused: the flood took nothing", lane, perRole)
		}
	}
	links := &Links{MaxWatches: perRole, Budget: budget, Holder: "lane-4"}
	w := &Watched{Links: links, ResyncEvery: 1000}
	defer w.Close()
	d := tree(filepath.Join(base, "lane4"), floor)
	os.WriteFile(filepath.Join(d, "f1", "new"), make([]byte, 7000), 0o644)
	for i := range 2 {
		if inc, full := measureBoth(t, w, d); inc != full {
			t.Fatalf("lane 4's measure %d: incremental %d, walk %d", i, inc, full)
		}
	}
	if w.Unwatched != nil || w.Full != 1 {
		t.Fatalf("lane 4's tree of %d folders behind lanes 1..3's flood: %v (%d full walks in 2 measures), want it watched", floor, w.Unwatched, w.Full)
	}
}
