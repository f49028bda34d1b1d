package broker

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"thermite/internal/rpc"
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

// serve accepts one connection and serves it on this goroutine, having
// started another to accept the next: the request is read where the
// accept woke up, without waiting for a new goroutine to be scheduled
// (on a shared machine, often after a wake-up of another CPU).
func (b *Broker) serve(l *net.UnixListener) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			if b.life.stopping.Load() {
				return
			}
			b.log.Error("accept", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		go b.serve(l)
		b.handle(rpc.NewConn(c))
		return
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

// rpcOp is one operation of the broker's closed RPC: whether it is
// answered while the start-up self-test runs, whether it takes descriptors
// and whether only root may ask, whether its connection may carry another
// request, and how it is served.
type rpcOp struct {
	beforeReady bool
	takesFiles  bool
	rootOnly    bool
	keep        bool
	serve       func(b *Broker, c *rpc.Conn, req *rpc.Request, files []*os.File) (*rpc.Response, error)
}

// rpcOps is the broker's whole RPC, one row per operation: anything else
// is refused.
var rpcOps = map[string]rpcOp{
	rpc.OpPing: {beforeReady: true, keep: true, serve: func(*Broker, *rpc.Conn, *rpc.Request, []*os.File) (*rpc.Response, error) {
		return &rpc.Response{}, nil
	}},
	rpc.OpStatus: {beforeReady: true, keep: true, serve: func(b *Broker, _ *rpc.Conn, _ *rpc.Request, _ []*os.File) (*rpc.Response, error) {
		return &rpc.Response{Status: b.status()}, nil
	}},
	// A Run watches its connection, whose closing cancels the command;
	// after the answer it carries the caller's next request.
	rpc.OpRun: {takesFiles: true, keep: true, serve: func(b *Broker, c *rpc.Conn, req *rpc.Request, files []*os.File) (*rpc.Response, error) {
		if req.Run == nil {
			return nil, fmt.Errorf("run: missing run field")
		}
		res, err := b.Run(c, req.Run, files)
		return &rpc.Response{Run: res}, err
	}},
	rpc.OpStopUser: {keep: true, serve: func(b *Broker, _ *rpc.Conn, req *rpc.Request, _ []*os.File) (*rpc.Response, error) {
		if req.StopUser == nil {
			return nil, fmt.Errorf("stop_user: missing stop_user field")
		}
		r, err := b.role(req.StopUser.Role)
		if err != nil {
			return nil, err
		}
		n, err := b.StopUser(r)
		if err != nil {
			return nil, err
		}
		return &rpc.Response{StopUser: &rpc.StopUserResult{Stopped: n}}, nil
	}},
	rpc.OpHandFolder: {keep: true, serve: func(b *Broker, _ *rpc.Conn, req *rpc.Request, _ []*os.File) (*rpc.Response, error) {
		if req.HandFolder == nil {
			return nil, fmt.Errorf("hand_folder: missing hand_folder field")
		}
		res, err := b.HandFolder(req.HandFolder)
		return &rpc.Response{HandFolder: res}, err
	}},
	rpc.OpRunFolder: {keep: true, serve: func(b *Broker, _ *rpc.Conn, req *rpc.Request, _ []*os.File) (*rpc.Response, error) {
		if req.RunFolder == nil {
			return nil, fmt.Errorf("run_folder: missing run_folder field")
		}
		return &rpc.Response{}, b.RunFolder(req.RunFolder)
	}},
	rpc.OpTrialFolder: {keep: true, serve: func(b *Broker, _ *rpc.Conn, req *rpc.Request, _ []*os.File) (*rpc.Response, error) {
		if req.TrialFolder == nil {
			return nil, fmt.Errorf("trial_folder: missing trial_folder field")
		}
		return &rpc.Response{}, b.TrialFolder(req.TrialFolder)
	}},
	rpc.OpRetire: {keep: true, serve: func(b *Broker, _ *rpc.Conn, req *rpc.Request, _ []*os.File) (*rpc.Response, error) {
		if req.Retire == nil {
			return nil, fmt.Errorf("retire_folder: missing retire_folder field")
		}
		res, err := b.RetireFolder(req.Retire)
		return &rpc.Response{Retire: res}, err
	}},
	rpc.OpClearSetID: {keep: true, serve: func(b *Broker, _ *rpc.Conn, req *rpc.Request, _ []*os.File) (*rpc.Response, error) {
		if req.ClearSetID == nil {
			return nil, fmt.Errorf("clear_setid: missing clear_setid field")
		}
		r, err := b.role(req.ClearSetID.Role)
		if err != nil {
			return nil, err
		}
		return &rpc.Response{ClearSetID: b.ClearSetID(r)}, nil
	}},
	rpc.OpDiskUsage: {keep: true, serve: func(b *Broker, _ *rpc.Conn, req *rpc.Request, _ []*os.File) (*rpc.Response, error) {
		if req.DiskUsage == nil {
			return nil, fmt.Errorf("disk_usage: missing disk_usage field")
		}
		r, err := b.role(req.DiskUsage.Role)
		if err != nil {
			return nil, err
		}
		u, err := b.DiskUsage(r, req.DiskUsage.HelperIdle)
		return &rpc.Response{DiskUsage: u}, err
	}},
	// The self-test places canaries as root; only the operator starts it.
	rpc.OpSelftest: {keep: true, rootOnly: true, serve: func(b *Broker, _ *rpc.Conn, req *rpc.Request, _ []*os.File) (*rpc.Response, error) {
		if req.Selftest == nil {
			return nil, fmt.Errorf("selftest: missing selftest field")
		}
		res, err := b.Selftest(req.Selftest.Force, false)
		return &rpc.Response{Selftest: res}, err
	}},
}

// dispatch answers one request from its row in rpcOps. keep says whether
// the connection may carry another.
func (b *Broker) dispatch(c *rpc.Conn, req *rpc.Request, files []*os.File, cred *unix.Ucred) (resp *rpc.Response, keep bool) {
	fail := func(err error) (*rpc.Response, bool) {
		b.log.Info("request refused", "op", req.Op, "uid", cred.Uid, "err", err)
		return &rpc.Response{Error: err.Error()}, false
	}
	if req.V != rpc.Version {
		return fail(fmt.Errorf("broker: protocol version %d, this broker speaks %d", req.V, rpc.Version))
	}
	op, ok := rpcOps[req.Op]
	if !ok {
		return fail(fmt.Errorf("broker: unknown request %q", req.Op))
	}
	if !op.takesFiles && len(files) > 0 {
		return fail(fmt.Errorf("broker: %s takes no descriptors", req.Op))
	}
	if !op.beforeReady {
		if err := b.servingRoles(); err != nil {
			return fail(err)
		}
	}
	if op.rootOnly && cred.Uid != 0 {
		return fail(fmt.Errorf("%s: only root may run the self-test", req.Op))
	}
	resp, err := op.serve(b, c, req, files)
	if err != nil {
		// A command that ran and failed to exec answers with its result.
		var ee *execError
		if errors.As(err, &ee) && resp != nil && resp.Run != nil {
			resp.Error = ee.msg
			return resp, false
		}
		return fail(err)
	}
	return resp, op.keep
}

func (b *Broker) role(name string) (roles.Role, error) {
	r, ok := b.table.Role(name)
	if !ok {
		return roles.Role{}, fmt.Errorf("role %q is not in the role table", name)
	}
	return r, nil
}
