package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// maxFuncLines is the longest a function of the product may be, from its
// `func` line to its closing brace. A longer one is a list of steps or
// cases that reads better as a table of short functions (issue 28).
const maxFuncLines = 120

// longFuncAllowed are the functions that may be longer, by folder and
// name (methods as Type.Name), each with its reason. An entry whose
// function is no longer over the limit fails the test, so the list only
// shrinks.
var longFuncAllowed = map[string]string{
	// The vfork child shares the parent's stack and memory until execve:
	// after the clone it may not grow the stack or return from the frame,
	// so every step from clone to execve is written inline, as the comment
	// above it says.
	"internal/spawn forkExec": "the vfork child may only make raw system calls in one frame",
}

// TestNoLongFunctions fails when a function that is not a test's is over
// maxFuncLines lines and not in longFuncAllowed.
func TestNoLongFunctions(t *testing.T) {
	long := longFunctions(t)
	var over []string
	for name, lines := range long {
		if _, ok := longFuncAllowed[name]; !ok {
			over = append(over, name+" ("+strconv.Itoa(lines)+" lines)")
		}
	}
	slices.Sort(over)
	for _, f := range over {
		t.Errorf("%s is over %d lines: cut it into a table of short functions, as runAttempt's operations table did", f, maxFuncLines)
	}
	var stale []string
	for name := range longFuncAllowed {
		if _, ok := long[name]; !ok {
			stale = append(stale, name)
		}
	}
	slices.Sort(stale)
	for _, name := range stale {
		t.Errorf("%s is in longFuncAllowed but is not over %d lines (or is gone): remove its entry", name, maxFuncLines)
	}
}

// longFunctions maps each function of the product over maxFuncLines lines,
// as "folder Name" (methods as "folder Type.Name"), to its length.
func longFunctions(t *testing.T) map[string]int {
	t.Helper()
	fset := token.NewFileSet()
	long := map[string]int{}
	err := eachGoFile(fset, func(path, dir string, f *ast.File) error {
		if strings.HasSuffix(path, "_test.go") {
			return nil
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			lines := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
			if lines <= maxFuncLines {
				continue
			}
			name := fn.Name.Name
			if fn.Recv != nil && len(fn.Recv.List) > 0 {
				name = recvType(fn.Recv.List[0].Type) + "." + name
			}
			long[dir+" "+name] = lines
		}
		return nil
	})
	if err != nil {
		t.Fatalf("reading the module's Go files: %v", err)
	}
	if len(long) == 0 {
		t.Fatal("no function over the limit at all, not even forkExec: is moduleRoot right?")
	}
	return long
}

// eachGoFile parses every Go file of the module (tests too, less
// testdata, node_modules and hidden folders) and hands each to visit with
// its folder, slash-separated from the module root.
func eachGoFile(fset *token.FileSet, visit func(path, dir string, f *ast.File) error) error {
	return filepath.WalkDir(moduleRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != moduleRoot && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(moduleRoot, filepath.Dir(path))
		if err != nil {
			return err
		}
		return visit(path, filepath.ToSlash(rel), f)
	})
}
