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
	"github.com/allot-dev/allot/internal/store/schema"
)

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
	if err := schema.Migrate(ctx, db.DB); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	check("after 0008")
	// A run that died after half the buckets: every statement runs again.
	exec("DELETE FROM waitlist_bucket WHERE first_seq > 2000")
	exec("UPDATE activity SET waiting_count = 0")
	exec("DELETE FROM schema_migration WHERE version LIKE '0008%'")
	if err := schema.Migrate(ctx, db.DB); err != nil {
		t.Fatalf("migrate again: %v", err)
	}
	check("after 0008 again")
}
