package client_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"slices"
	"strconv"
	"testing"
)

// TestEveryServerWordIsTyped: the client declares exactly the server's
// words of each kind (read from both sources, so a word the server gains,
// such as a new outcome, fails here until the client has it too).
func TestEveryServerWordIsTyped(t *testing.T) {
	server := wordsOf(t, "../internal/wire/wire.go")
	public := wordsOf(t, "types.go")
	for _, kind := range []string{"Op", "Outcome", "Status", "EventKind"} {
		if len(server[kind]) == 0 {
			t.Fatalf("no %s words found in internal/wire", kind)
		}
		s, p := slices.Sorted(maps.Keys(server[kind])), slices.Sorted(maps.Keys(public[kind]))
		if !slices.Equal(s, p) {
			t.Errorf("%s: the server has %q, the client %q", kind, s, p)
		}
	}
}

// wordsOf returns the string constants of each named type declared in file.
func wordsOf(t *testing.T, file string) map[string]map[string]bool {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]bool{}
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			typ, ok := vs.Type.(*ast.Ident)
			if !ok {
				continue
			}
			for _, v := range vs.Values {
				if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					s, _ := strconv.Unquote(lit.Value)
					if out[typ.Name] == nil {
						out[typ.Name] = map[string]bool{}
					}
					out[typ.Name][s] = true
				}
			}
		}
	}
	return out
}
