package internal_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// storeAsserts returns, for the files of one package, every type assertion or type switch whose
// operand is a store value: an expression of an interface type named *Store (sandbox.Store,
// store.Store, runs.Store, a feature's JobStore...), or of any type of package internal/store,
// looked at through conversions to an interface (any(st).(X) is an assertion on st). A store
// is a contract: what a caller needs of it is in its interface, required, never probed for.
func storeAsserts(fset *token.FileSet, files []*ast.File, info *types.Info) []string {
	isStore := func(t types.Type) bool {
		for {
			p, ok := t.(*types.Pointer)
			if !ok {
				break
			}
			t = p.Elem()
		}
		n, ok := t.(*types.Named)
		if !ok || n.Obj().Pkg() == nil {
			return false
		}
		if strings.HasSuffix(n.Obj().Pkg().Path(), "internal/store") {
			return true
		}
		_, iface := n.Underlying().(*types.Interface)
		return iface && strings.HasSuffix(n.Obj().Name(), "Store")
	}
	// operand strips parentheses and conversions to an interface type.
	var operand func(e ast.Expr) ast.Expr
	operand = func(e ast.Expr) ast.Expr {
		switch x := e.(type) {
		case *ast.ParenExpr:
			return operand(x.X)
		case *ast.CallExpr:
			if tv, ok := info.Types[x.Fun]; ok && tv.IsType() && types.IsInterface(tv.Type) && len(x.Args) == 1 {
				return operand(x.Args[0])
			}
		}
		return e
	}
	var out []string
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			ta, ok := n.(*ast.TypeAssertExpr)
			if !ok {
				return true
			}
			x := operand(ta.X)
			if tv, ok := info.Types[x]; ok && isStore(tv.Type) {
				out = append(out, fmt.Sprintf("%s: type assertion on %s (a %s)", fset.Position(ta.Pos()), types.ExprString(x), tv.Type))
			}
			return true
		})
	}
	return out
}

// TestStoreAssertionsNone type-checks every non-test file of the module (against the compiled
// export data `go list -export` reports) and fails on any type assertion on a store.
func TestStoreAssertionsNone(t *testing.T) {
	if testing.Short() {
		t.Skip("type-checks the whole module")
	}
	t.Parallel()
	cmd := exec.Command("go", "list", "-export", "-deps", "-json=ImportPath,Dir,GoFiles,Export,Module,ImportMap", module+"...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	type listed struct {
		ImportPath, Dir, Export string
		GoFiles                 []string
		ImportMap               map[string]string
		Module                  *struct{ Path string }
	}
	exports := map[string]string{}
	var mine []listed
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		exports[p.ImportPath] = p.Export
		if p.Module != nil && p.Module.Path+"/" == module {
			mine = append(mine, p)
		}
	}
	if len(mine) < 50 {
		t.Fatalf("go list reported %d packages of the module; the check would prove nothing", len(mine))
	}
	checked := 0
	for _, p := range mine {
		fset := token.NewFileSet()
		var files []*ast.File
		for _, name := range p.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
		imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
			if m, ok := p.ImportMap[path]; ok {
				path = m
			}
			if exports[path] == "" {
				return nil, fmt.Errorf("no export data for %s", path)
			}
			return os.Open(exports[path])
		})
		info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}}
		conf := types.Config{Importer: imp}
		if _, err := conf.Check(p.ImportPath, fset, files, info); err != nil {
			t.Fatalf("type-check %s: %v", p.ImportPath, err)
		}
		checked++
		for _, v := range storeAsserts(fset, files, info) {
			t.Error(v)
		}
	}
	t.Logf("%d packages checked", checked)
}

// TestStoreAssertChecker proves that the checker catches an assertion on a store (directly,
// through any(...), and in a type switch) and lets others be.
func TestStoreAssertChecker(t *testing.T) {
	t.Parallel()
	const src = `package p

import "context"

type Store interface{ Get(ctx context.Context) error }
type JobStore interface{ Jobs() }
type Pruner interface{ Prune() }
type Other interface{ Do() }

type svc struct{ store Store; o Other }

func (s *svc) bad1() { _, _ = s.store.(JobStore) }
func (s *svc) bad2(st Store) { _, _ = any(st).(Pruner) }
func (s *svc) bad3() {
	switch s.store.(type) {
	case JobStore:
	}
}
func (s *svc) fine(v any) { _, _ = s.o.(Pruner); _, _ = v.(Store) }
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}}
	if _, err := (&types.Config{Importer: importer.Default()}).Check("p", fset, []*ast.File{f}, info); err != nil {
		t.Fatal(err)
	}
	got := storeAsserts(fset, []*ast.File{f}, info)
	if len(got) != 3 {
		t.Fatalf("found %d assertions on a store, want 3 (bad1, bad2, bad3): %q", len(got), got)
	}
	for i, line := range []string{"p.go:12:", "p.go:13:", "p.go:15:"} {
		if !strings.HasPrefix(got[i], line) {
			t.Errorf("finding %d = %q, want one at %s", i, got[i], line)
		}
	}
}
