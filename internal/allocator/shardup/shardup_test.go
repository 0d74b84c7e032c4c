package shardup

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/store"
)

// TestMigrateTellsDownFromFailed: a server that does not answer is down;
// one that answers with an error (here: no such database) is not, and
// neither is a migration that fails on a server that answers; a database
// that is there is migrated.
func TestMigrateTellsDownFromFailed(t *testing.T) {
	ctx := context.Background()
	good := dbtest.NewEmpty(t)
	away, err := store.OpenLater("root@tcp(127.0.0.1:1)/allot?timeout=1s", 1) // nothing listens on port 1
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { away.Close() })
	cfg, err := mysql.ParseDSN(good.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName = "allot_no_such_database"
	missing, err := store.OpenLater(cfg.FormatDSN(), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { missing.Close() })
	broken := dbtest.NewEmpty(t)
	if _, err := broken.Exec("CREATE VIEW schema_migration AS SELECT 1 AS x"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		db       *sql.DB
		down, ok bool
	}{
		{"a server that does not answer", away, true, false},
		{"no such database", missing, false, false},
		{"a migration that fails", broken.DB, false, false},
		{"a database that is there", good.DB, false, true},
	} {
		down, err := Migrate(ctx, c.db)
		if down != c.down || (err == nil) != c.ok {
			t.Errorf("%s: down %v, %v; want down %v, ok %v", c.name, down, err, c.down, c.ok)
		}
	}
	if n := good.Count(t, "SELECT COUNT(*) FROM schema_migration"); n == 0 {
		t.Error("the good database was not migrated")
	}
}

// TestRunStopsForAFailedMigration: Run migrates the shards that answer,
// keeps trying one that does not (Ready stays open, Tried counts), and
// stops with an error naming a shard whose migration fails.
func TestRunStopsForAFailedMigration(t *testing.T) {
	good := dbtest.NewEmpty(t)
	away, err := store.OpenLater("root@tcp(127.0.0.1:1)/allot?timeout=1s", 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { away.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := New(shards.Pools{"s0": good.DB, "s1": away}, 0, log)
	tried := make(chan string, 100)
	s.Tried = func(shard string) { tried <- shard }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case <-s.Ready("s0"):
	case <-time.After(30 * time.Second):
		t.Fatal("s0 not ready")
	}
	for range 2 {
		if shard := <-tried; shard != "s1" {
			t.Fatalf("tried %s, want s1", shard)
		}
	}
	select {
	case <-s.Ready("s1"):
		t.Fatal("s1 ready while it does not answer")
	default:
	}
	if s.Ready("s9") != nil {
		t.Error("a shard not configured has a Ready channel")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after its context ended: %v", err)
	}

	broken := dbtest.NewEmpty(t)
	if _, err := broken.Exec("CREATE VIEW schema_migration AS SELECT 1 AS x"); err != nil {
		t.Fatal(err)
	}
	s = New(shards.Pools{"s0": good.DB, "s1": away, "s2": broken.DB}, 0, log)
	err = s.Run(context.Background())
	if err == nil || !strings.HasPrefix(err.Error(), "shard s2: ") || errors.Is(err, context.Canceled) {
		t.Fatalf("Run with s2's migration failing: %v, want an error naming s2", err)
	}
}
