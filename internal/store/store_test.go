package store_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/store"
)

func TestMigrateTwice(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t) // migrated once
	ctx := context.Background()
	if err := store.Migrate(ctx, db.DB); err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	// Even with the record of applied versions gone, re-running is harmless.
	if _, err := db.ExecContext(ctx, "DELETE FROM schema_migration"); err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx, db.DB); err != nil {
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
	if err := store.Migrate(ctx, db.DB); err != nil {
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

func TestWithTxRetriesDeadlocks(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	calls := 0
	err := store.WithTx(ctx, db.DB, store.TxOptions{}, func(tx *sql.Tx) error {
		calls++
		if calls < 3 {
			return &mysql.MySQLError{Number: 1213, Message: "Deadlock found"}
		}
		_, err := tx.ExecContext(ctx, "INSERT INTO activity (id, capacity) VALUES (7, 1)")
		return err
	})
	if err != nil || calls != 3 {
		t.Fatalf("WithTx: err %v after %d calls, want success on the 3rd", err, calls)
	}
	calls = 0
	err = store.WithTx(ctx, db.DB, store.TxOptions{}, func(tx *sql.Tx) error {
		calls++
		return errors.New("not retryable")
	})
	if err == nil || calls != 1 || !strings.Contains(err.Error(), "not retryable") {
		t.Fatalf("WithTx: err %v after %d calls, want the error after one call", err, calls)
	}
}

// TestMigrateBackfillsReadCounters: 0008 fills waiting_count and the
// waitlist buckets from the signups of a database that had neither, and a
// run of it that died midway (the record lost, buckets half written) is
// finished by running it again; the reads then match full counts.
func TestMigrateBackfillsReadCounters(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// The schema before 0008, with a long line of waiters between
	// cancelled rows, and a second activity without any.
	exec("DROP TABLE waitlist_bucket")
	exec("ALTER TABLE activity DROP CONSTRAINT chk_activity_waiting")
	exec("ALTER TABLE activity DROP COLUMN waiting_count")
	exec("DELETE FROM schema_migration WHERE version LIKE '0008%'")
	exec("INSERT INTO activity (id, capacity, confirmed_count, next_seq) VALUES (1, 2, 2, 10000), (2, 5, 1, 10000)")
	exec("INSERT INTO activity_signup (activity_id, user_id, status, queue_seq) VALUES (1, 1, 'CONFIRMED', 1), (1, 2, 'CONFIRMED', 2), (2, 1, 'CONFIRMED', 3)")
	const users = 2600
	for lo := 3; lo < users; lo += 500 {
		var b strings.Builder
		for u := lo; u < min(lo+500, users); u++ {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			status := "WAITING"
			if u%7 == 0 {
				status = "CANCELLED"
			}
			fmt.Fprintf(&b, "(1, %d, '%s', %d)", u, status, 3*u)
		}
		exec("INSERT INTO activity_signup (activity_id, user_id, status, queue_seq) VALUES " + b.String())
	}
	check := func(what string) {
		t.Helper()
		db.CheckInvariants(t)
		if n := db.Count(t, "SELECT waiting_count FROM activity WHERE id = 1"); n != db.Count(t, "SELECT COUNT(*) FROM activity_signup WHERE activity_id = 1 AND status = 'WAITING'") {
			t.Fatalf("%s: waiting_count %d", what, n)
		}
		if n := db.Count(t, "SELECT COUNT(*) FROM waitlist_bucket WHERE activity_id = 1"); n != 3 {
			t.Fatalf("%s: %d buckets, want 3 for %d waiters", what, n, db.Count(t, "SELECT waiting_count FROM activity WHERE id = 1"))
		}
		for _, u := range []int64{3, 4, 1025, 1200, 2222, users - 1} {
			got, _, err := store.GetSignup(ctx, db, 1, u)
			if err != nil {
				t.Fatal(err)
			}
			want, _, err := store.GetSignupByCount(ctx, db, 1, u)
			if err != nil {
				t.Fatal(err)
			}
			if *got.Position != *want.Position {
				t.Fatalf("%s: user %d at %d, the full count says %d", what, u, *got.Position, *want.Position)
			}
		}
	}
	if err := store.Migrate(ctx, db.DB); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	check("after 0008")
	// A run that died after half the buckets: every statement runs again.
	exec("DELETE FROM waitlist_bucket WHERE first_seq > 2000")
	exec("UPDATE activity SET waiting_count = 0")
	exec("DELETE FROM schema_migration WHERE version LIKE '0008%'")
	if err := store.Migrate(ctx, db.DB); err != nil {
		t.Fatalf("migrate again: %v", err)
	}
	check("after 0008 again")
}
