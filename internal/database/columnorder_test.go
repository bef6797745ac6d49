package database

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// positional matches SQL that depends on a table's columns and their
// order: SELECT * (or t.*), and an INSERT without a column list.
var positional = regexp.MustCompile(`(?is)\bSELECT\s+(DISTINCT\s+)?(\w+\.)?\*|\bINSERT\s+(OR\s+\w+\s+)?INTO\s+\w+\s+(VALUES|SELECT)\b`)

// The third rule of migrations/README.md, kept: no string in the
// module's code (tests aside) is SQL that reads or writes a table by its
// column order, so a column a newer migration adds changes nothing for
// the code of an older release running on the same database.
func TestNoStatementDependsOnATablesColumns(t *testing.T) {
	root := filepath.Join("..", "..")
	seen := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "tools") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		seen++
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if m := positional.FindString(lit.Value); m != "" {
					t.Errorf("%s: %q depends on the table's columns and their order; name the columns", path, m)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen < 100 {
		t.Fatalf("read %d Go files under %s; the walk missed the module", seen, root)
	}
}
