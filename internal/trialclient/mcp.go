package trialclient

import (
	"context"
	"errors"
)

// ServeMCP serves the trial's tools over stdio.
func ServeMCP(ctx context.Context, c *Client) error { return errors.New("mcp: not yet") }
