package schema_test

import (
	"context"
	"errors"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/store/schema"
)

func TestMigrateTwice(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t) // migrated once
	ctx := context.Background()
	if err := schema.Migrate(ctx, db.DB); err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	// Even with the record of applied versions gone, re-running is harmless.
	if _, err := db.ExecContext(ctx, "DELETE FROM schema_migration"); err != nil {
		t.Fatal(err)
	}
	if err := schema.Migrate(ctx, db.DB); err != nil {
		t.Fatalf("migrate after losing schema_migration: %v", err)
	}
	for _, table := range []string{"activity", "activity_signup", "processed_request", "rejected_message", "event_relay", "allocator_partition"} {
		if n := db.Count(t, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?", table); n != 1 {
			t.Errorf("table %s missing", table)
		}
	}
}

// TestMigrateAfterDyingMidMigration: a run that died between dropping a
// constraint and adding it back (0006 widens chk_signup_status that way)
// finishes the job when run again: the drop of what is gone is tolerated
// and the constraint is back.
func TestMigrateAfterDyingMidMigration(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	for _, q := range []string{
		"ALTER TABLE activity_signup DROP CONSTRAINT chk_signup_status",
		"DELETE FROM schema_migration WHERE version LIKE '0006%'",
		"INSERT INTO activity (id, capacity, confirmed_count, next_seq) VALUES (1, 1, 0, 1)",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := schema.Migrate(ctx, db.DB); err != nil {
		t.Fatalf("migrate after a run that died mid-0006: %v", err)
	}
	_, err := db.ExecContext(ctx, "INSERT INTO activity_signup (activity_id, user_id, status, queue_seq) VALUES (1, 1, 'BOGUS', 1)")
	if me, ok := errors.AsType[*mysql.MySQLError](err); !ok || me.Number != 4025 && me.Number != 3819 {
		t.Fatalf("a status outside the CHECK: %v, want the constraint's refusal", err)
	}
}

// TestSchemaConstraints: the constraints refuse what the invariants forbid,
// whatever the code above them does.
func TestSchemaConstraints(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	mustExec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	mustExec("INSERT INTO activity (id, capacity, confirmed_count) VALUES (1, 2, 2)")
	mustExec("INSERT INTO activity_signup (activity_id, user_id, status, queue_seq) VALUES (1, 10, 'CONFIRMED', 1)")
	tests := []struct {
		name, query string
	}{
		{"confirmed above capacity", "UPDATE activity SET confirmed_count = 3 WHERE id = 1"},
		{"negative confirmed", "UPDATE activity SET confirmed_count = -1 WHERE id = 1"},
		{"negative capacity", "INSERT INTO activity (id, capacity) VALUES (2, -1)"},
		{"second row for a user", "INSERT INTO activity_signup (activity_id, user_id, status, queue_seq) VALUES (1, 10, 'WAITING', 2)"},
		{"queue_seq reused", "INSERT INTO activity_signup (activity_id, user_id, status, queue_seq) VALUES (1, 11, 'WAITING', 1)"},
		{"unknown status", "INSERT INTO activity_signup (activity_id, user_id, status, queue_seq) VALUES (1, 12, 'MAYBE', 3)"},
		{"result twice", "INSERT INTO processed_request (request_id, seq, op, activity_id, user_id, outcome, applied_at) VALUES ('r', 1, 'join', 1, 1, 'X', NOW()), ('r', 2, 'join', 1, 1, 'X', NOW())"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := db.ExecContext(ctx, tc.query)
			var me *mysql.MySQLError
			if !errors.As(err, &me) {
				t.Fatalf("%s: got %v, want a constraint error", tc.query, err)
			}
		})
	}
}
