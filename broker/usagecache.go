package broker

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"thermite/internal/confined"
	"thermite/internal/hostpolicy"
	"thermite/internal/procs"
	"thermite/internal/rpc"
	"thermite/internal/weaken"
	"thermite/roles"
)

// A disk measure of a role is reused only when nothing of the role can
// have changed what it holds since: no command of the role has started
// (every start, of any kind, moves the role's generation on), the folders
// handed to it are the same (a change moves every role's generation on),
// no process of the role runs but the broker's own helpers (a lane's file
// helper, whose changes the controller vouches for), and it was so at the
// measure too. An idle trial then costs no walk at all at its disk check.

// usageGen is what a reused measure must still match.
type usageGen struct{ run, hand uint64 }

type keptUsage struct {
	gen usageGen
	u   rpc.DiskUsage
}

// bumpRole moves a role's generation on: a command of it starts or stops.
func (b *Broker) bumpRole(uid int) {
	b.mu.Lock()
	b.measure.runGen[uid]++
	delete(b.measure.usage, uid)
	b.mu.Unlock()
}

// bumpAllLocked moves every role's generation on (b.mu held): the folders
// handed to roles changed.
func (b *Broker) bumpAllLocked() {
	b.measure.handGen++
	clear(b.measure.usage)
}

// roleGen is a role's generation: its own starts and the handed folders'.
func (b *Broker) roleGen(uid int) usageGen {
	b.mu.Lock()
	defer b.mu.Unlock()
	return usageGen{b.measure.runGen[uid], b.measure.handGen}
}

// roleIdle says whether no process of the role runs but the broker's own
// helpers (the thermite commands it started itself: a lane's file helper).
func (b *Broker) roleIdle(uid int) bool {
	// Every process of a role runs in its cgroup (placed before the
	// command exists, and no role can leave it): one read there instead of
	// a walk of /proc, where the role has a group.
	b.mu.Lock()
	g := b.cgroups.groups[uid]
	b.mu.Unlock()
	var pids []int
	var err error
	if g != nil {
		pids, err = g.Procs()
	} else {
		pids, err = procs.ByUID("/proc", uid)
	}
	if err != nil {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, pid := range pids {
		if !b.measure.ownExec[pid] {
			return false
		}
	}
	return true
}

// reusableUsage is the role's last measure, when idle holds and its
// generation is the measure's.
func (b *Broker) reusableUsage(uid int, gen usageGen, idle bool) (*rpc.DiskUsage, bool) {
	if !idle {
		return nil, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	k, ok := b.measure.usage[uid]
	if !ok || k.gen != gen {
		return nil, false
	}
	u := k.u
	u.Reused = true
	return &u, true
}

// keepUsage keeps a measure for reuse, or forgets the role's last one.
func (b *Broker) keepUsage(uid int, gen usageGen, u *rpc.DiskUsage, keep bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if keep {
		b.measure.usage[uid] = keptUsage{gen: gen, u: *u}
	} else {
		delete(b.measure.usage, uid)
	}
}

// Where no quota measures a role, each folder it owns keeps an incremental
// measure (confined.Watched): a check revisits only what inotify says
// changed, and what inotify cannot see (files with holes or several
// links), so its cost grows with what changed, not with the tree. It
// relies on Landlock keeping a role's links and renames within its own
// folders, which are all measured and share one set of linked inodes:
// where that protection is not in force, every check walks every folder.
type usageWatch struct {
	mu    sync.Mutex
	trees map[watchKey]*watchedTree
	links map[int]*roleLinks
	// budget is the watches every role's measures may hold together,
	// perRole those of one role (watchBudget).
	budget  *confined.WatchBudget
	perRole int
}

// The inotify watches the measures may hold: each is one of root's
// fs.inotify.max_user_watches, which every other root program of the host
// shares. The broker takes at most a quarter of them, and one role at
// most maxRoleWatches (a folder each); a role's folder past that is walked
// whole at its checks (confined.ErrWatchBudget), measured all the same.
// The quarter is shared fairly among the rig's roles
// (confined.NewFairWatchBudget): every role has a floor of its own, so
// lanes making folders by the thousand leave every other lane, and the
// judge's builder and timing users, their floor's worth watched.
const (
	watchShare     = 4
	maxRoleWatches = 8192
)

// watchBudget reads root's limit and sizes the budgets from it.
func watchBudget() (total, perRole int) {
	total = 8192 * watchShare // the kernel's smallest default, where unread
	if b, err := os.ReadFile("/proc/sys/fs/inotify/max_user_watches"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
			total = n
		}
	}
	total /= watchShare
	return total, min(maxRoleWatches, max(total/watchShare, 1))
}

type watchKey struct {
	uid  int
	path string
}

type watchedTree struct {
	mu sync.Mutex
	w  confined.Watched
}

type roleLinks struct {
	l    confined.Links
	kept int // how many the last Retain kept
}

// resyncEvery is how many incremental measures of a folder one full walk
// is good for: it also takes in what no event names, such as blocks a
// file system allocates on its own after the write (ext4's extent blocks
// at writeback).
const resyncEvery = 150

// incrementalUsage decides whether a role's folders may be measured by
// their incremental measure, and says why not. Only while Landlock's file
// rules confine every link and rename a role makes to its own places
// (writableFor: its HOME, its TMPDIR, its handed folders), which are
// exactly the folders measured together: a hard link to a measured file
// from anywhere else would let the role grow it with no event in any
// watched folder. So every check walks where landlock-fs is lost (no
// Landlock here, accepted by the operator) or a thermite_weaken build
// drops the role rule set (no-landlock) or keeps only the GPU fence
// (fence-only).
func incrementalUsage(kernel hostpolicy.Host, weakened map[string]bool) (ok bool, why string) {
	for _, m := range hostpolicy.Evaluate(kernel).Lost {
		if m.Name == hostpolicy.LandlockFS {
			return false, hostpolicy.LandlockFS + " lost: " + m.Why
		}
	}
	for _, w := range []string{weaken.NoLandlock, weaken.FenceOnly} {
		if weakened[w] {
			return false, "test build weakened: " + w
		}
	}
	return true, ""
}

func (b *Broker) watchState() *usageWatch {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.measure.watch == nil {
		total, perRole := watchBudget()
		b.measure.watch = &usageWatch{trees: map[watchKey]*watchedTree{}, links: map[int]*roleLinks{},
			budget: confined.NewFairWatchBudget(total, perRole, len(b.table.Roles)), perRole: perRole}
	}
	return b.measure.watch
}

// tree is the cache of one folder of a role, made on first use.
func (s *usageWatch) tree(uid int, path string) *watchedTree {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := watchKey{uid, path}
	t := s.trees[k]
	if t == nil {
		rl := s.links[uid]
		if rl == nil {
			rl = &roleLinks{}
			rl.l.MaxWatches, rl.l.Budget, rl.l.Holder = s.perRole, s.budget, "uid "+strconv.Itoa(uid)
			s.links[uid] = rl
		}
		t = &watchedTree{}
		t.w.Links = &rl.l
		t.w.ResyncEvery = resyncEvery
		t.w.Blind = weaken.Enabled && weaken.Has(weaken.DiskUnseen)
		s.trees[k] = t
	}
	return t
}

// dropWatchedLocked forgets the caches drop says: a folder forgotten,
// retired or handed on. Closing waits for a measure under way, so it is
// done aside; callers may hold b.mu.
func (b *Broker) dropWatchedLocked(drop func(uid int, path string) bool) {
	s := b.measure.watch
	if s == nil {
		return
	}
	s.mu.Lock()
	var gone []*watchedTree
	for k, t := range s.trees {
		if drop(k.uid, k.path) {
			delete(s.trees, k)
			gone = append(gone, t)
		}
	}
	s.mu.Unlock()
	if len(gone) > 0 {
		go func() {
			for _, t := range gone {
				t.mu.Lock()
				t.w.Close()
				t.mu.Unlock()
			}
		}()
	}
}

// measureFolders adds to u the measure of every folder r owns, but those
// on the file system skip (0: none; the quota counts them): each by its
// incremental measure where incrementalUsage allows, else by a walk.
//
// A link found in one folder during a round may name a file another
// folder measured before: the round is taken again, and if links keep
// coming, every folder is walked whole.
func (b *Broker) measureFolders(r roles.Role, skip uint64, u *rpc.DiskUsage) []error {
	incremental, _ := incrementalUsage(b.kernel, weakenedNow())
	var s *usageWatch
	var rl *roleLinks
	if incremental {
		s = b.watchState()
		s.mu.Lock()
		rl = s.links[r.UID]
		s.mu.Unlock()
	}
	base := *u
	var errs []error
	for pass := 0; pass < 3; pass++ {
		*u, errs = base, nil
		var gen uint64
		if rl != nil {
			gen = rl.l.Gen()
		}
		var paths []string
		b.eachOwnedFolder(r, func(top *os.File) {
			if skip != 0 {
				var st unix.Stat_t
				if err := unix.Fstat(int(top.Fd()), &st); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", top.Name(), err))
					return
				}
				if st.Dev == skip {
					return
				}
			}
			var n, e int64
			var err error
			if !incremental || pass == 2 {
				n, e, err = confined.Usage(top)
			} else {
				t := s.tree(r.UID, top.Name())
				t.mu.Lock()
				was := t.w.Unwatched
				n, e, err = t.w.Measure(top)
				if now := t.w.Unwatched; now != nil && (was == nil || was.Error() != now.Error()) {
					b.log.Warn("disk check: a folder is walked whole at every check, not incrementally", "role", r.Name, "path", top.Name(), "why", now)
				}
				t.mu.Unlock()
			}
			paths = append(paths, top.Name())
			u.Bytes += n
			u.Entries += e
			if err != nil {
				errs = append(errs, err)
			}
		}, func(err error) { errs = append(errs, err) })
		if !incremental {
			return errs
		}
		s.mu.Lock()
		rl = s.links[r.UID]
		s.mu.Unlock()
		// Caches of folders the role no longer owns go.
		b.mu.Lock()
		b.dropWatchedLocked(func(uid int, path string) bool { return uid == r.UID && !slices.Contains(paths, path) })
		b.mu.Unlock()
		if rl == nil || rl.l.Gen() == gen {
			break
		}
	}
	b.retainLinks(r.UID)
	return errs
}

// retainLinks keeps a role's set of linked inodes to what its folders
// hold, once it has doubled since last kept.
func (b *Broker) retainLinks(uid int) {
	s := b.watchState()
	s.mu.Lock()
	rl := s.links[uid]
	var trees []*watchedTree
	var keys []watchKey
	for k := range s.trees {
		if k.uid == uid {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b watchKey) int { return strings.Compare(a.path, b.path) })
	for _, k := range keys {
		trees = append(trees, s.trees[k])
	}
	s.mu.Unlock()
	if rl == nil || rl.l.Len() <= 2*rl.kept+1024 {
		return
	}
	ws := make([]*confined.Watched, 0, len(trees))
	for _, t := range trees {
		t.mu.Lock()
		defer t.mu.Unlock()
		ws = append(ws, &t.w)
	}
	rl.l.Retain(ws)
	rl.kept = rl.l.Len()
}
