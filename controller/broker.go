package controller

import (
	"context"
	"os"
	"sync"

	"thermite/internal/rpc"
)

// brokerClient is the controller's side of the broker's RPC: everything
// the controller does as another user, it asks the broker for.
type brokerClient struct {
	socket string

	mu sync.Mutex
	// idle are connections whose last Run was answered, kept for the
	// next, by class: the judge's apart from everyone else's, so that a
	// burst of lanes' Runs never takes the judge's and the judge's Runs
	// never wait on a new connection's accept behind the burst.
	idle [runClasses][]*rpc.Conn
}

// runClass is whose Runs share kept connections.
type runClass int

const (
	runShared runClass = iota // lanes', agents' and the rig's own
	runJudge                  // the judge's builds and timed runs
	runClasses
)

// maxIdleRunConns bounds the connections kept between Runs, by class; a
// burst of parallel Runs above it dials and closes the rest.
var maxIdleRunConns = [runClasses]int{runShared: 16, runJudge: 4}

func (b *brokerClient) call(req *rpc.Request, fds ...int) (*rpc.Response, error) {
	return rpc.Call(b.socket, req, fds...)
}

// runConn is a connection for a Run of class: one kept from an answered
// Run of that class that the broker still holds open, or a new one.
func (b *brokerClient) runConn(class runClass) (*rpc.Conn, error) {
	for {
		b.mu.Lock()
		n := len(b.idle[class])
		if n == 0 {
			b.mu.Unlock()
			return rpc.Dial(b.socket)
		}
		c := b.idle[class][n-1]
		b.idle[class] = b.idle[class][:n-1]
		b.mu.Unlock()
		if c.Idle() {
			return c, nil
		}
		c.Close() // the broker went away (a restart): try the next
	}
}

// keepRunConn keeps c for the next Run of class, or closes it when enough
// are kept.
func (b *brokerClient) keepRunConn(class runClass, c *rpc.Conn) {
	b.mu.Lock()
	if len(b.idle[class]) < maxIdleRunConns[class] {
		b.idle[class] = append(b.idle[class], c)
		c = nil
	}
	b.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// run runs a command as a role with the given stdio (or none) and waits.
// Cancelling ctx closes the connection, which makes the broker kill it.
// sent, when set, is called once the broker holds its own copies of stdio.
// A connection whose Run was answered without error is kept for the next.
func (b *brokerClient) run(ctx context.Context, req *rpc.RunRequest, stdio []*os.File, sent ...func()) (*rpc.RunResult, error) {
	return b.runAs(ctx, runShared, req, stdio, sent...)
}

// runAs is run on the kept connections of class.
func (b *brokerClient) runAs(ctx context.Context, class runClass, req *rpc.RunRequest, stdio []*os.File, sent ...func()) (*rpc.RunResult, error) {
	c, err := b.runConn(class)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	keep := false
	defer func() {
		// stop says the close above never ran (and now never will).
		if stop() && keep {
			b.keepRunConn(class, c)
		} else {
			c.Close()
		}
	}()
	var fds []int
	for _, f := range stdio {
		fds = append(fds, int(f.Fd()))
	}
	if err := c.Send(&rpc.Request{V: rpc.Version, Op: rpc.OpRun, Run: req}, fds...); err != nil {
		return nil, err
	}
	for _, f := range sent {
		f()
	}
	resp, err := c.Answer()
	keep = err == nil
	if resp != nil && resp.Run != nil {
		return resp.Run, err
	}
	return nil, err
}

func (b *brokerClient) handFolder(path, role string, mode uint32, readOnly bool) error {
	_, err := b.call(&rpc.Request{Op: rpc.OpHandFolder, HandFolder: &rpc.HandFolderRequest{Path: path, Role: role, Mode: mode, ReadOnly: readOnly}})
	return err
}

// publish gives a folder back to the controller, readable by every role
// and writable by none; it returns what the broker removed from it
// (FIFOs, sockets and device nodes), by path.
func (b *brokerClient) publish(path string) ([]string, error) {
	resp, err := b.call(&rpc.Request{Op: rpc.OpHandFolder, HandFolder: &rpc.HandFolderRequest{Path: path, Role: "thermite", Publish: true}})
	if err != nil || resp.HandFolder == nil {
		return nil, err
	}
	return resp.HandFolder.Removed, nil
}

// handArea gives a lane its research area: what it holds, and the right
// to write in it through the lane's group, but not its top, so that the
// lane cannot open it to other roles.
func (b *brokerClient) handArea(path, lane string) error {
	_, err := b.call(&rpc.Request{Op: rpc.OpHandFolder, HandFolder: &rpc.HandFolderRequest{Path: path, Role: lane, GroupTop: true}})
	return err
}

func (b *brokerClient) stopUser(role string) (int, error) {
	resp, err := b.call(&rpc.Request{Op: rpc.OpStopUser, StopUser: &rpc.StopUserRequest{Role: role}})
	if err != nil {
		return 0, err
	}
	return resp.StopUser.Stopped, nil
}

func (b *brokerClient) status() (*rpc.Status, error) {
	resp, err := b.call(&rpc.Request{Op: rpc.OpStatus})
	if err != nil {
		return nil, err
	}
	return resp.Status, nil
}

// diskUsage is what a role holds: its folders, and the unlinked files its
// processes keep open. The broker answers what it measured with its error.
func (b *brokerClient) diskUsage(role string, helperIdle bool) (rpc.DiskUsage, error) {
	resp, err := b.call(&rpc.Request{Op: rpc.OpDiskUsage, DiskUsage: &rpc.DiskUsageRequest{Role: role, HelperIdle: helperIdle}})
	if err != nil {
		if resp != nil && resp.DiskUsage != nil {
			return *resp.DiskUsage, err
		}
		return rpc.DiskUsage{}, err
	}
	return *resp.DiskUsage, nil
}

// runFolder opens a timed run's folder to its timing user alone.
func (b *brokerClient) runFolder(path, role string) error {
	_, err := b.call(&rpc.Request{Op: rpc.OpRunFolder, RunFolder: &rpc.RunFolderRequest{Path: path, Role: role}})
	return err
}

// trialFolder closes a trial's folder to every role but its lane and the
// lane's agent.
func (b *brokerClient) trialFolder(path, lane string) error {
	_, err := b.call(&rpc.Request{Op: rpc.OpTrialFolder, TrialFolder: &rpc.TrialFolderRequest{Path: path, Lane: lane}})
	return err
}

// handTop gives a workspace whose tree is already the lane's: only its top
// folder changes hands.
func (b *brokerClient) handTop(path, role string) error {
	_, err := b.call(&rpc.Request{Op: rpc.OpHandFolder, HandFolder: &rpc.HandFolderRequest{Path: path, Role: role, Mode: 0o700, TopOnly: true}})
	return err
}

// retire asks the broker to take a trial's folder from every role, and
// with remove to remove it.
func (b *brokerClient) retire(path string, remove bool) (int64, error) {
	resp, err := b.call(&rpc.Request{Op: rpc.OpRetire, Retire: &rpc.RetireRequest{Path: path, Remove: remove}})
	if err != nil {
		return 0, err
	}
	if resp.Retire == nil {
		return 0, nil
	}
	return resp.Retire.Removed, nil
}
