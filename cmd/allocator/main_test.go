package main

import (
	"bytes"
	"context"
	"io/fs"
	"strings"
	"testing"

	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/migrations"
)

// TestMigrateOnly: -migrate-only applies every migration to an empty
// database and exits 0 without NATS; run again, it changes nothing.
func TestMigrateOnly(t *testing.T) {
	db := dbtest.NewEmpty(t)
	t.Setenv("ALLOT_MYSQL_DSN", db.DSN)
	t.Setenv("ALLOT_NATS_URL", "") // not needed: it never connects
	files, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("embedded migrations: %v %v", files, err)
	}
	for round := 1; round <= 2; round++ {
		var out bytes.Buffer
		if code := run(context.Background(), []string{"-migrate-only"}, &out); code != 0 {
			t.Fatalf("round %d: exit %d, want 0; output:\n%s", round, code, out.String())
		}
		if !strings.Contains(out.String(), "schema migrated") {
			t.Errorf("round %d: output does not say the schema was migrated:\n%s", round, out.String())
		}
		if n := db.Count(t, "SELECT COUNT(*) FROM schema_migration"); n != int64(len(files)) {
			t.Fatalf("round %d: %d migrations recorded, want %d", round, n, len(files))
		}
	}
	for _, table := range []string{"activity", "activity_signup", "processed_request", "rejected_message", "event_relay", "allocator_partition"} {
		if n := db.Count(t, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?", table); n != 1 {
			t.Errorf("table %s missing after -migrate-only", table)
		}
	}
}

// TestUsageErrors: bad flags, stray arguments and a missing NATS URL (when
// consuming) exit 2 with one line that says what to do.
func TestUsageErrors(t *testing.T) {
	db := dbtest.NewEmpty(t)
	t.Setenv("ALLOT_MYSQL_DSN", db.DSN)
	t.Setenv("ALLOT_NATS_URL", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-no-such-flag"}, "flag provided but not defined"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{nil, "ALLOT_NATS_URL is empty"},
	} {
		var out bytes.Buffer
		if code := run(context.Background(), tc.args, &out); code != 2 {
			t.Errorf("%q: exit %d, want 2; output:\n%s", tc.args, code, out.String())
		}
		if !strings.Contains(out.String(), tc.want) {
			t.Errorf("%q: output lacks %q:\n%s", tc.args, tc.want, out.String())
		}
	}
	if n := db.Count(t, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE()"); n != 0 {
		t.Errorf("a refused start created %d tables", n)
	}
}
