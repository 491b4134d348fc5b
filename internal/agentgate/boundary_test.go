package agentgate_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/warmpool/warmpool"

// managerImports returns, for each of the module's packages linked into the
// manager (cmd/manager), the packages its non-test files import. It reads
// the sources itself, so that go test's cache sees every file it depends on.
func managerImports(t *testing.T) map[string][]string {
	t.Helper()
	root := filepath.Join("..", "..")
	all := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || name == "vendor" || name == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		pkg := module + "/" + filepath.ToSlash(rel)
		for _, imp := range f.Imports {
			dep, _ := strconv.Unquote(imp.Path.Value)
			all[pkg] = append(all[pkg], dep)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("read the module's sources: %v", err)
	}
	linked := map[string][]string{}
	var visit func(string)
	visit = func(pkg string) {
		if _, seen := linked[pkg]; seen {
			return
		}
		linked[pkg] = all[pkg]
		for _, dep := range all[pkg] {
			if strings.HasPrefix(dep, module+"/") {
				visit(dep)
			}
		}
	}
	visit(module + "/cmd/manager")
	if len(linked) < 20 {
		t.Fatalf("found %d of the manager's packages: not the manager", len(linked))
	}
	return linked
}

// Only the gate builds agent clients: no other package of the manager
// imports the agent's client package (its constructors live there), and no
// controller imports any of the agent's packages.
func TestOnlyTheGateReachesAgents(t *testing.T) {
	const agentPkgs = module + "/internal/agent/"
	const clientPkg = module + "/internal/agent/client"
	const gate = module + "/internal/agentgate"
	pkgs := managerImports(t)
	if _, ok := pkgs[gate]; !ok {
		t.Fatalf("the manager does not link the gate")
	}
	for pkg, deps := range pkgs {
		for _, dep := range deps {
			switch {
			case dep == clientPkg && pkg != gate:
				t.Errorf("%s imports %s: agent clients are opened by internal/agentgate alone", pkg, dep)
			case strings.HasPrefix(dep, agentPkgs) && strings.HasPrefix(pkg, module+"/internal/controller"):
				t.Errorf("controller package %s imports %s: controllers reach agents through internal/agentgate", pkg, dep)
			}
		}
	}
}
