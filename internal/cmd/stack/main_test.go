package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/dbtest"
)

// TestReset: -reset drops the stack's database and deletes its NATS store,
// and a second reset finds nothing to do.
func TestReset(t *testing.T) {
	db := dbtest.New(t)
	storeDir := filepath.Join(t.TempDir(), "nats")
	if err := os.MkdirAll(filepath.Join(storeDir, "jetstream"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("ALLOT_MYSQL_DSN", db.DSN)
	t.Setenv("ALLOT_NATS_URL", "")
	t.Setenv("ALLOT_EMBEDDED_NATS_STORE", storeDir)
	for round := 1; round <= 2; round++ {
		if code := run(context.Background(), []string{"-reset"}); code != 0 {
			t.Fatalf("round %d: exit %d, want 0", round, code)
		}
		if n := db.Count(t, "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?", db.Name); n != 0 {
			t.Fatalf("round %d: database %s still exists", round, db.Name)
		}
		if _, err := os.Stat(storeDir); !os.IsNotExist(err) {
			t.Fatalf("round %d: the NATS store is still there (%v)", round, err)
		}
	}
}

// TestResetRefusesAnExternalNATS: with ALLOT_NATS_URL set the streams are
// not the stack's, so it deletes nothing and says why.
func TestResetRefusesAnExternalNATS(t *testing.T) {
	db := dbtest.New(t)
	t.Setenv("ALLOT_MYSQL_DSN", db.DSN)
	t.Setenv("ALLOT_NATS_URL", "nats://127.0.0.1:4222")
	var c cfg
	if err := config.Load(&c); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if code := resetStack(context.Background(), c, &out); code != 2 {
		t.Fatalf("exit %d, want 2; output: %s", code, out.String())
	}
	if !strings.Contains(out.String(), "ALLOT_NATS_URL") {
		t.Errorf("the refusal does not name ALLOT_NATS_URL: %s", out.String())
	}
	if n := db.Count(t, "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?", db.Name); n != 1 {
		t.Fatal("the database was dropped")
	}
}

func TestBaseURL(t *testing.T) {
	tests := []struct{ addr, want string }{
		{":8080", "http://localhost:8080"},
		{"0.0.0.0:8080", "http://localhost:8080"},
		{"[::]:8080", "http://localhost:8080"},
		{"127.0.0.1:18181", "http://127.0.0.1:18181"},
		{"example.internal:80", "http://example.internal:80"},
		{"[::1]:8080", "http://[::1]:8080"},
	}
	for _, tt := range tests {
		if got := baseURL(tt.addr); got != tt.want {
			t.Errorf("baseURL(%q) = %q, want %q", tt.addr, got, tt.want)
		}
	}
}
