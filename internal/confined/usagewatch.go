package confined

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"thermite/internal/fairshare"
	"thermite/internal/weaken"
)

// Watched is an incremental Usage: it revisits only what inotify says
// changed, plus what inotify cannot see (files with holes, files with
// several links), and walks whole on any doubt. It is right only where the
// role's links and renames stay within the trees that share one Links
// (Landlock's rule set): the broker decides that (broker/usagecache.go).

const watchMask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_CLOSE_WRITE | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF |
	unix.IN_ONLYDIR

// No IN_EXCL_UNLINK: a write through a descriptor whose name is gone is
// how a lane writes to a file whose other link the measure holds (link it
// into another folder, open it there, remove that name); the event on the
// gone name is the only trace of it, and puts the measure in doubt.

type wnode struct {
	wd     int32
	parent *wnode
	name   string
	ino    uint64
	depth  int
	self   int64 // the folder's own blocks
	ents   map[string]went
}

type went struct {
	dev    uint64
	ino    uint64
	blocks int64
	dir    bool
	always bool // re-stat'ed every measure: inotify cannot see all its growth
}

// Watched is one top folder's incremental measure.
type Watched struct {
	nodes          map[int32]*wnode
	root           *wnode
	rootDev        uint64
	bytes, entries int64
	always         int
	valid          bool
	// ResyncEvery is how many measures a full walk is good for.
	ResyncEvery int
	since       int
	// Full counts full walks, for tests and benchmarks.
	Full int
	// Links are the multi-linked inodes of every tree of the same role.
	Links *Links
	seen  uint64 // the Links generation last taken in
	walks uint64 // the Links doubt generation of the last full walk
	// newMulti says an inode joined Links during an update: its other
	// names here were not re-stat'ed, so the update is in doubt.
	newMulti bool
	ownLinks bool // Links made here, for a tree measured alone
	// Unwatched says why the last full walk could not set the watches up
	// (out of inotify instances or watches, a tree over the caps), nil
	// once it could: until then every measure is a plain walk.
	Unwatched error
	// Blind re-stats nothing that no event names (no holed or linked
	// file): only a thermite_weaken build's breakage test sets it.
	Blind bool
	// overBudget counts down the measures that walk before a tree that
	// needed more watches than it may hold tries to watch again.
	overBudget int
}

type devIno struct{ dev, ino uint64 }

// Links are the inodes ever seen with more than one link in any tree of
// one role: every name of them, in every tree, is re-stat'ed each
// measure, also once the count is back to one (a descriptor opened
// through a removed link still writes there and raises no event here).
// A link made in one tree to a file of another raises an event only where
// the new name is: the other tree learns of it through here.
//
// A doubt in one tree (an event on a gone name, a lost event) is a doubt
// in all: the write it hides may be to a file another tree holds. Each
// tree walks whole at its next measure.
//
// Links also hold the role's one inotify instance, which its trees share
// (root has fs.inotify.max_user_instances, 128 by default, for every
// folder of every role otherwise), and each tree's events drained from it
// until that tree takes them. A lost event (the queue overflowed) is a
// doubt in every tree.
type Links struct {
	mu    sync.Mutex
	multi map[devIno]bool
	gen   uint64
	walks uint64 // moves on with each doubt
	// ifd is the inotify instance (0 until first used); owner the tree
	// of each watch; pending each tree's events not yet taken, queued
	// their count.
	ifd     int
	owner   map[int32]*Watched
	pending map[*Watched][]wevent
	queued  int
	// MaxWatches bounds the watches the role's trees hold (0: no bound),
	// Budget those of every role together (nil: none), of which Holder
	// (the role's name) has its fair share: see WatchBudget.
	MaxWatches int
	Budget     *WatchBudget
	Holder     string
}

// WatchBudget is how many inotify watches the measures of every role may
// still take. Each watch is charged to root (fs.inotify.max_user_watches
// counts per user, and the broker is root), so a lane that makes folders
// by the thousand, well within its disk cap, would otherwise take root's
// watches from every other root program of the host, and from the other
// roles' measures. It is a fair share (fairshare.Share) among the roles
// (Links.Holder): each has a floor no other role can take, so lanes
// that make folders until they are refused leave the next lane, and the
// judge's roles, their own. A tree that would go past its role's bound or
// this one is walked whole instead (ErrWatchBudget).
type WatchBudget struct {
	mu    sync.Mutex
	share *fairshare.Share
}

// NewWatchBudget is a budget of n watches that every role draws on, first
// come, first served.
func NewWatchBudget(n int) *WatchBudget {
	return &WatchBudget{share: fairshare.New(int64(n), int64(n), 1, 1)}
}

// NewFairWatchBudget is a budget of n watches shared fairly among roles
// roles, each at most perRole: each role is guaranteed
// min(perRole, n/roles), or, where that is less than perRole, its share
// of half of n, the other half a pool for the roles with large trees.
func NewFairWatchBudget(n, perRole, roles int) *WatchBudget {
	return &WatchBudget{share: fairshare.New(int64(n), int64(perRole), int64(perRole), roles)}
}

// Left is how many watches may still be taken, by all roles together.
func (b *WatchBudget) Left() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return int(b.share.Max() - b.share.Sum())
}

// Guaranteed is what each role may take whatever the others hold.
func (b *WatchBudget) Guaranteed() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return int(b.share.Floor())
}

// take takes one watch for holder; it says why not, or "".
func (b *WatchBudget) take(holder string) string {
	if b == nil {
		return ""
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	f := b.share
	if ok, own := f.Admit(holder, 1); !ok {
		if own {
			return fmt.Sprintf("%d for one role", f.PerHolder())
		}
		return fmt.Sprintf("the broker's share of root's fs.inotify.max_user_watches is taken: %d of %d, this role's guaranteed %d among them", f.Sum(), f.Max(), f.Floor())
	}
	return ""
}

func (b *WatchBudget) give(holder string, n int) {
	if b == nil || n == 0 {
		return
	}
	b.mu.Lock()
	b.share.Release(holder, int64(n))
	b.mu.Unlock()
}

// ErrWatchBudget says a tree needs more inotify watches than its role,
// or the broker, may hold: it is walked whole instead.
var ErrWatchBudget = errors.New("more folders than the inotify watches a measure may hold")

// wevent is one inotify event, read and parsed.
type wevent struct {
	wd           int32
	mask, cookie uint32
	name         string
}

// instance is the role's inotify instance, made on first use.
func (l *Links) instance() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ifd > 0 {
		return nil
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return err
	}
	l.ifd, l.owner, l.pending = fd, map[int32]*Watched{}, map[*Watched][]wevent{}
	return nil
}

// watch adds a watch on the folder path names for w. A folder another
// tree (or w) already watches is refused (IN_MASK_CREATE): one watch
// would then report to one tree alone.
func (l *Links) watch(w *Watched, path string) (int32, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.MaxWatches > 0 && len(l.owner) >= l.MaxWatches {
		return 0, fmt.Errorf("%w (%d for one role)", ErrWatchBudget, l.MaxWatches)
	}
	if why := l.Budget.take(l.Holder); why != "" {
		return 0, fmt.Errorf("%w (%s)", ErrWatchBudget, why)
	}
	wd, err := unix.InotifyAddWatch(l.ifd, path, watchMask|unix.IN_MASK_CREATE)
	if err != nil {
		l.Budget.give(l.Holder, 1)
		return 0, err
	}
	l.owner[int32(wd)] = w
	return int32(wd), nil
}

// unwatch removes one watch of w.
func (l *Links) unwatch(w *Watched, wd int32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.owner[wd] == w {
		delete(l.owner, wd)
		unix.InotifyRmWatch(l.ifd, uint32(wd))
		l.Budget.give(l.Holder, 1)
	}
}

// release removes every watch of w and its events not taken.
func (l *Links) release(w *Watched) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for wd, o := range l.owner {
		if o == w {
			delete(l.owner, wd)
			unix.InotifyRmWatch(l.ifd, uint32(wd))
			l.Budget.give(l.Holder, 1)
		}
	}
	l.queued -= len(l.pending[w])
	delete(l.pending, w)
}

// Close closes the role's inotify instance; its trees walk anew.
func (l *Links) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ifd > 0 {
		unix.Close(l.ifd)
	}
	l.Budget.give(l.Holder, len(l.owner))
	l.ifd, l.owner, l.pending, l.queued = 0, nil, nil, 0
	l.walks++
	l.gen++
}

// take drains the instance, hands each event to the tree that owns its
// watch, and returns w's. An overflow, of the kernel's queue or of what
// waits here for trees, is a doubt in every tree.
func (l *Links) take(w *Watched) ([]wevent, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	buf := make([]byte, 64<<10)
	for l.ifd > 0 {
		nr, err := unix.Read(l.ifd, buf)
		if errors.Is(err, unix.EAGAIN) {
			break
		}
		if err != nil {
			return nil, err
		}
		for off := 0; off < nr; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := ""
			if ev.Len > 0 {
				b := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				if i := strings.IndexByte(string(b), 0); i >= 0 {
					b = b[:i]
				}
				name = string(b)
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if ev.Mask&unix.IN_Q_OVERFLOW != 0 || l.queued >= 1<<16 {
				l.pending, l.queued = map[*Watched][]wevent{}, 0
				l.walks++
				l.gen++
				continue
			}
			if o := l.owner[ev.Wd]; o != nil {
				l.pending[o] = append(l.pending[o], wevent{ev.Wd, ev.Mask, ev.Cookie, name})
				l.queued++
			}
		}
	}
	evs := l.pending[w]
	l.queued -= len(evs)
	delete(l.pending, w)
	return evs, nil
}

// doubt makes every tree of the role walk whole.
func (l *Links) doubt() {
	l.mu.Lock()
	l.walks++
	l.gen++
	l.mu.Unlock()
}

func (l *Links) walkGen() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.walks
}

// Gen moves on whenever an inode joins.
func (l *Links) Gen() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.gen
}

// Len is how many inodes it holds.
func (l *Links) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.multi)
}

func (l *Links) add(k devIno) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.multi == nil {
		l.multi = map[devIno]bool{}
	}
	if l.multi[k] {
		return false
	}
	l.multi[k] = true
	l.gen++
	return true
}

func (l *Links) has(k devIno) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.multi[k]
}

// Retain keeps only the inodes some tree still holds as multi-linked, so
// that the set never outgrows the trees. The caller holds every tree.
func (l *Links) Retain(trees []*Watched) {
	keep := map[devIno]bool{}
	for _, w := range trees {
		if !w.valid {
			return // a tree not cached cannot say what it holds
		}
		for _, n := range w.nodes {
			for _, e := range n.ents {
				if k := (devIno{e.dev, e.ino}); !e.dir && l.has(k) {
					keep[k] = true
				}
			}
		}
	}
	l.mu.Lock()
	l.multi = keep
	l.mu.Unlock()
}

// Close drops the watches (and the inotify instance, where w made its
// Links itself).
func (w *Watched) Close() {
	if w.Links != nil && w.nodes != nil {
		w.Links.release(w)
	}
	if w.ownLinks {
		w.Links.Close()
	}
	w.valid, w.nodes, w.root = false, nil, nil
}

// unseen says whether inotify can miss a change of the entry's blocks: a
// file with more than one link (written through another name, no event
// here) or whose blocks are not exactly its size rounded up (holes that a
// write through mmap fills with no event).
func unseen(st *unix.Stat_t) bool {
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false
	}
	if st.Nlink > 1 {
		return true
	}
	bs := int64(st.Blksize)
	if bs <= 0 {
		bs = 4096
	}
	return st.Blocks*512 != (st.Size+bs-1)/bs*bs
}

// Measure is Usage(top), from the cache where it can be trusted.
func (w *Watched) Measure(top *os.File) (bytes, entries int64, err error) {
	// The cache is of one folder: another one put at the same path is
	// walked anew.
	var st unix.Stat_t
	if err := unix.Fstat(int(top.Fd()), &st); err != nil {
		return 0, 0, fmt.Errorf("%s: %w", top.Name(), err)
	}
	if w.valid && (st.Dev != w.rootDev || st.Ino != w.root.ino || w.Links.walkGen() != w.walks) {
		w.valid = false
	}
	if !w.valid && w.overBudget > 0 {
		// Setting up the watches again at every check would cost as much
		// as the walk, and take them from other trees for that time.
		w.overBudget--
		return Usage(top)
	}
	if w.valid && (w.ResyncEvery == 0 || w.since < w.ResyncEvery) {
		if err := w.update(top); err == nil {
			w.since++
			return w.bytes, w.entries, nil
		}
		w.Links.doubt()
	}
	return w.rebuild(top)
}

func (w *Watched) rebuild(top *os.File) (int64, int64, error) {
	if w.nodes != nil {
		w.Links.release(w)
	}
	w.valid, w.nodes, w.root = false, nil, nil
	w.Full++
	w.since = 0
	if w.Links == nil {
		w.Links, w.ownLinks = &Links{}, true
	}
	if err := w.Links.instance(); err != nil {
		// Out of inotify instances (fs.inotify.max_user_instances): the
		// measure of record is the plain walk's.
		w.Unwatched = fmt.Errorf("%s: inotify: %w", top.Name(), err)
		return Usage(top)
	}
	w.nodes = map[int32]*wnode{}
	w.seen, w.walks = w.Links.Gen(), w.Links.walkGen()
	var st unix.Stat_t
	if err := unix.Fstat(int(top.Fd()), &st); err != nil {
		w.Close()
		return 0, 0, err
	}
	dir, err := reopenDir(top)
	if err != nil {
		w.Close()
		return st.Blocks * 512, 1, err
	}
	defer unix.Close(dir)
	w.root, w.rootDev = &wnode{ino: st.Ino, self: st.Blocks * 512}, st.Dev
	w.bytes, w.entries, w.always = 0, 0, 0
	if err := w.fill(dir, w.root, top.Name()); err != nil {
		w.Close()
		// The measure of record stays the plain walk's (a tree over the
		// caps is over them there too).
		w.Unwatched = err
		if errors.Is(err, ErrWatchBudget) {
			w.overBudget = w.ResyncEvery
		}
		return Usage(top)
	}
	w.valid, w.Unwatched = true, nil
	return w.bytes, w.entries, nil
}

// fill watches the folder dir holds, then lists it: what changes after the
// watch is in place is reported, and what came before is read.
func (w *Watched) fill(dir int, n *wnode, path string) error {
	if n.depth >= MaxDepth {
		return fmt.Errorf("%s: %w", path, ErrTooBig)
	}
	wd, err := w.Links.watch(w, "/proc/self/fd/"+itoa(dir))
	if err != nil {
		return fmt.Errorf("%s: watch: %w", path, err)
	}
	n.wd = wd
	w.nodes[n.wd] = n
	w.bytes += n.self
	w.entries++
	n.ents = map[string]went{}
	ents, err := readDir(dir, path, make([]byte, 32<<10))
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := w.add(dir, n, e.name, path+"/"+e.name); err != nil {
			return err
		}
	}
	return nil
}

// add stats one entry of n and, for a folder, watches and fills it.
func (w *Watched) add(dir int, n *wnode, name, path string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("%s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK && weaken.Enabled && weaken.Has(weaken.DiskSymlinks) {
		return nil
	}
	if w.entries >= MaxEntries {
		return fmt.Errorf("%s: %w", path, ErrTooBig)
	}
	// A symlink is counted as Usage counts it, by its own blocks (a long
	// target takes one), and never followed. Its target cannot change,
	// so an event on its name is all it ever needs.
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		k := devIno{st.Dev, st.Ino}
		if st.Nlink > 1 && st.Mode&unix.S_IFMT == unix.S_IFREG && w.Links.add(k) {
			w.newMulti = true
		}
		e := went{dev: st.Dev, ino: st.Ino, blocks: st.Blocks * 512, always: !w.Blind && (unseen(&st) || w.Links.has(k))}
		n.ents[name] = e
		w.bytes += e.blocks
		w.entries++
		if e.always {
			w.always++
		}
		return nil
	}
	sub, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil
		}
		return fmt.Errorf("%s: %w", path, err)
	}
	defer unix.Close(sub)
	// The folder that was opened, not the name stat'ed, is what is kept.
	if err := unix.Fstat(sub, &st); err != nil {
		return err
	}
	c := &wnode{parent: n, name: name, ino: st.Ino, depth: n.depth + 1, self: st.Blocks * 512}
	n.ents[name] = went{ino: st.Ino, dir: true}
	return w.fill(sub, c, path)
}

// drop forgets one entry of n, and a folder's whole subtree.
func (w *Watched) drop(n *wnode, name string) {
	e, ok := n.ents[name]
	if !ok {
		return
	}
	delete(n.ents, name)
	if !e.dir {
		w.bytes -= e.blocks
		w.entries--
		if e.always {
			w.always--
		}
		return
	}
	for wd, c := range w.nodes {
		if c.parent == n && c.name == name {
			w.dropNode(wd, c)
		}
	}
}

func (w *Watched) dropNode(wd int32, c *wnode) {
	for name := range c.ents {
		w.drop(c, name)
	}
	w.bytes -= c.self
	w.entries--
	delete(w.nodes, wd)
	w.Links.unwatch(w, wd)
}

var errDoubt = errors.New("in doubt")

// update drains the events and revisits what they name and what inotify
// cannot see. Any doubt is an error, and the caller walks it all.
func (w *Watched) update(top *os.File) error {
	w.markLinked()
	evs, err := w.Links.take(w)
	if err != nil {
		return err
	}
	if w.Links.walkGen() != w.walks {
		return errDoubt // events were lost
	}
	r := newReplay()
	for _, ev := range evs {
		if err := r.event(w, ev); err != nil {
			return err
		}
	}
	// A written file renamed out of this tree: where it went, and whether
	// it is still there, no event here says.
	if len(r.movedWritten) > 0 {
		return errDoubt
	}
	byNode := w.dropChanged(r)
	w.newMulti = false
	for n, names := range byNode {
		if _, live := w.nodes[n.wd]; !live {
			continue
		}
		if err := w.revisit(top, n, names, func(name string) bool { return r.written[entKey{n, name}] }); err != nil {
			return err
		}
	}
	if w.newMulti {
		return errDoubt
	}
	return nil
}

// markLinked marks the inodes another tree found linked since the last
// update: they are re-stat'ed at every update from now on.
func (w *Watched) markLinked() {
	g := w.Links.Gen()
	if g == w.seen || w.Blind {
		return
	}
	w.seen = g
	for _, n := range w.nodes {
		for name, e := range n.ents {
			if !e.dir && !e.always && w.Links.has(devIno{e.dev, e.ino}) {
				e.always = true
				n.ents[name] = e
				w.always++
			}
		}
	}
}

// entKey is a name in a watched folder.
type entKey struct {
	n    *wnode
	name string
}

// replay is what an update's events say, replayed in order: the names
// and folders they changed, and whether each name is there after them.
type replay struct {
	changed     map[entKey]bool
	selfChanged map[*wnode]bool
	// here says, per name an event gave, whether the name is there after
	// the events so far: the cache's answer, then each create or remove.
	here map[entKey]bool
	// written are the names written through since they were last there
	// or last measured: if such a name is gone before it is re-stat'ed,
	// its inode may live on under another name (a hard link made
	// elsewhere) that no event named, so the update is in doubt. A rename
	// within the tree carries the mark (by the events' cookie).
	written      map[entKey]bool
	movedWritten map[uint32]bool
}

func newReplay() *replay {
	return &replay{changed: map[entKey]bool{}, selfChanged: map[*wnode]bool{}, here: map[entKey]bool{}, written: map[entKey]bool{}, movedWritten: map[uint32]bool{}}
}

// event replays one event; errDoubt when it leaves the measure in doubt.
func (r *replay) event(w *Watched, ev wevent) error {
	name := ev.name
	n := w.nodes[ev.wd]
	if n == nil {
		return nil // a folder already dropped
	}
	if n == w.root && ev.mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_IGNORED) != 0 {
		return errDoubt
	}
	if name == "" {
		r.selfChanged[n] = true
		return nil
	}
	k := entKey{n, name}
	r.changed[k] = true
	if ev.mask&(unix.IN_CREATE|unix.IN_DELETE|unix.IN_MOVED_FROM|unix.IN_MOVED_TO) != 0 {
		r.selfChanged[n] = true
	}
	is, seen := r.here[k]
	if !seen {
		_, is = n.ents[name]
	}
	switch {
	case ev.mask&unix.IN_CREATE != 0:
		r.here[k], r.written[k] = true, false
	case ev.mask&unix.IN_MOVED_TO != 0:
		if r.written[k] {
			return errDoubt // a written file replaced by a rename
		}
		r.here[k], r.written[k] = true, r.movedWritten[ev.cookie]
		delete(r.movedWritten, ev.cookie)
	case ev.mask&unix.IN_DELETE != 0:
		if r.written[k] {
			return errDoubt // a written file removed unmeasured
		}
		r.here[k] = false
	case ev.mask&unix.IN_MOVED_FROM != 0:
		if r.written[k] {
			r.movedWritten[ev.cookie] = true
		}
		r.here[k], r.written[k] = false, false
	case !is && ev.mask&unix.IN_MODIFY != 0:
		// A write through a name that is not there (a descriptor
		// opened before its name was removed): the inode may have
		// another name the measure holds, which no event named.
		// A close or a change of attributes adds no blocks.
		return errDoubt
	case ev.mask&unix.IN_MODIFY != 0:
		r.here[k], r.written[k] = is, true
	default:
		r.here[k] = is
	}
	return nil
}

// dropChanged drops from the measure every name the events changed and
// every name re-stat'ed always, and returns them by folder (a folder
// whose own entry changed with no name): what revisit walks again.
// Removals come first: a folder moved within the tree is dropped, then
// walked anew where it landed, and keeps its watch.
func (w *Watched) dropChanged(r *replay) map[*wnode][]string {
	byNode := map[*wnode][]string{}
	for k := range r.changed {
		if _, live := w.nodes[k.n.wd]; !live {
			continue
		}
		w.drop(k.n, k.name)
		byNode[k.n] = append(byNode[k.n], k.name)
	}
	for n := range r.selfChanged {
		if _, live := w.nodes[n.wd]; live && byNode[n] == nil {
			byNode[n] = nil
		}
	}
	if w.always > 0 {
		for _, n := range w.nodes {
			for name, e := range n.ents {
				if e.always {
					w.drop(n, name)
					byNode[n] = append(byNode[n], name)
				}
			}
		}
	}
	return byNode
}

// revisit opens n again beneath top (no symlinks, no leaving it), checks
// it is still the folder watched, re-stats it and the names.
func (w *Watched) revisit(top *os.File, n *wnode, names []string, written func(string) bool) error {
	var parts []string
	for c := n; c.parent != nil; c = c.parent {
		parts = append(parts, c.name)
	}
	rel := "."
	for i := len(parts) - 1; i >= 0; i-- {
		if rel == "." {
			rel = parts[i]
		} else {
			rel += "/" + parts[i]
		}
	}
	dir, err := OpenBeneath(int(top.Fd()), rel, unix.O_RDONLY|unix.O_DIRECTORY, 0, Strict)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", errDoubt, rel, err)
	}
	defer unix.Close(dir)
	var st unix.Stat_t
	if err := unix.Fstat(dir, &st); err != nil || st.Ino != n.ino {
		return errDoubt
	}
	w.bytes += st.Blocks*512 - n.self
	n.self = st.Blocks * 512
	for _, name := range names {
		if _, ok := n.ents[name]; ok {
			continue
		}
		if err := w.add(dir, n, name, top.Name()+"/"+rel+"/"+name); err != nil {
			return err
		}
		if _, ok := n.ents[name]; !ok && written(name) {
			return errDoubt // written, then gone before this re-stat
		}
	}
	return nil
}

func itoa(i int) string { return fmt.Sprint(i) }
