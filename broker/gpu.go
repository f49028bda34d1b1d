package broker

import (
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"thermite/fence"
	"thermite/internal/hostpolicy"
	"thermite/internal/rpc"
)

// gpuState is the broker's view of the GPUs: the devices, their layout,
// whether their permissions can be fixed, and the built rule sets.
type gpuState struct {
	mu         sync.Mutex
	devices    *fence.Devices
	layout     *fence.Layout
	abiErr     error // the kernel lacks the Landlock rights the fence needs
	permsFixed bool
	permsNote  string
	built      map[string]*builtFence
}

// builtFence is one rule set, kept and handed to every shim that needs it.
// Commands hold it from their preparation until their shim has started;
// an evicted one is closed when the last of them lets go, never while a
// command may still hand its descriptor number to a shim.
type builtFence struct {
	fd      *os.File
	stamps  []fence.Stamp
	refs    int
	evicted bool
}

// evictLocked takes a rule set out of the cache; it closes once unheld.
func (bf *builtFence) evictLocked() {
	bf.evicted = true
	if bf.refs == 0 {
		bf.fd.Close()
	}
}

// initFence discovers the GPUs, places them in the layout, fixes their
// device files and keeps doing so on a timer. GPU trouble never stops the
// broker: it refuses GPU work, with the reason, in FenceFor.
func (b *Broker) initFence() error {
	b.gpu.built = map[string]*builtFence{}
	b.gpu.abiErr = fence.CheckABI(b.cfg.GPU.FenceMinABI)
	b.refreshGPUs()
	go func() {
		t := time.NewTicker(b.cfg.GPU.FixInterval.Duration)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				b.refreshGPUs()
			case <-b.stopCh:
				return
			}
		}
	}()
	return nil
}

// refreshGPUs discovers the devices again, replans the layout and puts the
// device files' owners and modes back.
func (b *Broker) refreshGPUs() {
	d, err := fence.Discover(b.cfg.GPU.DevRoot, b.cfg.GPU.ProcRoot)
	var l *fence.Layout
	if err != nil {
		d = &fence.Devices{Source: "dev"}
		l = &fence.Layout{Kind: b.cfg.GPU.Layout, Refused: err.Error(), Group: map[int]string{}, Timing: map[int]string{}}
	} else {
		l = fence.Plan(b.cfg.GPU.Layout, d, b.cfg.TimingUsers)
	}
	fixed, note := fence.FixPermissions(b.heldCardWants(l, l.Wanted(b.groupGID)))
	if l.Refused == "" && len(d.Cards) > 0 {
		l.Refused = hostpolicy.GPUDecision(fixed, note, b.gpu.abiErr, b.cfg.Host.AcceptLost)
	}
	b.gpu.mu.Lock()
	was := ""
	if b.gpu.layout != nil {
		was = b.gpu.layout.Refused
	}
	b.gpu.devices, b.gpu.layout = d, l
	b.gpu.permsFixed, b.gpu.permsNote = fixed, note
	b.gpu.mu.Unlock()
	if l.Refused != was && l.Refused != "" {
		b.log.Warn("GPU work refused", "why", l.Refused)
	}
	if note != "" {
		b.note(note)
	}
}

func (b *Broker) groupGID(name string) (int, bool) { return groupGIDIn(b.table, name) }

// ruleSet returns the built rule set for a spec, building it the first
// time and again whenever a folder it was built from has changed (a node
// appeared in /dev), and a release the caller calls once its shim has
// started (or will not start).
func (b *Broker) ruleSet(spec fence.RoleSpec) (*os.File, func(), error) {
	// Landlock rules hold the inodes of their paths: a writable place made
	// anew at the same path (a timed run's fresh out/) is another rule set.
	key := fmt.Sprintf("%v", spec)
	for _, w := range spec.Writable {
		var st unix.Stat_t
		if unix.Lstat(w, &st) == nil {
			key += fmt.Sprintf(":%d/%d", st.Dev, st.Ino)
		}
	}
	b.gpu.mu.Lock()
	defer b.gpu.mu.Unlock()
	if bf, ok := b.gpu.built[key]; ok {
		if fence.Stale(bf.stamps) == "" {
			return bf.fd, b.holdRuleSetLocked(bf), nil
		}
		delete(b.gpu.built, key)
		bf.evictLocked()
	}
	p, walked, err := fence.RolePolicy(spec)
	if err != nil {
		return nil, nil, err
	}
	stamps := fence.Stamps(walked)
	minABI := fence.PolicyABI
	if spec.FenceOnly {
		minABI = fence.FenceABI
	}
	if abi := b.kernel.ABI; abi < minABI && !spec.FenceOnly {
		// The start got past the kernel policy, so the operator accepted
		// every protection this kernel lacks: the rule set keeps what the
		// kernel has, and none is built where Landlock is missing.
		if abi == 0 {
			return nil, func() {}, nil
		}
		p.Fit(abi)
		minABI = abi
	}
	fd, err := p.Build(minABI)
	if err != nil {
		return nil, nil, err
	}
	if len(b.gpu.built) >= 256 {
		// Rule sets of places long gone (every timed run has its own out/):
		// let them go once no command holds them.
		for k, old := range b.gpu.built {
			delete(b.gpu.built, k)
			old.evictLocked()
		}
	}
	bf := &builtFence{fd: fd, stamps: stamps}
	b.gpu.built[key] = bf
	return fd, b.holdRuleSetLocked(bf), nil
}

// holdRuleSetLocked counts one more holder of bf and returns its release,
// which is safe to call more than once.
func (b *Broker) holdRuleSetLocked(bf *builtFence) func() {
	bf.refs++
	var once sync.Once
	return func() {
		once.Do(func() {
			b.gpu.mu.Lock()
			defer b.gpu.mu.Unlock()
			bf.refs--
			if bf.evicted && bf.refs == 0 {
				bf.fd.Close()
			}
		})
	}
}

func (b *Broker) gpuStatus() *rpc.GPUStatus {
	b.gpu.mu.Lock()
	defer b.gpu.mu.Unlock()
	l, d := b.gpu.layout, b.gpu.devices
	if l == nil {
		return nil
	}
	st := &rpc.GPUStatus{
		Layout: l.Kind, Usable: l.Refused == "", Refused: l.Refused,
		Control: d.Control, FenceABI: fence.ABI(), PermsFixed: b.gpu.permsFixed, PermsNote: b.gpu.permsNote,
		Discovery: d.Source + " (" + d.NVML + ")",
	}
	if why := hostpolicy.GPUDecision(b.gpu.permsFixed, b.gpu.permsNote, b.gpu.abiErr, b.cfg.Host.AcceptLost); why != "" {
		st.Usable = false
		if st.Refused == "" {
			st.Refused = why
		}
	}
	for _, c := range d.Cards {
		st.Cards = append(st.Cards, rpc.GPUCard{Index: c.Index, Minor: c.Minor, UUID: c.UUID, Path: c.Path, Group: l.Group[c.Index]})
		if l.Refused == "" {
			st.Assignments = append(st.Assignments, rpc.GPUGrant{Card: c.Index, Roles: []string{l.Timing[c.Index], "lane-N (development runs)"}})
		}
	}
	return st
}

// GPULayout is the current layout (for the self-test).
func (b *Broker) GPULayout() *fence.Layout {
	b.gpu.mu.Lock()
	defer b.gpu.mu.Unlock()
	return b.gpu.layout
}

func landlockABI() int { return fence.ABI() }

func uniqueInts(in []int) []int {
	sort.Ints(in)
	out := in[:0]
	for i, v := range in {
		if i == 0 || v != in[i-1] {
			out = append(out, v)
		}
	}
	return out
}
