package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/allot-dev/allot/internal/devdb"
	"github.com/allot-dev/allot/internal/testenv"
)

// TestHandsTheDSNToTheCommand: the command sees the variable set to the
// server that answers and its exit code is devdb's.
func TestHandsTheDSNToTheCommand(t *testing.T) {
	dsn := os.Getenv("ALLOT_TEST_MYSQL_DSN")
	if dsn == "" {
		dsn = defaults["ALLOT_TEST_MYSQL_DSN"]
	}
	t.Setenv("ALLOT_TEST_MYSQL_DSN", dsn)
	var out bytes.Buffer
	code := run([]string{"-var", "ALLOT_TEST_MYSQL_DSN", "-server", "none", "-install=false", "-dir", t.TempDir(),
		"--", "sh", "-c", `test "$ALLOT_TEST_MYSQL_DSN" = "$0" && exit 7`, dsn}, &out)
	if code != 7 {
		t.Fatalf("exit %d, want the command's 7; output: %s", code, out.String())
	}
}

// TestNoServerIsOneLine: nothing answers, nothing is installed, installing
// is off: exit 2, one line naming a command, and the command never runs.
func TestNoServerIsOneLine(t *testing.T) {
	t.Setenv("ALLOT_MYSQL_DSN", testenv.DeadDSN(t, "allot"))
	marker := filepath.Join(t.TempDir(), "ran")
	var out bytes.Buffer
	code := run([]string{"-server", "none", "-install=false", "-dir", t.TempDir(), "--", "touch", marker}, &out)
	if code != 2 {
		t.Fatalf("exit %d, want 2; output: %s", code, out.String())
	}
	if lines := strings.Count(strings.TrimSpace(out.String()), "\n") + 1; lines != 1 || !strings.Contains(out.String(), "install") {
		t.Errorf("want one line naming an install command, got %q", out.String())
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the command ran without a server")
	}
}

// TestResetDeletesThePrivateData: -reset runs the command against the
// private server, stops it and deletes its directory.
func TestResetDeletesThePrivateData(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a database server")
	}
	if devdb.FindServer() == "" {
		testenv.Missing(t, "no mariadbd or mysqld installed")
	}
	t.Setenv("ALLOT_MYSQL_DSN", testenv.DeadDSN(t, "allot"))
	dir := filepath.Join(t.TempDir(), "mysql")
	var out bytes.Buffer
	if code := run([]string{"-dir", dir, "--", "true"}, &out); code != 0 {
		t.Fatalf("private start: exit %d: %s", code, out.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); err != nil {
		t.Fatalf("no data directory after a private start: %v", err)
	}
	out.Reset()
	if code := run([]string{"-reset", "-dir", dir, "--", "true"}, &out); code != 0 {
		t.Fatalf("reset: exit %d: %s", code, out.String())
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("%s is still there after -reset (%v)", dir, err)
	}
}
