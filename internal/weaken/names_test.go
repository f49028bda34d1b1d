package weaken

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestSwitchesByConstant: every switch a thermite_weaken build reads is
// declared in names.go and read by its constant, never by a literal that
// a typo would turn into a switch nothing sets; and every THERMITE_WEAKEN
// a test sets names switches declared there.
func TestSwitchesByConstant(t *testing.T) {
	declared := declaredSwitches(t)
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "testdata", "vendor":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		files++
		for _, p := range switchProblems(t, rel, src, declared) {
			t.Error(p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("walked %d Go files under %s: is this the module root?", files, root)
	}
}

// TestSwitchProblemsRefuses: the check above finds each kind of literal,
// so that TestSwitchesByConstant cannot pass by checking nothing.
func TestSwitchProblemsRefuses(t *testing.T) {
	declared := declaredSwitches(t)
	for _, tc := range []struct{ name, src string }{
		{"a literal read", `package p; func f() bool { return weaken.Has("leak-fd") }`},
		{"an undeclared literal read", `package p; func f() bool { return weaken.Has("no-such") }`},
		{"a literal in the filter's options", `package p; func (o Options) f() bool { return o.weakened("aio") }`},
		{"a literal key of the switches in force", `package p; func f(w map[string]bool) bool { return w["no-landlock"] }`},
		{"a switch declared outside names.go", `package p; const weakOwn = "own"`},
		{"a test setting an undeclared switch", `package p; var env = []string{"THERMITE_WEAKEN=no-such"}`},
		{"one undeclared among several", `package p; var env = []string{"THERMITE_WEAKEN=cap-amb,no-suc"}`},
	} {
		if len(switchProblems(t, "p.go", []byte(tc.src), declared)) == 0 {
			t.Errorf("%s: no problem found in %s", tc.name, tc.src)
		}
	}
	for _, src := range []string{
		`package p; func f() bool { return weaken.Has(weaken.LeakFD) }`,
		`package p; var env = []string{"THERMITE_WEAKEN=cap-amb,no-landlock", "THERMITE_WEAKEN=landlock-abi-" + n, "THERMITE_WEAKEN="}`,
		`package p; func f(w map[string]bool) bool { return w["lane-1"] }`,
	} {
		if ps := switchProblems(t, "p.go", []byte(src), declared); len(ps) > 0 {
			t.Errorf("%s: %v", src, ps)
		}
	}
}

// declaredSwitches are the values of names.go's constants.
func declaredSwitches(t *testing.T) map[string]bool {
	f, err := parser.ParseFile(token.NewFileSet(), "names.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
			v, _ := strconv.Unquote(lit.Value)
			out[v] = true
		}
		return true
	})
	if !out[LeakFD] || !out[SysVIPC] || !out[LandlockABIPrefix] {
		t.Fatalf("names.go declares %v: has its format changed?", out)
	}
	return out
}

// switchProblems lists what in one file names a switch other than by
// names.go's constants, or a switch names.go does not declare.
func switchProblems(t *testing.T, rel string, src []byte, declared map[string]bool) []string {
	if filepath.Dir(rel) == filepath.Join("internal", "weaken") {
		return nil
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, rel, src, 0)
	if err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	var out []string
	at := func(n ast.Node, format string, args ...any) {
		out = append(out, fset.Position(n.Pos()).String()+": "+fmt.Sprintf(format, args...))
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			// weaken.Has and seccomp's Options.weakened take a switch.
			name := ""
			switch fn := n.Fun.(type) {
			case *ast.SelectorExpr:
				name = fn.Sel.Name
				if x, ok := fn.X.(*ast.Ident); name == "Has" && (!ok || x.Name != "weaken") {
					name = ""
				}
			}
			if (name == "Has" || name == "weakened") && len(n.Args) == 1 {
				if lit, ok := n.Args[0].(*ast.BasicLit); ok {
					at(lit, "a switch read by the literal %s: declare it in internal/weaken/names.go and read it by its constant", lit.Value)
				}
			}
		case *ast.IndexExpr:
			if lit, ok := n.Index.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if v, _ := strconv.Unquote(lit.Value); declared[v] {
					at(lit, "the switch %s looked up by its literal: use its constant in internal/weaken/names.go", lit.Value)
				}
			}
		case *ast.ValueSpec:
			for i, id := range n.Names {
				low := strings.ToLower(id.Name)
				if !strings.HasPrefix(low, "weak") || i >= len(n.Values) {
					continue
				}
				if lit, ok := n.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					at(id, "the switch %s = %s is declared outside internal/weaken/names.go", id.Name, lit.Value)
				}
			}
		case *ast.BasicLit:
			if n.Kind != token.STRING {
				break
			}
			v, _ := strconv.Unquote(n.Value)
			list, ok := strings.CutPrefix(v, "THERMITE_WEAKEN=")
			if !ok {
				break
			}
			for _, w := range strings.Split(list, ",") {
				if w != "" && !declared[w] && w != LandlockABIPrefix && !abiSwitch(w) {
					at(n, "THERMITE_WEAKEN names %q, which internal/weaken/names.go does not declare", w)
				}
			}
		}
		return true
	})
	return out
}

// abiSwitch says whether w is LandlockABIPrefix and a number.
func abiSwitch(w string) bool {
	n, ok := strings.CutPrefix(w, LandlockABIPrefix)
	_, err := strconv.Atoi(n)
	return ok && err == nil
}
