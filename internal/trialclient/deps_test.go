package trialclient

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"

	"thermite/internal/testrig"
)

// goPackage is what `go list -json` says of a package that these tests read.
type goPackage struct {
	ImportPath string
	Imports    []string
}

// listDeps is every package that pkg links, itself included, by import path.
func listDeps(t *testing.T, pkg string) map[string]goPackage {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-json", pkg)
	cmd.Dir = testrig.ModuleRoot()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps -json %s: %v", pkg, err)
	}
	deps := map[string]goPackage{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p goPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list -deps -json %s: %v", pkg, err)
		}
		deps[p.ImportPath] = p
	}
	if len(deps) == 0 {
		t.Fatalf("go list -deps -json %s listed nothing", pkg)
	}
	return deps
}

// TestClientLinksNoDaemon: the worker's client (thermite-trial) links
// none of the daemon: of thermite's own packages only those under
// internal/, the harness API's wire types among them. A new import that
// pulls in the controller, the broker or any other top-level package
// fails here, naming it and the package that imports it.
func TestClientLinksNoDaemon(t *testing.T) {
	deps := listDeps(t, "thermite/internal/trialclient")
	if _, ok := deps["thermite/internal/apiwire"]; !ok {
		t.Error("trialclient does not link internal/apiwire: where does it get the API's wire types?")
	}
	for path, p := range deps {
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, "thermite/") && !strings.HasPrefix(imp, "thermite/internal/") {
				t.Errorf("trialclient links %s (imported by %s); the worker's client must link none of the daemon", imp, path)
			}
		}
	}
	for _, daemon := range []string{"thermite/controller", "thermite/broker"} {
		for path := range deps {
			if path == daemon || strings.HasPrefix(path, daemon+"/") {
				t.Errorf("trialclient links %s", path)
			}
		}
	}
}
