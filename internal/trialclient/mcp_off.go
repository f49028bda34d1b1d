//go:build thermite_nomcp

package trialclient

import (
	"context"
	"errors"
)

// ServeMCP is absent from a build with the tag thermite_nomcp: such a
// binary links no MCP SDK, whose package inits would otherwise run in
// every process of it, the spawn shim's included.
func ServeMCP(ctx context.Context, c *Client) error {
	return errors.New("mcp: this thermite was built with the tag thermite_nomcp, without an MCP server; build it without that tag")
}
