package selftest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"testing"
)

// TestEveryProbeOpHasAnAttempt: each operation constant the probe
// declares (Op*) has its function in the attempts table, so a row whose
// op was declared but never wired cannot answer "unknown op" and be read
// as a refusal.
func TestEveryProbeOpHasAnAttempt(t *testing.T) {
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	declared := 0
	for _, name := range names {
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if len(n.Name) < 3 || n.Name[:2] != "Op" || i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					op, _ := strconv.Unquote(lit.Value)
					declared++
					if attempts[op] == nil {
						t.Errorf("%s (%q) has no function in attempts", n.Name, op)
					}
				}
			}
		}
	}
	if declared != len(attempts) {
		t.Errorf("%d ops declared, %d in attempts", declared, len(attempts))
	}
	if o := runAttempt(Attempt{ID: "x", Op: "no-such-op"}); o.Got != "error: unknown op no-such-op" {
		t.Errorf("an unknown op: %+v", o)
	}
}
