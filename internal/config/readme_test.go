package config_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// setting is one ALLOT_ variable the code reads.
type setting struct {
	def, where string
	hasDef     bool
}

// codeSettings finds every envconfig tag in the module's non-test Go files
// (package main included, whose config structs cannot be imported) and
// every ALLOT_ variable read with os.Getenv.
func codeSettings(t *testing.T, root string) map[string]setting {
	t.Helper()
	out := map[string]setting{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "var" || d.Name() == "bin" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.Field:
				if n.Tag == nil {
					return true
				}
				tag, _ := strconv.Unquote(n.Tag.Value)
				st := reflect.StructTag(tag)
				if name := st.Get("envconfig"); name != "" {
					def, ok := st.Lookup("default")
					out["ALLOT_"+name] = setting{def: def, hasDef: ok, where: fset.Position(n.Pos()).String()}
				}
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok || sel.Sel.Name != "Getenv" || len(n.Args) != 1 {
					return true
				}
				if lit, ok := n.Args[0].(*ast.BasicLit); ok {
					name, _ := strconv.Unquote(lit.Value)
					if _, seen := out[name]; strings.HasPrefix(name, "ALLOT_") && !seen {
						out[name] = setting{where: fset.Position(n.Pos()).String()}
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var backquoted = regexp.MustCompile("`([^`]*)`")

// readmeTable reads the configuration table: variable → its default cell
// (the n-th backquoted default of a row that lists several variables).
func readmeTable(t *testing.T, readme string) map[string]string {
	t.Helper()
	start := strings.Index(readme, "\n## Configuration\n")
	if start < 0 {
		t.Fatal("README.md has no ## Configuration section")
	}
	section := readme[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	out := map[string]string{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.Contains(cells[1], "`ALLOT_") {
			continue
		}
		var vars []string
		for _, m := range backquoted.FindAllStringSubmatch(cells[1], -1) {
			vars = append(vars, m[1])
		}
		defs := backquoted.FindAllStringSubmatch(cells[2], -1)
		for i, v := range vars {
			switch {
			case len(defs) == len(vars):
				out[v] = defs[i][1]
			default:
				out[v] = strings.TrimSpace(cells[2])
			}
		}
	}
	return out
}

// TestREADMEConfigurationTable: every ALLOT_ variable the code reads is in
// the README's table with its default, and the table lists nothing the code
// does not read.
func TestREADMEConfigurationTable(t *testing.T) {
	root := filepath.Join("..", "..")
	data, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	table := readmeTable(t, string(data))
	code := codeSettings(t, root)
	if len(code) < 30 {
		t.Fatalf("found only %d settings in the code: the scan is broken", len(code))
	}
	for name, s := range code {
		cell, ok := table[name]
		switch {
		case !ok:
			t.Errorf("%s (%s) is not in README.md's configuration table", name, s.where)
		case s.hasDef && s.def != "" && cell != s.def && !strings.Contains(cell, "`"+s.def+"`"):
			t.Errorf("%s: README.md says the default is %s, the code (%s) says %q", name, cell, s.where, s.def)
		}
	}
	for name := range table {
		if _, ok := code[name]; !ok {
			t.Errorf("README.md lists %s, which no code reads", name)
		}
	}
}
