package selftest

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"thermite/internal/sysvipc"
	"thermite/roles"
)

// placeLeftovers leaves, for issue 12's rows, what a role could have left
// behind, made by root as the role would have: a private SysV object of
// each kind owned by every role's user, then stopped, as after a command,
// a repeat or a trial; and a set-id file of each lane's own in its
// workspace, for its probe to hard-link. undo removes what is left of them.
func placeLeftovers(h Host, c *Context, undo *[]func()) error {
	var errs []error
	c.IPCLeft = map[string]map[string]int32{}
	var stopped []roles.Role
	for _, r := range c.Table.Roles {
		if r.Kind == roles.Controller {
			continue // the controller's user is never stopped while it runs
		}
		left := map[string]int32{}
		for _, kind := range sysvipc.Kinds {
			key, id, err := leaveIPC(kind, r)
			if err != nil {
				errs = append(errs, fmt.Errorf("a %s object for %s: %w", kind, r.Name, err))
				continue
			}
			left[kind] = key
			*undo = append(*undo, func() { removeIPCCanary(kind, key, id) })
		}
		c.IPCLeft[r.Name] = left
		stopped = append(stopped, r)
	}
	// Each role's user is stopped with its objects in place, side by side.
	var mu sync.Mutex
	sideBySide(stopped, func(r roles.Role) {
		if _, err := h.StopUser(r); err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	})
	c.LinkedSetID = map[int]string{}
	for n, ws := range c.Workspace {
		r, ok := c.Table.Lane(n)
		if !ok {
			continue
		}
		p := filepath.Join(ws, ".selftest-linked-setid")
		if err := placeSetIDFile(c.Cfg.StateDir, p, r.UID, r.GID); err != nil {
			errs = append(errs, err)
			continue
		}
		c.LinkedSetID[n] = p
		*undo = append(*undo, func() {
			removePlaced(c.Cfg.StateDir, p+".link")
			removePlaced(c.Cfg.StateDir, p)
		})
	}
	return errors.Join(errs...)
}

// leaveIPC makes a private (0600) object with a fresh random key and gives
// it to r's user with IPC_SET, as if r had made it.
func leaveIPC(kind string, r roles.Role) (key int32, id int, err error) {
	for range 16 {
		var b [4]byte
		rand.Read(b[:])
		key = int32(binary.NativeEndian.Uint32(b[:]) &^ (1 << 31))
		if key == unix.IPC_PRIVATE {
			continue
		}
		id, err = sysvipc.Get(kind, key, unix.IPC_CREAT|unix.IPC_EXCL|0o600)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if err != nil {
			return 0, 0, err
		}
		// struct ipc64_perm: key, uid, gid, cuid, cgid, mode (4 bytes each).
		buf := make([]byte, 512)
		if err := sysvipc.Control(kind, id, unix.IPC_STAT, buf); err != nil {
			sysvipc.Remove(sysvipc.Object{Kind: kind, ID: id})
			return 0, 0, fmt.Errorf("IPC_STAT: %w", err)
		}
		binary.NativeEndian.PutUint32(buf[4:8], uint32(r.UID))
		binary.NativeEndian.PutUint32(buf[8:12], uint32(r.GID))
		if err := sysvipc.Control(kind, id, unix.IPC_SET, buf); err != nil {
			sysvipc.Remove(sysvipc.Object{Kind: kind, ID: id})
			return 0, 0, fmt.Errorf("IPC_SET: %w", err)
		}
		return key, id, nil
	}
	return 0, 0, errors.New("no free key")
}

// removeIPCCanary removes a canary object that the stop left, only while
// its key still names the very object made.
func removeIPCCanary(kind string, key int32, id int) {
	if got, err := sysvipc.Get(kind, key, 0); err == nil && got == id {
		sysvipc.Remove(sysvipc.Object{Kind: kind, ID: id})
	}
}

// placeSetIDFile makes a new file at path, owned by uid:gid, mode 06755,
// through descriptors as placeFile does.
func placeSetIDFile(stateDir, path string, uid, gid int) error {
	return placeContent(stateDir, path, "#!/bin/sh\n", uid, gid, 0o6755)
}

// linkedSetIDGone looks, after the run, at the set-id file the lane's probe
// hard-linked, and removes both its names.
func linkedSetIDGone(c *Context, r roles.Role, o Outcome) string {
	p := c.LinkedSetID[r.Index]
	defer func() {
		removePlaced(c.Cfg.StateDir, p+".link")
		removePlaced(c.Cfg.StateDir, p)
	}()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return "" // gone with its bits
	}
	if st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
		return fmt.Sprintf("%s (%d links) kept mode %04o after the run", p, st.Nlink, st.Mode&0o7777)
	}
	return ""
}
