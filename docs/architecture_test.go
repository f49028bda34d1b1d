// Package docs holds the tests that keep docs/ true to the code: every
// package and Go name that architecture.md writes in backticks exists,
// every package has its line in the package map, and the layering the
// document describes holds.
package docs

import (
	"encoding/json"
	"errors"
	"go/ast"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// moduleRoot is the module's root: the tests run in docs/.
const moduleRoot = ".."

// goIndex is what the module's Go source declares, read with go/parser:
// each package folder's names, and the folders of each package name.
type goIndex struct {
	// decls maps a folder (slash-separated, from the module root) to its
	// names: top-level functions, types, variables and constants as Name,
	// methods and struct fields as Type.Name.
	decls map[string]map[string]bool
	// dirs maps a package name to the folders that hold one by it.
	dirs map[string][]string
	// methods are the names of every method, of any type: a bare `Name`
	// in the document may be one.
	methods map[string]bool
	// product are the folders with Go files that are not tests.
	product []string
}

// indexModule parses every Go file of the module (tests too, less
// testdata and hidden folders).
func indexModule(t *testing.T) *goIndex {
	t.Helper()
	ix := &goIndex{decls: map[string]map[string]bool{}, dirs: map[string][]string{}, methods: map[string]bool{}}
	fset := token.NewFileSet()
	named := map[string]bool{}
	err := eachGoFile(fset, func(path, dir string, f *ast.File) error {
		test := strings.HasSuffix(path, "_test.go")
		pkg := strings.TrimSuffix(f.Name.Name, "_test")
		if !named[dir+" "+pkg] {
			named[dir+" "+pkg] = true
			ix.dirs[pkg] = append(ix.dirs[pkg], dir)
		}
		if !test && !slices.Contains(ix.product, dir) {
			ix.product = append(ix.product, dir)
		}
		names := ix.decls[dir]
		if names == nil {
			names = map[string]bool{}
			ix.decls[dir] = names
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil || len(d.Recv.List) == 0 {
					names[d.Name.Name] = true
				} else {
					names[recvType(d.Recv.List[0].Type)+"."+d.Name.Name] = true
					ix.methods[d.Name.Name] = true
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						names[s.Name.Name] = true
						if st, ok := s.Type.(*ast.StructType); ok {
							for _, fld := range st.Fields.List {
								for _, n := range fld.Names {
									names[s.Name.Name+"."+n.Name] = true
								}
							}
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							names[n.Name] = true
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("reading the module's Go files: %v", err)
	}
	if len(ix.product) == 0 {
		t.Fatal("the module has no Go package: is moduleRoot right?")
	}
	return ix
}

// recvType is a method receiver's type name, less its pointer and type
// parameters.
func recvType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// declared says whether name (Name, or Type.Name) is declared in any of
// the folders.
func (ix *goIndex) declared(dirs []string, name string) bool {
	for _, d := range dirs {
		if ix.decls[d][name] {
			return true
		}
	}
	return false
}

// allDirs are every folder with Go files.
func (ix *goIndex) allDirs() []string {
	var out []string
	for d := range ix.decls {
		out = append(out, d)
	}
	return out
}

var (
	codeSpan   = regexp.MustCompile("`([^`\n]+)`")
	pathLike   = regexp.MustCompile(`^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+/?$`)
	identLike  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(\(\))?$`)
	folderLike = regexp.MustCompile(`^[a-z][a-z0-9_-]*/$`)
)

// codeSpans are the document's inline code spans, outside fenced blocks.
func codeSpans(doc string) []string {
	var out []string
	fenced := false
	for line := range strings.SplitSeq(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// checkName says what is wrong with a code span that names something of
// the module, "" when it exists; checked says whether the span named
// something at all (a path or a Go name) rather than a command or a value.
func checkName(ix *goIndex, span string) (problem string, checked bool) {
	switch {
	case pathLike.MatchString(span) || folderLike.MatchString(span):
		if _, err := os.Stat(filepath.Join(moduleRoot, filepath.FromSlash(span))); err != nil {
			return "no such file or folder in the module", true
		}
		return "", true
	case identLike.MatchString(span):
		name := strings.TrimSuffix(span, "()")
		parts := strings.Split(name, ".")
		if len(parts) == 1 {
			if len(ix.dirs[name]) > 0 || ix.declared(ix.allDirs(), name) || ix.methods[name] {
				return "", true
			}
			return "no package, Go declaration or method has this name", true
		}
		if dirs := ix.dirs[parts[0]]; len(dirs) > 0 {
			if ix.declared(dirs, strings.Join(parts[1:], ".")) {
				return "", true
			}
			return "package " + parts[0] + " (" + strings.Join(dirs, ", ") + ") declares no " + strings.Join(parts[1:], "."), true
		}
		if ix.declared(ix.allDirs(), name) {
			return "", true
		}
		return "no package is named " + parts[0] + ", and no type has a method or field " + name, true
	}
	return "", false
}

// TestArchitectureNamesExist: every package, file and Go name that
// docs/architecture.md writes in backticks exists in the module, and
// every package that is not only tests has its line in the package map.
// A rename or removal that leaves the document behind fails here, naming
// the span.
func TestArchitectureNamesExist(t *testing.T) {
	raw, err := os.ReadFile("architecture.md")
	if err != nil {
		t.Fatalf("reading docs/architecture.md: %v", err)
	}
	ix := indexModule(t)
	checked := 0
	mentioned := map[string]bool{}
	for _, span := range codeSpans(string(raw)) {
		problem, ok := checkName(ix, span)
		if !ok {
			continue
		}
		checked++
		mentioned[strings.TrimSuffix(span, "/")] = true
		if problem != "" {
			t.Errorf("docs/architecture.md names `%s`: %s", span, problem)
		}
	}
	// The document's claim to be a map: each package of the module is on it.
	for _, dir := range ix.product {
		if dir != "." && !mentioned[dir] {
			t.Errorf("package folder %s has no line in docs/architecture.md's package map", dir)
		}
	}
	if checked < 60 {
		t.Errorf("docs/architecture.md names only %d things in backticks that this test can check; has its format changed?", checked)
	}
}

// TestCheckNameRefuses: the check above refuses what does not exist, so
// that TestArchitectureNamesExist cannot pass by checking nothing.
func TestCheckNameRefuses(t *testing.T) {
	ix := indexModule(t)
	for _, span := range []string{"spawn.NoSuchStart", "broker.Broker.NoSuchMethod", "internal/nosuchpkg", "NoSuchFunctionAnywhere", "broker/nosuch.go"} {
		if problem, ok := checkName(ix, span); !ok || problem == "" {
			t.Errorf("checkName(%q) = %q, %v: want a problem", span, problem, ok)
		}
	}
	for _, span := range []string{"spawn.Start", "broker.Broker.Run", "PlanRun", "internal/spawn", "broker/policy.go", "procs.HeldUnlinkedOn", "rpc.BootstrapFD", "spawn.Command.Slots"} {
		if problem, ok := checkName(ix, span); !ok || problem != "" {
			t.Errorf("checkName(%q) = %q, %v: want it found", span, problem, ok)
		}
	}
	for _, span := range []string{"thermite trial agent", "/proc/self/exe", "0711", "--json"} {
		if _, ok := checkName(ix, span); ok {
			t.Errorf("checkName(%q) checked a span that names nothing of the module", span)
		}
	}
}

// goPackage is what `go list -json` says of a package that these tests read.
type goPackage struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// goList runs `go list -json` (with args) in the module root.
func goList(t *testing.T, args ...string) []goPackage {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json"}, args...)...)
	cmd.Dir = moduleRoot
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -json %s: %v", strings.Join(args, " "), err)
	}
	var pkgs []goPackage
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p goPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list -json %s: %v", strings.Join(args, " "), err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 {
		t.Fatalf("go list -json %s listed nothing", strings.Join(args, " "))
	}
	return pkgs
}

// topLevel says whether an import path is one of this module's packages
// outside internal/ (controller, broker, fence, selftest, roles, cmd/...).
func topLevel(path string) bool {
	return strings.HasPrefix(path, "thermite/") && !strings.HasPrefix(path, "thermite/internal/")
}

// TestInternalImportsNoTopLevel: the packages under internal/ are the
// layer the top-level packages build on, so none of them imports a
// top-level package of this module, in its code or its tests. The one
// exception is internal/testrig, which stands a whole rig up for tests
// (it needs the role table) and which no binary links.
func TestInternalImportsNoTopLevel(t *testing.T) {
	const rig = "thermite/internal/testrig"
	for _, p := range goList(t, "./internal/...") {
		for _, imp := range slices.Concat(p.Imports, p.TestImports, p.XTestImports) {
			if topLevel(imp) && p.ImportPath != rig {
				t.Errorf("%s imports %s: a package under internal/ may import only the standard library, modules and other internal packages", p.ImportPath, imp)
			}
		}
	}
	// The exception holds only while nothing that ships links it.
	for _, p := range goList(t, "-deps", "./cmd/...") {
		if p.ImportPath == rig {
			t.Errorf("a command links %s, the test rig, which imports top-level packages", rig)
		}
	}
}
