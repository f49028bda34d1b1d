//go:build thermite_nomcp

package trialclient

import (
	"context"
	"errors"

	"thermite/internal/lanefs"
)

// ServeMCP is absent from a build with the tag thermite_nomcp: such a
// binary links no MCP SDK, whose package inits would otherwise run in
// every process of it, the stop helper's and the probe's included.
func ServeMCP(ctx context.Context, c *Client) error {
	return errors.New("mcp: this thermite was built with the tag thermite_nomcp, without an MCP server; build it without that tag")
}

// fileTool is nothing in this build, which has no MCP server.
type fileTool struct{}

// fileToolOf makes no tool in this build; its arguments are a file
// operation's tool in a build with the MCP server.
func fileToolOf[In, Req, Resp any](op lanefs.Typed[Req, Resp], desc func(where string) string, req func(In) Req, show func(In, *Resp) string) fileTool {
	return fileTool{}
}
