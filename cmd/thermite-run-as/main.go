// The runtime's cgroup-aware GOMAXPROCS keeps two cgroup files open and
// reads them again while the process lives; a client that lives for one
// round trip has no use for it (as in cmd/thermite).
//
//go:debug containermaxprocs=0
//go:debug updatemaxprocs=0

// Command thermite-run-as is `thermite run-as` as a binary of its own: the
// same flags, stdio, exit status and refusals (both run runas.Main), linking
// only the broker's protocol and x/sys/unix, so an operator's command starts
// in a fraction of the whole binary's time (no HTTP, TLS, TOML, cobra or
// MCP package is initialized before main).
package main

import (
	"os"

	"thermite/internal/runas"
)

func main() {
	os.Exit(runas.Main(os.Args[1:], os.Stdout, os.Stderr))
}
