package broker

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/procs"
	"thermite/internal/rpc"
	"thermite/internal/sysvipc"
	"thermite/roles"
)

// listen serves the RPC socket: root:thermite 0660 in a root:thermite 0710
// folder, so only root and the controller's group can reach it at all.
func (b *Broker) listen() (*net.UnixListener, error) {
	path := b.cfg.BrokerSocket()
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	l.SetUnlinkOnClose(false)
	if err := os.Chown(path, 0, b.table.Controller().GID); err != nil {
		l.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		l.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	return l, nil
}

// PeerAllowed decides who may talk to the broker: the controller's user,
// and root for the operator's commands. Nobody else, whatever the socket's
// mode says.
func (b *Broker) PeerAllowed(cred *unix.Ucred) bool {
	return cred.Uid == 0 || int(cred.Uid) == b.table.Controller().UID
}

func (b *Broker) serve(l *net.UnixListener) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			if b.stopping.Load() {
				return
			}
			b.log.Error("accept", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		go b.handle(rpc.NewConn(c))
	}
}

// handle serves one connection until the peer closes it or a request is
// refused: any error answers one line and closes the connection.
func (b *Broker) handle(c *rpc.Conn) {
	defer c.Close()
	cred, err := c.PeerCred()
	if err != nil {
		return
	}
	if !b.PeerAllowed(cred) {
		b.log.Warn("refused a peer", "uid", cred.Uid, "pid", cred.Pid)
		c.Send(&rpc.Response{V: rpc.Version, Error: fmt.Sprintf("uid %d may not use the broker", cred.Uid)})
		return
	}
	for {
		var req rpc.Request
		files, err := c.Recv(&req)
		if err != nil {
			if !rpc.IsClosed(err) && !errors.Is(err, net.ErrClosed) {
				b.log.Warn("bad request", "uid", cred.Uid, "err", err)
				c.Send(&rpc.Response{V: rpc.Version, Error: "broker: " + err.Error()})
			}
			return
		}
		resp, keep := b.dispatch(c, &req, files, cred)
		for _, f := range files {
			f.Close()
		}
		if err := c.SendResponse(resp); err != nil || !keep || resp.Error != "" {
			return
		}
	}
}

// dispatch answers one request. keep says whether the connection may carry
// another: a Run takes its connection, whose closing cancels the command.
func (b *Broker) dispatch(c *rpc.Conn, req *rpc.Request, files []*os.File, cred *unix.Ucred) (resp *rpc.Response, keep bool) {
	fail := func(err error) (*rpc.Response, bool) {
		b.log.Info("request refused", "op", req.Op, "uid", cred.Uid, "err", err)
		return &rpc.Response{Error: err.Error()}, false
	}
	if req.V != rpc.Version {
		return fail(fmt.Errorf("broker: protocol version %d, this broker speaks %d", req.V, rpc.Version))
	}
	if req.Op != rpc.OpRun && len(files) > 0 {
		return fail(fmt.Errorf("broker: %s takes no descriptors", req.Op))
	}
	if req.Op != rpc.OpPing && req.Op != rpc.OpStatus {
		if err := b.servingRoles(); err != nil {
			return fail(err)
		}
	}
	switch req.Op {
	case rpc.OpPing:
		return &rpc.Response{}, true
	case rpc.OpStatus:
		return &rpc.Response{Status: b.status()}, true
	case rpc.OpRun:
		if req.Run == nil {
			return fail(fmt.Errorf("run: missing run field"))
		}
		res, err := b.Run(c, req.Run, files)
		if err != nil {
			var ee *execError
			if errors.As(err, &ee) && res != nil {
				return &rpc.Response{Run: res, Error: ee.msg}, false
			}
			return fail(err)
		}
		return &rpc.Response{Run: res}, false
	case rpc.OpStopUser:
		if req.StopUser == nil {
			return fail(fmt.Errorf("stop_user: missing stop_user field"))
		}
		r, err := b.role(req.StopUser.Role)
		if err != nil {
			return fail(err)
		}
		n, err := b.StopUser(r)
		if err != nil {
			return fail(err)
		}
		return &rpc.Response{StopUser: &rpc.StopUserResult{Stopped: n}}, true
	case rpc.OpHandFolder:
		if req.HandFolder == nil {
			return fail(fmt.Errorf("hand_folder: missing hand_folder field"))
		}
		res, err := b.HandFolder(req.HandFolder)
		if err != nil {
			return fail(err)
		}
		return &rpc.Response{HandFolder: res}, true
	case rpc.OpRunFolder:
		if req.RunFolder == nil {
			return fail(fmt.Errorf("run_folder: missing run_folder field"))
		}
		if err := b.RunFolder(req.RunFolder); err != nil {
			return fail(err)
		}
		return &rpc.Response{}, true
	case rpc.OpRetire:
		if req.Retire == nil {
			return fail(fmt.Errorf("retire_folder: missing retire_folder field"))
		}
		res, err := b.RetireFolder(req.Retire)
		if err != nil {
			return fail(err)
		}
		return &rpc.Response{Retire: res}, true
	case rpc.OpClearSetID:
		if req.ClearSetID == nil {
			return fail(fmt.Errorf("clear_setid: missing clear_setid field"))
		}
		r, err := b.role(req.ClearSetID.Role)
		if err != nil {
			return fail(err)
		}
		return &rpc.Response{ClearSetID: b.ClearSetID(r)}, true
	case rpc.OpDiskUsage:
		if req.DiskUsage == nil {
			return fail(fmt.Errorf("disk_usage: missing disk_usage field"))
		}
		r, err := b.role(req.DiskUsage.Role)
		if err != nil {
			return fail(err)
		}
		u, err := b.DiskUsage(r, req.DiskUsage.HelperIdle)
		if err != nil {
			return fail(err)
		}
		return &rpc.Response{DiskUsage: u}, true
	case rpc.OpSelftest:
		// The self-test places canaries as root; only the operator starts it.
		if cred.Uid != 0 {
			return fail(fmt.Errorf("selftest: only root may run the self-test"))
		}
		if req.Selftest == nil {
			return fail(fmt.Errorf("selftest: missing selftest field"))
		}
		res, err := b.Selftest(req.Selftest.Force, false)
		if err != nil {
			return fail(err)
		}
		return &rpc.Response{Selftest: res}, true
	}
	return fail(fmt.Errorf("broker: unknown request %q", req.Op))
}

func (b *Broker) role(name string) (roles.Role, error) {
	r, ok := b.table.Role(name)
	if !ok {
		return roles.Role{}, fmt.Errorf("role %q is not in the role table", name)
	}
	return r, nil
}

// cancelOr closes when c closes or the broker begins to stop.
func (b *Broker) cancelOr(c <-chan struct{}) <-chan struct{} {
	out := make(chan struct{})
	go func() {
		select {
		case <-c:
		case <-b.stopCh:
		}
		close(out)
	}()
	return out
}

// StopUser ends every process of the role's user and says how many there
// were when it began: first its cgroup at once (cgroup.kill on v2, which
// takes forks in flight too), then the helper's kill(-1) loop, which
// nothing of the user escapes and which removes its SysV IPC objects.
func (b *Broker) StopUser(r roles.Role) (int, error) {
	// Stopping empties its HOME and TMPDIR: its last disk measure is old.
	defer b.bumpRole(r.UID)
	// The controller's user is the running controller: stopping it would
	// end the controller (its supervisor would start another after
	// stopping every role). Only the broker's own stop of the rig does that.
	if r.Kind == roles.Controller && b.ControllerPID() != 0 {
		return 0, fmt.Errorf("stop: %s is the controller's user and the controller runs: stop the rig instead", r.Name)
	}
	k := b.stopGroup(r)
	n, err := b.stopHelper(r)
	if err != nil {
		return max(n, k), err
	}
	b.resetOwnFolders(r)
	return max(n, k), nil
}

// resetOwnFolders empties a role's HOME and TMPDIR once nothing of its user
// runs: no build, timed run or trial finds what an earlier one left there
// (a poisoned build tool's configuration, a cached answer). The controller's
// own are left alone.
func (b *Broker) resetOwnFolders(r roles.Role) {
	if r.Kind == roles.Controller {
		return
	}
	for _, d := range []string{b.homeOf(r), b.tmpOf(r)} {
		if err := clearFolder(d); err != nil {
			b.log.Warn("reset a role's folder", "role", r.Name, "path", d, "err", err)
		}
	}
}

// stopAllRoles stops every role's user, the controller's included. It is
// used only when no controller runs, so a user with no process now cannot
// get one (only the broker starts them) and may be skipped, unless it still
// owns SysV IPC objects, which only its stop removes.
func (b *Broker) stopAllRoles() error {
	var errs []error
	counts, _ := procs.CountByUID("/proc", b.uidSet())
	ipcOwners := map[int]bool{}
	objs, err := sysvipc.List("/proc")
	if err != nil {
		errs = append(errs, err)
	}
	for _, o := range objs {
		ipcOwners[o.UID], ipcOwners[o.CUID] = true, true
	}
	for _, r := range b.table.Roles {
		if len(counts[r.UID]) == 0 && !ipcOwners[r.UID] {
			continue
		}
		b.stopGroup(r)
		if _, err := b.stopHelper(r); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (b *Broker) uidSet() map[int]bool {
	m := map[int]bool{}
	for _, u := range b.table.UIDs() {
		m[u] = true
	}
	return m
}
