package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestEveryPackageHasADoc: each package of the module says what it owns in
// a package doc comment.
func TestEveryPackageHasADoc(t *testing.T) {
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
			return filepath.SkipDir
		}
		pkgs, err := parser.ParseDir(token.NewFileSet(), path, func(fi fs.FileInfo) bool {
			return !strings.HasSuffix(fi.Name(), "_test.go")
		}, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			return err
		}
		for name, pkg := range pkgs {
			documented := false
			for _, f := range pkg.Files {
				if f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != "" {
					documented = true
				}
			}
			if !documented {
				t.Errorf("package %s in %s has no package doc comment", name, path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestTestingCatalogue: docs/testing.md names tests that exist, and every
// test named by a scenario id (TestA1_…) is in it.
func TestTestingCatalogue(t *testing.T) {
	root := filepath.Join("..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "testing.md"))
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	for _, m := range regexp.MustCompile("`((?:Test|Fuzz|Run)[A-Za-z0-9_]*)`").FindAllStringSubmatch(string(doc), -1) {
		named[m[1]] = true
	}
	defined := map[string]bool{}
	scenario := regexp.MustCompile(`^Test[A-G][0-9]+_`)
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil {
				defined[fn.Name.Name] = true
				if scenario.MatchString(fn.Name.Name) && !named[fn.Name.Name] {
					t.Errorf("%s (%s) is a scenario's test, and docs/testing.md does not name it", fn.Name.Name, path)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name := range named {
		if !defined[name] {
			t.Errorf("docs/testing.md names %s, which no file defines", name)
		}
	}
}

// TestLayoutTable: the README's table of the project's layout names every
// folder that holds a Go package, and nothing that does not exist.
func TestLayoutTable(t *testing.T) {
	root := filepath.Join("..", "..")
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	section := strings.SplitN(strings.SplitN(string(readme), "## Project layout", 2)[1], "\n## ", 2)[0]
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([^`]+)/` \\|").FindAllStringSubmatch(section, -1) {
		listed[m[1]] = true
		if _, err := os.Stat(filepath.Join(root, m[1])); err != nil {
			t.Errorf("the README's layout names %s/, which does not exist", m[1])
		}
	}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		dir, _ := filepath.Rel(root, filepath.Dir(path))
		if strings.HasSuffix(path, ".go") && dir != "." && !listed[dir] && !listed[strings.SplitN(dir, "/", 2)[0]] {
			t.Errorf("%s holds Go code, and the README's layout does not name it", dir)
			listed[dir] = true // once
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
