package landlock

import (
	"os"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
)

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
