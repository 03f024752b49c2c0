package main

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go/parser"
	"go/token"
)

// The example is the code a user copies out of the repository and builds:
// none of its non-test files may import an internal package of another
// module (this repository's included), which builds only inside it.
func TestNoInternalImports(t *testing.T) {
	mod := modulePath(t)
	fset := token.NewFileSet()
	files := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		files++
		for _, imp := range f.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				return err
			}
			if slices.Contains(strings.Split(p, "/"), "internal") && !strings.HasPrefix(p, mod+"/") {
				t.Errorf("%s imports %s: an internal package of another module, which does not build outside this repository", path, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 2 {
		t.Fatalf("read %d non-test Go files: the test ran outside the example", files)
	}
}

// modulePath is the example's module path, from its go.mod.
func modulePath(t *testing.T) string {
	t.Helper()
	f, err := os.Open("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(p, `"`)
		}
	}
	t.Fatal("go.mod has no module line")
	return ""
}
