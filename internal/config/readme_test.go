package config_test

import (
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/allot-dev/allot/internal/binaries"
	"github.com/allot-dev/allot/internal/dbtest"
)

// setting is one ALLOT_ variable the code reads.
type setting struct {
	def, where string
	hasDef     bool
}

// codeSettings lists every ALLOT_ variable of every binary's configuration
// types (internal/binaries), and the tests' ALLOT_TEST_MYSQL_DSN. A name
// several binaries read is returned once per default they give it.
func codeSettings(t *testing.T, root string) map[string][]setting {
	t.Helper()
	out := map[string][]setting{
		"ALLOT_TEST_MYSQL_DSN": {{def: dbtest.DefaultDSN, hasDef: true, where: "internal/dbtest"}},
	}
	listed := map[string]bool{}
	for _, b := range binaries.All {
		listed[b.Dir] = true
		for _, v := range binaries.Vars(b.Config...) {
			s := setting{def: v.Default, hasDef: v.HasDefault, where: b.Dir}
			if !slices.ContainsFunc(out[v.Name], func(o setting) bool { return o.def == s.def && o.hasDef == s.hasDef }) {
				out[v.Name] = append(out[v.Name], s)
			}
		}
	}
	// Every command is listed, so that none of its variables goes unseen.
	for _, dir := range []string{"cmd", "internal/cmd"} {
		ents, err := os.ReadDir(filepath.Join(root, dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if e.IsDir() && !listed[path.Join(dir, e.Name())] {
				t.Errorf("%s/%s is not in binaries.All: its variables are not checked", dir, e.Name())
			}
		}
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
	for name, ss := range code {
		cell, ok := table[name]
		if !ok {
			t.Errorf("%s (%s) is not in README.md's configuration table", name, ss[0].where)
			continue
		}
		for _, s := range ss {
			if s.hasDef && s.def != "" && cell != s.def && !strings.Contains(cell, "`"+s.def+"`") {
				t.Errorf("%s: README.md says the default is %s, the code (%s) says %q", name, cell, s.where, s.def)
			}
		}
	}
	for name := range table {
		if _, ok := code[name]; !ok {
			t.Errorf("README.md lists %s, which no code reads", name)
		}
	}
}
