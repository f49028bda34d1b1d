// Package landlock is every Landlock rule set thermite makes: a role
// command's (RolePolicy), the GPU fence alone (FenceRights), the controller
// daemon's (ControllerPolicy), the kernel ABI they need, and the cache of
// built rule sets the broker hands to each command (Cache). What a role may
// read, write and reach over TCP is decided here; which GPU device files it
// may open is fence's layout, handed in as paths.
package landlock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"

	"thermite/internal/weaken"
)

// Landlock rights the GPU fence alone handles: reading and writing files
// and, from ABI 5, ioctl on devices. Without IOCTL_DEV a node opened with access mode
// 3 (no read, no write) still reaches the driver's ioctls.
const (
	FenceRights = ll.AccessFSReadFile | ll.AccessFSWriteFile | ll.AccessFSIoctlDev
	// FenceABI is the first ABI with IOCTL_DEV.
	FenceABI = 5
)

// fileRights are the rights Landlock accepts on a rule for a non-folder.
const fileRights = ll.AccessFSExecute | ll.AccessFSWriteFile | ll.AccessFSReadFile | ll.AccessFSTruncate | ll.AccessFSIoctlDev

// abiRights is every filesystem right each ABI knows.
var abiRights = map[int]uint64{
	1: (ll.AccessFSMakeSym << 1) - 1,
	2: (ll.AccessFSRefer << 1) - 1,
	3: (ll.AccessFSTruncate << 1) - 1,
	4: (ll.AccessFSTruncate << 1) - 1,
	5: (ll.AccessFSIoctlDev << 1) - 1,
	6: (ll.AccessFSIoctlDev << 1) - 1,
	7: (ll.AccessFSIoctlDev << 1) - 1,
}

// ABI is the kernel's Landlock ABI, 0 when Landlock is off. A test build
// may pretend an older one (weaken.LandlockABI).
func ABI() int {
	v, err := ll.LandlockGetABIVersion()
	if err != nil {
		v = 0
	}
	if weaken.Enabled {
		if p := weaken.LandlockABI(); p >= 0 && p < v {
			return p
		}
	}
	return v
}

// abiFeature is what each ABI brought, for messages that name the first
// thing an older kernel lacks.
var abiFeature = map[int]string{
	1: "file access rules",
	2: "REFER (links and renames across folders)",
	3: "TRUNCATE",
	4: "TCP bind and connect rules",
	5: "IOCTL_DEV",
	6: "scoping of abstract unix sockets and signals",
	7: "audit logging",
}

// CheckABI refuses a kernel older than need, naming the first feature it
// lacks.
func CheckABI(need int) error {
	have := ABI()
	if have >= need {
		return nil
	}
	if f, ok := abiFeature[have+1]; ok {
		return fmt.Errorf("landlock ABI %d lacks %s (need %d)", have, f, need)
	}
	return fmt.Errorf("landlock ABI %d is older than this rig requires (need %d)", have, need)
}

// Fit trims a rule set to what a kernel of this ABI knows: rights, network
// rules and scopes it lacks are no longer handled. Only the broker's kernel
// policy (internal/hostpolicy) may call it, once the operator has accepted
// every protection it takes away.
func (p *Policy) Fit(abi int) {
	known, ok := abiRights[abi]
	if !ok && abi > 7 {
		known = abiRights[7]
	}
	p.HandledFS &= known
	// A rule left with no right is refused by the kernel (ENOMSG): dropped.
	rules := p.Rules[:0]
	for _, r := range p.Rules {
		if r.Access &= known; r.Access != 0 {
			rules = append(rules, r)
		}
	}
	p.Rules = rules
	if abi < 4 {
		p.HandledNet, p.TCPPorts = 0, nil
	}
	if abi < 6 {
		p.Scoped = 0
	}
}

// Rule grants rights beneath one path.
type Rule struct {
	Path   string
	Access uint64
}

// Policy is one Landlock rule set: the rights it handles and the rules
// that grant them back. Everything handled and not granted is denied.
type Policy struct {
	HandledFS  uint64
	Rules      []Rule
	HandledNet uint64
	TCPPorts   map[uint16]uint64 // port -> net rights granted
	Scoped     uint64
}

// GrantAllExcept grants rights on the whole file system but the paths in
// deny and what lies beneath them. Landlock rules are hierarchical, so the
// only way to leave a path out is to grant its siblings one by one, and
// those of each folder on the way down from /; a folder that holds a
// denied path is never granted itself, so an entry made in it later (a
// new device node) is denied. Symlinks are skipped: what they point at is
// granted, or not, under its own name. It returns the folders it walked,
// whose changes make the rules stale.
func GrantAllExcept(rights uint64, deny []string, always []string) (rules []Rule, walked []string, err error) {
	denied := map[string]bool{}
	holds := map[string]bool{} // folders that hold a denied path
	mark := func(p string) {
		for d := filepath.Dir(p); ; d = filepath.Dir(d) {
			holds[d] = true
			if d == "/" {
				break
			}
		}
	}
	for _, p := range deny {
		p = filepath.Clean(p)
		if !filepath.IsAbs(p) || p == "/" {
			return nil, nil, fmt.Errorf("landlock: cannot leave out %q", p)
		}
		denied[p] = true
		mark(p)
	}
	// Folders that are walked even with nothing denied in them, so that
	// what appears in them later is not granted: the device root.
	for _, p := range always {
		p = filepath.Clean(p)
		holds[p] = true
		mark(p)
	}
	var walk func(dir string) error
	walk = func(dir string) error {
		walked = append(walked, dir)
		ents, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("landlock: %w", err)
		}
		for _, e := range ents {
			p := filepath.Join(dir, e.Name())
			switch {
			case denied[p]:
			case holds[p] && e.IsDir():
				if err := walk(p); err != nil {
					return err
				}
			case e.Type()&os.ModeSymlink != 0:
			default:
				a := rights
				if !e.IsDir() {
					a &= fileRights
				}
				if a != 0 {
					rules = append(rules, Rule{Path: p, Access: a})
				}
			}
		}
		return nil
	}
	if err := walk("/"); err != nil {
		return nil, nil, err
	}
	return rules, walked, nil
}

// Build makes the kernel rule set and returns its descriptor: the broker
// keeps it (Cache) and hands it to each spawn.Start child, which only calls
// landlock_restrict_self. It
// is strict: a right the kernel does not know is an error, never dropped.
func (p *Policy) Build(minABI int) (*os.File, error) {
	if err := CheckABI(minABI); err != nil {
		return nil, err
	}
	abi := ABI()
	known, ok := abiRights[abi]
	if !ok && abi > 7 {
		known = abiRights[7]
	}
	if extra := p.HandledFS &^ known; extra != 0 {
		return nil, fmt.Errorf("landlock ABI %d does not know rights %#x", abi, extra)
	}
	if p.HandledNet != 0 && abi < 4 {
		return nil, fmt.Errorf("landlock ABI %d has no network rules (need 4)", abi)
	}
	if p.Scoped != 0 && abi < 6 {
		return nil, fmt.Errorf("landlock ABI %d has no scoping (need 6)", abi)
	}
	attr := ll.RulesetAttr{HandledAccessFS: p.HandledFS, HandledAccessNet: p.HandledNet, Scoped: p.Scoped}
	fd, err := ll.LandlockCreateRuleset(&attr, 0)
	if err != nil {
		return nil, fmt.Errorf("landlock: create rule set: %w", err)
	}
	f := os.NewFile(uintptr(fd), "landlock-ruleset")
	unix.CloseOnExec(fd)
	for _, r := range p.Rules {
		if err := addPath(fd, r); err != nil {
			f.Close()
			return nil, err
		}
	}
	ports := make([]int, 0, len(p.TCPPorts))
	for port := range p.TCPPorts {
		ports = append(ports, int(port))
	}
	sort.Ints(ports)
	for _, port := range ports {
		a := ll.NetPortAttr{AllowedAccess: p.TCPPorts[uint16(port)], Port: uint64(port)}
		if err := ll.LandlockAddNetPortRule(fd, &a, 0); err != nil {
			f.Close()
			return nil, fmt.Errorf("landlock: TCP port %d: %w", port, err)
		}
	}
	return f, nil
}

func addPath(ruleset int, r Rule) error {
	fd, err := unix.Open(r.Path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil // gone since the walk: nothing to grant
		}
		return fmt.Errorf("landlock: %s: %w", r.Path, err)
	}
	defer unix.Close(fd)
	attr := ll.PathBeneathAttr{AllowedAccess: r.Access, ParentFd: fd}
	if err := ll.LandlockAddPathBeneathRule(ruleset, &attr, 0); err != nil {
		return fmt.Errorf("landlock: rule for %s (%#x): %w", r.Path, r.Access, err)
	}
	return nil
}

// Describe spells a rule set for logs.
func (p *Policy) Describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "handled fs %#x, %d rules", p.HandledFS, len(p.Rules))
	if p.HandledNet != 0 {
		fmt.Fprintf(&b, ", net %#x on %d ports", p.HandledNet, len(p.TCPPorts))
	}
	if p.Scoped != 0 {
		fmt.Fprintf(&b, ", scoped %#x", p.Scoped)
	}
	return b.String()
}
