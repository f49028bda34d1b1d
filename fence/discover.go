// Package fence knows the rig's GPUs: which cards and control nodes exist,
// the layout that gives each card its place (and so the device files each
// command may not open, which internal/landlock's rule set leaves out),
// and the device files' owners and modes.
package fence

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Card is one GPU.
type Card struct {
	Index int    `json:"index"` // the driver's order: by PCI bus location, as NVML counts
	Minor int    `json:"minor"` // the device node's minor number: /dev/nvidia<minor>
	UUID  string `json:"uuid"`
	Path  string `json:"path"`
	Bus   string `json:"bus,omitempty"`
}

// Devices is what discovery found.
type Devices struct {
	Cards   []Card   `json:"cards"`
	Control []string `json:"control"` // nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset, nvidia-caps/*
	Source  string   `json:"source"`  // "nvml" or "dev"
	NVML    string   `json:"nvml"`    // what NVML said: "no NVML: …" when it did not load
}

// ControlNodes are the driver's nodes that are not a card.
var ControlNodes = []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"}

// Paths lists every GPU device file discovery found, cards first.
func (d *Devices) Paths() []string {
	var out []string
	for _, c := range d.Cards {
		out = append(out, c.Path)
	}
	return append(out, d.Control...)
}

var cardName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^nvidia([0-9]+)$`) })

// Discover finds the cards and control nodes. With NVML (the `nvml` build,
// where the driver's library loads) NVML gives the cards; otherwise they
// come from devRoot/nvidia[0-9]* and procRoot/driver/nvidia/gpus/*/information.
// A card node without its information has no UUID: Plan refuses it, naming
// it, while the fence still leaves it out.
func Discover(devRoot, procRoot string) (*Devices, error) {
	d := &Devices{Source: "dev"}
	cards, nvmlNote, err := discoverNVML(devRoot)
	d.NVML = nvmlNote
	if err != nil {
		return nil, err
	}
	if cards != nil {
		d.Source = "nvml"
		d.Cards = cards
	} else if d.Cards, err = discoverDev(devRoot, procRoot); err != nil {
		return nil, err
	}
	for _, n := range ControlNodes {
		p := filepath.Join(devRoot, n)
		if isCharDev(p) {
			d.Control = append(d.Control, p)
		}
	}
	caps := filepath.Join(devRoot, "nvidia-caps")
	if ents, err := os.ReadDir(caps); err == nil {
		for _, e := range ents {
			p := filepath.Join(caps, e.Name())
			if isCharDev(p) {
				d.Control = append(d.Control, p)
			}
		}
	}
	return d, nil
}

func isCharDev(p string) bool {
	var st unix.Stat_t
	return unix.Lstat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR
}

// procInfo is one card's /proc/driver/nvidia/gpus/<bus>/information.
type procInfo struct {
	uuid  string
	minor int
	bus   string
}

func readProcInfo(procRoot string) (map[int]procInfo, error) {
	dir := filepath.Join(procRoot, "driver", "nvidia", "gpus")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return map[int]procInfo{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("fence: %w", err)
	}
	out := map[int]procInfo{}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name(), "information")
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		info := procInfo{minor: -1, bus: e.Name()}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if !ok {
				continue
			}
			v = strings.TrimSpace(v)
			switch strings.TrimSpace(k) {
			case "GPU UUID":
				info.uuid = v
			case "Device Minor":
				info.minor, _ = strconv.Atoi(v)
			case "Bus Location":
				info.bus = v
			}
		}
		f.Close()
		if info.minor >= 0 && info.uuid != "" {
			out[info.minor] = info
		}
	}
	return out, nil
}

func discoverDev(devRoot, procRoot string) ([]Card, error) {
	ents, err := os.ReadDir(devRoot)
	if err != nil {
		return nil, fmt.Errorf("fence: %w", err)
	}
	info, err := readProcInfo(procRoot)
	if err != nil {
		return nil, err
	}
	var cards []Card
	for _, e := range ents {
		m := cardName().FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		p := filepath.Join(devRoot, e.Name())
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
			continue
		}
		minor, _ := strconv.Atoi(m[1])
		// A node the driver's information does not name keeps an empty
		// UUID: it is still a card to fence off, and Plan refuses it.
		in := info[minor]
		if in.bus == "" {
			in.bus = "~" + m[1] // unnamed cards sort last
		}
		cards = append(cards, Card{Minor: minor, UUID: in.uuid, Path: p, Bus: in.bus})
	}
	// The driver numbers cards by PCI bus location, as NVML does.
	sort.Slice(cards, func(i, j int) bool {
		if cards[i].Bus != cards[j].Bus {
			return cards[i].Bus < cards[j].Bus
		}
		return cards[i].Minor < cards[j].Minor
	})
	for i := range cards {
		cards[i].Index = i
	}
	return cards, nil
}
