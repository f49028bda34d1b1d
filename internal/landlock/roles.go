package landlock

import (
	"fmt"
	"os"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"

	"thermite/internal/netpolicy"
)

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
	Network  netpolicy.Network
	APIPort  int // a port an api role may connect to on any address: only a thermite_weaken build sets it
	// EgressPort is the one port an egress command may connect to: its
	// proxy's, on the loopback of the command's own network namespace.
	EgressPort int
	FenceOnly  bool // the GPU fence alone: READ_FILE, WRITE_FILE, IOCTL_DEV
	// NoMeetingPoints refuses making a unix socket or a FIFO even in its
	// own places: the judge's users, which run a lane's code with the kit's
	// hidden inputs, leave nothing in a folder that another role could
	// connect to or open.
	NoMeetingPoints bool
}

// meetingPointRights make a file another process reaches by its name.
const meetingPointRights = ll.AccessFSMakeSock | ll.AccessFSMakeFifo

// RolePolicy builds a command's rule set: everything readable but the GPU
// device files it may not open, writable only in its own places and on
// the safe devices, no TCP unless its network policy is open, abstract
// unix sockets and signals scoped to its own domain, and with
// NoMeetingPoints no socket or FIFO made anywhere. It returns the
// folders it walked, whose changes make the rule set stale.
func RolePolicy(s RoleSpec) (*Policy, []string, error) {
	always := []string{s.DevRoot, "/dev"}
	if s.FenceOnly {
		rules, walked, err := GrantAllExcept(FenceRights, s.DenyGPU, always)
		return &Policy{HandledFS: FenceRights, Rules: rules}, walked, err
	}
	if err := s.Network.Check("landlock: network policy"); err != nil {
		return nil, nil, err
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
	own := uint64(RoleRights)
	if s.NoMeetingPoints {
		own &^= meetingPointRights
	}
	for _, w := range s.Writable {
		p.Rules = append(p.Rules, Rule{Path: w, Access: own})
	}
	if !s.Network.AllowsInet() {
		// No TCP bind or connect at all: Landlock pins ports, not
		// addresses, so a port rule for the API would reach every address
		// on that port. Api roles use the API's unix socket.
		p.HandledNet = ll.AccessNetBindTCP | ll.AccessNetConnectTCP
		if s.Network.ReachesAPI() && s.APIPort > 0 {
			p.TCPPorts = map[uint16]uint64{uint16(s.APIPort): ll.AccessNetConnectTCP}
		}
		if s.Network == netpolicy.Egress {
			// TCP connect to the egress proxy's port alone, no bind: the
			// port rule reaches every address, but the command's network
			// namespace holds nothing else (only lo, whose one listener is
			// the proxy).
			if s.EgressPort <= 0 || s.EgressPort > 65535 {
				return nil, nil, fmt.Errorf("landlock: network policy egress needs its proxy's port, not %d", s.EgressPort)
			}
			p.TCPPorts = map[uint16]uint64{uint16(s.EgressPort): ll.AccessNetConnectTCP}
		}
	}
	return p, walked, nil
}
