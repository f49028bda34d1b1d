package controller

import (
	"context"
	"os"

	"thermite/internal/rpc"
)

// brokerClient is the controller's side of the broker's RPC: everything
// the controller does as another user, it asks the broker for.
type brokerClient struct{ socket string }

func (b *brokerClient) call(req *rpc.Request, fds ...int) (*rpc.Response, error) {
	return rpc.Call(b.socket, req, fds...)
}

// run runs a command as a role with the given stdio (or none) and waits.
// Cancelling ctx closes the connection, which makes the broker kill it.
// sent, when set, is called once the broker holds its own copies of stdio.
func (b *brokerClient) run(ctx context.Context, req *rpc.RunRequest, stdio []*os.File, sent ...func()) (*rpc.RunResult, error) {
	c, err := rpc.Dial(b.socket)
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			c.Close()
		case <-done:
		}
	}()
	defer c.Close()
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
// and writable by none.
func (b *brokerClient) publish(path string) error {
	_, err := b.call(&rpc.Request{Op: rpc.OpHandFolder, HandFolder: &rpc.HandFolderRequest{Path: path, Role: "thermite", Publish: true}})
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
