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

// Call sends one request of the operation op and decodes its answer into
// out (a pointer to the operation's answer type). A Go caller with the
// types at hand calls through Typed.Call instead.
func (c *Client) Call(ctx context.Context, op *Op, args, out any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if op.Changes {
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

	buf, b, err := encodeFrame(outRequest{ID: id, Op: op.Name, Args: args})
	if err != nil {
		var fe errFrameSize
		if errors.As(err, &fe) {
			return errorf(CodeTooLarge, "%s: the request of %d bytes is over the %d-byte frame limit", op.Name, fe.n, MaxFrame)
		}
		return errorf(CodeBadRequest, "%s: encoding the request: %v", op.Name, err)
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
			return fmt.Errorf("%w: %s: an answer that does not decode: %v", ErrConnection, op.Name, err)
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
