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

// configTable reads the configuration tables (every table row of the file
// whose first cell names an ALLOT_ variable): variable → its default cell
// (the n-th backquoted default of a row that lists several variables).
func configTable(t *testing.T, doc string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, line := range strings.Split(doc, "\n") {
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
			if _, dup := out[v]; dup {
				t.Errorf("%s lists %s twice", configDoc, v)
			}
			switch {
			case len(defs) == len(vars):
				out[v] = defs[i][1]
			default:
				out[v] = strings.TrimSpace(cells[2])
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s has no configuration table", configDoc)
	}
	return out
}

// configDoc is the file that documents every variable.
const configDoc = "docs/configuration.md"

// TestConfigurationTable: every ALLOT_ variable the code reads is in
// docs/configuration.md's tables with its default, and the tables list
// nothing the code does not read.
func TestConfigurationTable(t *testing.T) {
	root := filepath.Join("..", "..")
	data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(configDoc)))
	if err != nil {
		t.Fatal(err)
	}
	table := configTable(t, string(data))
	code := codeSettings(t, root)
	if len(code) < 30 {
		t.Fatalf("found only %d settings in the code: the scan is broken", len(code))
	}
	for name, ss := range code {
		cell, ok := table[name]
		if !ok {
			t.Errorf("%s (%s) is not in %s's configuration table", name, ss[0].where, configDoc)
			continue
		}
		for _, s := range ss {
			if s.hasDef && s.def != "" && cell != s.def && !strings.Contains(cell, "`"+s.def+"`") {
				t.Errorf("%s: %s says the default is %s, the code (%s) says %q", name, configDoc, cell, s.where, s.def)
			}
		}
	}
	for name := range table {
		if _, ok := code[name]; !ok {
			t.Errorf("%s lists %s, which no code reads", configDoc, name)
		}
	}
}
