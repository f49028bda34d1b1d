package fence

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

// Landlock rights the fence handles: reading and writing files and, from
// ABI 5, ioctl on devices. Without IOCTL_DEV a node opened with access mode
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
		return fmt.Errorf("fence: landlock ABI %d lacks %s (need %d)", have, f, need)
	}
	return fmt.Errorf("fence: landlock ABI %d is older than this rig requires (need %d)", have, need)
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
			return nil, nil, fmt.Errorf("fence: cannot leave out %q", p)
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
			return fmt.Errorf("fence: %w", err)
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
// keeps it and hands it to each shim, which only calls restrict_self. It
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
		return nil, fmt.Errorf("fence: landlock ABI %d does not know rights %#x", abi, extra)
	}
	if p.HandledNet != 0 && abi < 4 {
		return nil, fmt.Errorf("fence: landlock ABI %d has no network rules (need 4)", abi)
	}
	if p.Scoped != 0 && abi < 6 {
		return nil, fmt.Errorf("fence: landlock ABI %d has no scoping (need 6)", abi)
	}
	attr := ll.RulesetAttr{HandledAccessFS: p.HandledFS, HandledAccessNet: p.HandledNet, Scoped: p.Scoped}
	fd, err := ll.LandlockCreateRuleset(&attr, 0)
	if err != nil {
		return nil, fmt.Errorf("fence: create rule set: %w", err)
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
			return nil, fmt.Errorf("fence: TCP port %d: %w", port, err)
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
		return fmt.Errorf("fence: %s: %w", r.Path, err)
	}
	defer unix.Close(fd)
	attr := ll.PathBeneathAttr{AllowedAccess: r.Access, ParentFd: fd}
	if err := ll.LandlockAddPathBeneathRule(ruleset, &attr, 0); err != nil {
		return fmt.Errorf("fence: rule for %s (%#x): %w", r.Path, r.Access, err)
	}
	return nil
}

// Stamp is what a walked folder looked like: a change to its entries
// changes its mtime and ctime.
type Stamp struct {
	Path  string
	Ino   uint64
	Mtime unix.Timespec
	Ctime unix.Timespec
}

// Stamps records the folders a rule set was built from.
func Stamps(dirs []string) []Stamp {
	out := make([]Stamp, 0, len(dirs))
	for _, d := range dirs {
		var st unix.Stat_t
		if unix.Stat(d, &st) == nil {
			out = append(out, Stamp{d, st.Ino, st.Mtim, st.Ctim})
		} else {
			out = append(out, Stamp{Path: d})
		}
	}
	return out
}

// Stale reports the first folder that changed since its stamp.
func Stale(stamps []Stamp) string {
	for _, s := range stamps {
		var st unix.Stat_t
		if unix.Stat(s.Path, &st) != nil || st.Ino != s.Ino || st.Mtim != s.Mtime || st.Ctim != s.Ctime {
			return s.Path
		}
	}
	return ""
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

// The rights of a role's full rule set: every filesystem right but
// executing and listing folders, which stay with the file modes.
const (
	readRights  = ll.AccessFSReadFile | ll.AccessFSIoctlDev
	writeRights = ll.AccessFSWriteFile | ll.AccessFSTruncate | ll.AccessFSMakeChar | ll.AccessFSMakeDir |
		ll.AccessFSMakeReg | ll.AccessFSMakeSock | ll.AccessFSMakeFifo | ll.AccessFSMakeBlock |
		ll.AccessFSMakeSym | ll.AccessFSRemoveDir | ll.AccessFSRemoveFile | ll.AccessFSRefer
	// RoleRights is what a role's rule set handles.
	RoleRights = readRights | writeRights
	// PolicyABI is the least ABI the full policy needs: scoping of abstract
	// sockets and signals came with 6 (TCP rules with 4, IOCTL_DEV with 5).
	PolicyABI = 6
)

// SafeDevices are the device files every command may write: what any
// program expects to open and nothing that reaches hardware.
var SafeDevices = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx", "/dev/pts"}

// RoleSpec is what one command's rule set is made from.
type RoleSpec struct {
	DenyGPU  []string // GPU device files it may not open
	GPU      []string // GPU device files it may open (its cards and the control nodes)
	Writable []string // its own places: HOME, TMPDIR, the folders handed to it
	DevRoot  string
	Network  string // none, api, egress or open
	APIPort  int    // a port "api" may connect to on any address: only a thermite_weaken build sets it
	// EgressPort is the one port "egress" may connect to: its proxy's, on
	// the loopback of the command's own network namespace.
	EgressPort int
	FenceOnly  bool // the GPU fence alone: READ_FILE, WRITE_FILE, IOCTL_DEV
}

// RolePolicy builds a command's rule set: everything readable but the GPU
// device files it may not open, writable only in its own places and on
// the safe devices, no TCP unless its network policy is open, abstract
// unix sockets and signals scoped to its own domain. It returns the folders it walked.
func RolePolicy(s RoleSpec) (*Policy, []string, error) {
	always := []string{s.DevRoot, "/dev"}
	if s.FenceOnly {
		rules, walked, err := GrantAllExcept(FenceRights, s.DenyGPU, always)
		return &Policy{HandledFS: FenceRights, Rules: rules}, walked, err
	}
	rules, walked, err := GrantAllExcept(readRights, s.DenyGPU, always)
	if err != nil {
		return nil, nil, err
	}
	p := &Policy{HandledFS: RoleRights, Rules: rules, Scoped: ll.ScopeAbstractUnixSocket | ll.ScopeSignal}
	for _, d := range SafeDevices {
		if _, err := os.Stat(d); err == nil {
			p.Rules = append(p.Rules, Rule{Path: d, Access: readRights | ll.AccessFSWriteFile | ll.AccessFSTruncate})
		}
	}
	for _, d := range s.GPU {
		p.Rules = append(p.Rules, Rule{Path: d, Access: readRights | ll.AccessFSWriteFile})
	}
	for _, w := range s.Writable {
		p.Rules = append(p.Rules, Rule{Path: w, Access: RoleRights})
	}
	switch s.Network {
	case "open":
	case "none", "api":
		// No TCP bind or connect at all: Landlock pins ports, not
		// addresses, so a port rule for the API would reach every address
		// on that port. Api roles use the API's unix socket.
		p.HandledNet = ll.AccessNetBindTCP | ll.AccessNetConnectTCP
		if s.Network == "api" && s.APIPort > 0 {
			p.TCPPorts = map[uint16]uint64{uint16(s.APIPort): ll.AccessNetConnectTCP}
		}
	case "egress":
		// TCP connect to the egress proxy's port alone, no bind: the port
		// rule reaches every address, but the command's network namespace
		// holds nothing else (only lo, whose one listener is the proxy).
		if s.EgressPort <= 0 || s.EgressPort > 65535 {
			return nil, nil, fmt.Errorf("fence: network policy egress needs its proxy's port, not %d", s.EgressPort)
		}
		p.HandledNet = ll.AccessNetBindTCP | ll.AccessNetConnectTCP
		p.TCPPorts = map[uint16]uint64{uint16(s.EgressPort): ll.AccessNetConnectTCP}
	default:
		return nil, nil, fmt.Errorf("fence: network policy %q is not one of none, api, egress, open", s.Network)
	}
	return p, walked, nil
}

// The rights of the controller daemon's rule set: a role's, and also
// listing folders and executing, which it is granted only where it needs
// them.
const (
	// ControllerRights is what the controller's rule set handles.
	ControllerRights = RoleRights | ll.AccessFSReadDir | ll.AccessFSExecute
	controllerRead   = ll.AccessFSReadFile | ll.AccessFSReadDir
)

// ControllerSpec is what the controller daemon's rule set is made from.
type ControllerSpec struct {
	Read []string // read and list only: the system's configuration, /proc, /sys
	Exec []string // read, list and execute: the system's programs, the kits
	// Binary is the thermite binary it runs as, named as the broker's
	// /proc/self/exe: the rule is made on the inode that link opens.
	Binary   string
	Writable []string // its own folders: every right beneath them
	Sockets  []string // folders where it makes (and removes) its sockets, and reads
	Files    []string // single files it reads and writes: its ledger
}

// ControllerPolicy builds the controller daemon's rule set: read and list
// only where it reads, execute only the system's programs, its own binary
// and the kits' checks, write only in its own folders, its own files and
// the safe devices, and abstract unix sockets and signals scoped to its
// own domain. Paths that do not exist are left out (a /lib32 this system
// lacks), and so are symlinks (/bin on a merged /usr): a rule follows a
// symlink, so one the controller's user placed would grant its target.
// TCP is its seccomp filter's business: fetch reaches any port.
func ControllerPolicy(s ControllerSpec) *Policy {
	p := &Policy{HandledFS: ControllerRights, Scoped: ll.ScopeAbstractUnixSocket | ll.ScopeSignal}
	add := func(paths []string, access uint64) {
		for _, path := range paths {
			st, err := os.Lstat(path)
			if err != nil || st.Mode()&os.ModeSymlink != 0 {
				continue
			}
			a := access
			if !st.IsDir() {
				a &= fileRights
			}
			p.Rules = append(p.Rules, Rule{Path: path, Access: a})
		}
	}
	add(s.Read, controllerRead)
	add(s.Exec, controllerRead|ll.AccessFSExecute)
	if s.Binary != "" {
		p.Rules = append(p.Rules, Rule{Path: s.Binary, Access: ll.AccessFSReadFile | ll.AccessFSExecute})
	}
	add(SafeDevices, readRights|ll.AccessFSWriteFile|ll.AccessFSTruncate)
	add(s.Writable, controllerRead|RoleRights)
	add(s.Sockets, controllerRead|ll.AccessFSMakeSock|ll.AccessFSRemoveFile)
	add(s.Files, controllerRead|ll.AccessFSWriteFile|ll.AccessFSTruncate)
	return p
}
