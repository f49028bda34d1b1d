package lanefs

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
)

// ErrConnection marks a failure of the connection to the helper, not of a
// request: the helper is gone or broke the protocol, and every call on the
// Client from then on fails with it. The controller should start a new
// helper. Request failures are *Error.
var ErrConnection = errors.New("lanefs: helper connection")

// Client calls a helper over one connection. It is safe for concurrent
// use: each call gets an id, its request is written whole (calls take
// turns only for that write), and a reader goroutine hands each answer to
// the call with its id, so slow calls do not hold up quick ones.
type Client struct {
	conn io.ReadWriteCloser

	wmu sync.Mutex // one frame written at a time

	// changes counts the starts and ends of the calls that may change the
	// workspace.
	changes atomic.Uint64

	mu      sync.Mutex
	next    uint64
	pending map[uint64]chan []byte
	broken  error
}

// NewClient starts a client on conn (the controller's end of the helper's
// socketpair). Close it when done; it closes conn.
func NewClient(conn io.ReadWriteCloser) *Client {
	c := &Client{conn: conn, pending: make(map[uint64]chan []byte)}
	go c.readLoop()
	return c
}

// Changes counts the calls so far that may have changed the workspace.
func (c *Client) Changes() uint64 { return c.changes.Load() }

// Close closes the connection; calls in flight fail with ErrConnection.
func (c *Client) Close() error {
	c.fail(errors.New("closed"))
	return nil
}

func (c *Client) readLoop() {
	br := bufio.NewReaderSize(c.conn, 64<<10)
	for {
		body, err := readFrame(br)
		if err != nil {
			c.fail(err)
			return
		}
		id, _, ok := peekID(body)
		if !ok || id == 0 {
			var resp wireResponse
			if err := json.Unmarshal(body, &resp); err != nil {
				c.fail(fmt.Errorf("an answer that is not JSON: %v", err))
				return
			}
			if id = resp.ID; id == 0 {
				msg := "an answer without an id"
				if resp.Error != nil {
					msg = resp.Error.Msg
				}
				c.fail(fmt.Errorf("the helper refused the connection: %s", msg))
				return
			}
		}
		c.mu.Lock()
		ch := c.pending[id]
		delete(c.pending, id)
		c.mu.Unlock()
		if ch != nil {
			ch <- body // buffered: never blocks
		}
	}
}

// fail breaks the client once: every call waiting gets the error.
func (c *Client) fail(err error) {
	c.mu.Lock()
	if c.broken != nil {
		c.mu.Unlock()
		return
	}
	c.broken = fmt.Errorf("%w: %s", ErrConnection, strings.TrimPrefix(err.Error(), "lanefs: "))
	pending := c.pending
	c.pending = nil
	c.mu.Unlock()
	c.conn.Close()
	for _, ch := range pending {
		close(ch)
	}
}

// call sends one request and decodes its answer into out.
func (c *Client) call(ctx context.Context, op string, args, out any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	switch op {
	case opWrite, opEdit, opDelete, opMkdir:
		// Counted as it is sent and again as it ends: a measure that ran
		// while the change was under way always sees a newer count after.
		c.changes.Add(1)
		defer c.changes.Add(1)
	}
	c.mu.Lock()
	if c.broken != nil {
		err := c.broken
		c.mu.Unlock()
		return err
	}
	c.next++
	id := c.next
	c.mu.Unlock()

	buf, b, err := encodeFrame(outRequest{ID: id, Op: op, Args: args})
	if err != nil {
		var fe errFrameSize
		if errors.As(err, &fe) {
			return errorf(CodeTooLarge, "%s: the request of %d bytes is over the %d-byte frame limit", op, fe.n, MaxFrame)
		}
		return errorf(CodeBadRequest, "%s: encoding the request: %v", op, err)
	}
	ch := make(chan []byte, 1)
	c.mu.Lock()
	if c.broken != nil {
		err := c.broken
		c.mu.Unlock()
		putBuf(buf)
		return err
	}
	c.pending[id] = ch
	c.mu.Unlock()

	c.wmu.Lock()
	_, err = c.conn.Write(b)
	c.wmu.Unlock()
	putBuf(buf)
	if err != nil {
		c.fail(err)
	}

	select {
	case body, ok := <-ch:
		if !ok {
			c.mu.Lock()
			err := c.broken
			c.mu.Unlock()
			return err
		}
		// One pass decodes the answer straight into out.
		env := struct {
			ID     uint64 `json:"id"`
			Error  *Error `json:"error"`
			Result any    `json:"result"`
		}{Result: out}
		if err := json.Unmarshal(body, &env); err != nil {
			return fmt.Errorf("%w: %s: an answer that does not decode: %v", ErrConnection, op, err)
		}
		if env.Error != nil {
			return env.Error
		}
		return nil
	case <-ctx.Done():
		// The helper still finishes the request; its answer is dropped.
		c.mu.Lock()
		if c.pending != nil {
			delete(c.pending, id)
		}
		c.mu.Unlock()
		return ctx.Err()
	}
}

// Read reads part or all of a file.
func (c *Client) Read(ctx context.Context, req ReadRequest) (*ReadResponse, error) {
	var out ReadResponse
	if err := c.call(ctx, opRead, &req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Write replaces or creates a file.
func (c *Client) Write(ctx context.Context, req WriteRequest) (*WriteResponse, error) {
	var out WriteResponse
	if err := c.call(ctx, opWrite, &req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Edit replaces a string that occurs exactly once in a file.
func (c *Client) Edit(ctx context.Context, req EditRequest) (*EditResponse, error) {
	var out EditResponse
	if err := c.call(ctx, opEdit, &req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// List lists a folder.
func (c *Client) List(ctx context.Context, req ListRequest) (*ListResponse, error) {
	var out ListResponse
	if err := c.call(ctx, opList, &req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Stat describes one entry (lstat).
func (c *Client) Stat(ctx context.Context, req StatRequest) (*StatResponse, error) {
	var out StatResponse
	if err := c.call(ctx, opStat, &req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Delete removes a file, symlink or folder.
func (c *Client) Delete(ctx context.Context, req DeleteRequest) (*DeleteResponse, error) {
	var out DeleteResponse
	if err := c.call(ctx, opDelete, &req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Mkdir makes a folder.
func (c *Client) Mkdir(ctx context.Context, req MkdirRequest) (*MkdirResponse, error) {
	var out MkdirResponse
	if err := c.call(ctx, opMkdir, &req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Grep searches files for lines that match a regexp.
func (c *Client) Grep(ctx context.Context, req GrepRequest) (*GrepResponse, error) {
	var out GrepResponse
	if err := c.call(ctx, opGrep, &req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Find lists the paths below a folder whose names match a glob.
func (c *Client) Find(ctx context.Context, req FindRequest) (*FindResponse, error) {
	var out FindResponse
	if err := c.call(ctx, opFind, &req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
