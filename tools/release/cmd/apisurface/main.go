// Command apisurface prints the public API of a module: for every package
// a user can import (not internal, not main, not a test, not a nested
// module), its exported constants, variables, types (exported fields and
// methods) and functions, without bodies or comments, sorted, so that a
// diff of its output is a diff of the public surface.
//
//	apisurface MODULEDIR
package main

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/printer"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/mod/modfile"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: apisurface MODULEDIR")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "apisurface:", err)
		os.Exit(1)
	}
}

func run(root string) error {
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return err
	}
	modpath := modfile.ModulePath(gomod)
	var dirs []string
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		name := d.Name()
		if p != root {
			if name == "internal" || name == "testdata" || name == "vendor" ||
				strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir
			}
		}
		dirs = append(dirs, p)
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Printf("module %s\n", modpath)
	for _, dir := range dirs {
		pkg, err := build.ImportDir(dir, 0)
		if err != nil {
			if _, ok := err.(*build.NoGoError); ok {
				continue
			}
			return err
		}
		if pkg.Name == "main" {
			continue
		}
		rel, _ := filepath.Rel(root, dir)
		decls, err := surface(dir, pkg.GoFiles)
		if err != nil {
			return err
		}
		fmt.Printf("\npackage %s\n", path.Join(modpath, filepath.ToSlash(rel)))
		for _, d := range decls {
			fmt.Println(d)
		}
	}
	return nil
}

func surface(dir string, files []string) ([]string, error) {
	fset := token.NewFileSet()
	var out []string
	cfg := &printer.Config{Mode: printer.UseSpaces | printer.TabIndent, Tabwidth: 8}
	print := func(n any) {
		var b bytes.Buffer
		cfg.Fprint(&b, fset, n)
		out = append(out, b.String())
	}
	for _, name := range files {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() || (d.Recv != nil && !exportedRecv(d.Recv)) {
					continue
				}
				d.Body, d.Doc = nil, nil
				print(d)
			case *ast.GenDecl:
				// In a const group, a spec without values repeats the
				// previous type and expressions with the next iota.
				var lastType ast.Expr
				var lastValues []ast.Expr
				iotaOf := map[*ast.ValueSpec]int{}
				for iota, spec := range d.Specs {
					if s, ok := spec.(*ast.ValueSpec); ok && d.Tok == token.CONST {
						if len(s.Values) > 0 {
							lastType, lastValues = s.Type, s.Values
						} else {
							s.Type, s.Values = lastType, lastValues
						}
						if usesIota(s.Values) {
							iotaOf[s] = iota
						}
					}
				}
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						if !s.Name.IsExported() {
							continue
						}
						if st, ok := s.Type.(*ast.StructType); ok {
							st.Fields.List = exportedFields(st.Fields.List)
						}
						print(&ast.GenDecl{Tok: token.TYPE, Specs: []ast.Spec{s}})
					case *ast.ValueSpec:
						for i, n := range s.Names {
							if !n.IsExported() {
								continue
							}
							v := &ast.ValueSpec{Names: []*ast.Ident{n}, Type: s.Type}
							if d.Tok == token.CONST && i < len(s.Values) {
								v.Values = []ast.Expr{s.Values[i]}
							}
							print(&ast.GenDecl{Tok: d.Tok, Specs: []ast.Spec{v}})
							if n, ok := iotaOf[s]; ok {
								out[len(out)-1] += fmt.Sprintf(" // iota = %d", n)
							}
						}
					}
				}
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

func usesIota(values []ast.Expr) bool {
	found := false
	for _, v := range values {
		ast.Inspect(v, func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok && id.Name == "iota" {
				found = true
			}
			return !found
		})
	}
	return found
}

func exportedRecv(fl *ast.FieldList) bool {
	t := fl.List[0].Type
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
		case *ast.IndexExpr:
			t = x.X
		case *ast.IndexListExpr:
			t = x.X
		case *ast.Ident:
			return x.IsExported()
		default:
			return false
		}
	}
}

func exportedFields(list []*ast.Field) []*ast.Field {
	var keep []*ast.Field
	for _, f := range list {
		if len(f.Names) == 0 {
			keep = append(keep, f) // embedded
			continue
		}
		var names []*ast.Ident
		for _, n := range f.Names {
			if n.IsExported() {
				names = append(names, n)
			}
		}
		if len(names) > 0 {
			keep = append(keep, &ast.Field{Names: names, Type: f.Type, Tag: f.Tag})
		}
	}
	return keep
}
