package main

import (
	"os/exec"
	"strings"
	"testing"

	"thermite/internal/testrig"
)

// TestRunAsLightStaysLight: thermite-run-as links none of the packages
// whose start-up an operator's command must not pay for (HTTP, TLS, cobra,
// the MCP SDK, bbolt, the TOML decoder), and of thermite's own packages
// only the protocol and what it needs. A new import that pulls one in
// fails here, naming it.
func TestRunAsLightStaysLight(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "./cmd/thermite-run-as")
	cmd.Dir = testrig.ModuleRoot()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	forbidden := []string{
		"net/http", "crypto/tls", "crypto/x509", "os/user",
		"github.com/spf13/cobra", "github.com/spf13/pflag",
		"github.com/modelcontextprotocol/go-sdk", "go.etcd.io/bbolt",
		"github.com/BurntSushi/toml", "thermite/internal/config",
	}
	allowed := map[string]bool{
		"thermite/cmd/thermite-run-as": true,
		"thermite/internal/runas":      true,
		"thermite/internal/rpc":        true,
		"thermite/internal/peercred":   true,
		"thermite/internal/statedir":   true,
		"thermite/internal/termsafe":   true,
	}
	deps := strings.Fields(string(out))
	for _, d := range deps {
		for _, f := range forbidden {
			if d == f || strings.HasPrefix(d, f+"/") {
				t.Errorf("thermite-run-as links %s", d)
			}
		}
		if strings.HasPrefix(d, "thermite/") && !allowed[d] {
			t.Errorf("thermite-run-as links %s, which is not among the packages it needs", d)
		}
	}
	if len(deps) == 0 {
		t.Fatal("go list -deps listed nothing")
	}
}
