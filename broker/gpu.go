package broker

import (
	"sort"
	"sync"
	"time"

	"thermite/fence"
	"thermite/internal/hostpolicy"
	"thermite/internal/landlock"
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
}

// initFence discovers the GPUs, places them in the layout, fixes their
// device files and keeps doing so on a timer. GPU trouble never stops the
// broker: it refuses GPU work, with the reason, in the layout's Refused,
// which fence.Layout.CardsFor answers to PlanRun (planGPUs).
func (b *Broker) initFence() error {
	b.gpu.abiErr = landlock.CheckABI(b.cfg.GPU.FenceMinABI)
	b.refreshGPUs()
	go func() {
		t := time.NewTicker(b.cfg.GPU.FixInterval.Duration)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				b.refreshGPUs()
			case <-b.life.stopCh:
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

func (b *Broker) gpuStatus() *rpc.GPUStatus {
	b.gpu.mu.Lock()
	defer b.gpu.mu.Unlock()
	l, d := b.gpu.layout, b.gpu.devices
	if l == nil {
		return nil
	}
	st := &rpc.GPUStatus{
		Layout: l.Kind, Usable: l.Refused == "", Refused: l.Refused,
		Control: d.Control, FenceABI: landlock.ABI(), PermsFixed: b.gpu.permsFixed, PermsNote: b.gpu.permsNote,
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

func landlockABI() int { return landlock.ABI() }

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
