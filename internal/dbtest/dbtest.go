// Package dbtest gives each test its own freshly migrated MySQL database on
// the real server named by ALLOT_TEST_MYSQL_DSN (default: root on
// 127.0.0.1:3306), dropped when the test ends.
package dbtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/store/schema"
)

// DefaultDSN is the server tests use when ALLOT_TEST_MYSQL_DSN is unset.
const DefaultDSN = "root@tcp(127.0.0.1:3306)/?parseTime=true"

// DB is one test's database.
type DB struct {
	*sql.DB
	// DSN connects to this test's database.
	DSN string
	// Name is the database name.
	Name string
}

// New creates, migrates and returns a database for t on the server named
// by ALLOT_TEST_MYSQL_DSN (DefaultDSN when unset).
func New(t testing.TB) *DB {
	t.Helper()
	return NewOn(t, baseDSN())
}

// baseDSN is the server the tests use: ALLOT_TEST_MYSQL_DSN, else
// DefaultDSN.
func baseDSN() string {
	if base := os.Getenv("ALLOT_TEST_MYSQL_DSN"); base != "" {
		return base
	}
	return DefaultDSN
}

// NewOn creates, migrates and returns a database for t on the server of
// base, a DSN whose database name is ignored.
func NewOn(t testing.TB, base string) *DB {
	t.Helper()
	return create(t, base, true)
}

// NewEmpty creates and returns a database for t, like New, but without
// migrating it: for tests of the migration step itself.
func NewEmpty(t testing.TB) *DB {
	t.Helper()
	return create(t, baseDSN(), false)
}

// NewEmptyOn is NewEmpty on the server of base (a DSN of Servers).
func NewEmptyOn(t testing.TB, base string) *DB {
	t.Helper()
	return create(t, base, false)
}

func create(t testing.TB, base string, migrate bool) *DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(base)
	if err != nil {
		t.Fatalf("dbtest: parse ALLOT_TEST_MYSQL_DSN: %v", err)
	}
	var b [6]byte
	rand.Read(b[:])
	cfg.DBName = "allot_test_" + hex.EncodeToString(b[:])
	cfg.ParseTime = true
	dsn := cfg.FormatDSN()
	ctx := context.Background()
	if err := store.EnsureDatabase(ctx, dsn); err != nil {
		t.Fatalf("dbtest: MariaDB/MySQL must run at %s for the tests: %v", cfg.Addr, err)
	}
	db, err := store.Open(ctx, dsn, 8)
	if err != nil {
		t.Fatalf("dbtest: open: %v", err)
	}
	t.Cleanup(func() {
		db.Close()
		// On a connection of its own: a test may have closed db (to play
		// an unreachable MySQL), and the database must go all the same.
		if _, err := store.DropDatabase(context.Background(), dsn); err != nil {
			t.Logf("dbtest: drop %s: %v", cfg.DBName, err)
		}
	})
	if migrate {
		if err := schema.Migrate(ctx, db); err != nil {
			t.Fatalf("dbtest: migrate: %v", err)
		}
	}
	return &DB{DB: db, DSN: dsn, Name: cfg.DBName}
}

// Count runs a COUNT(*)-style query and returns its single integer.
func (d *DB) Count(t testing.TB, query string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := d.QueryRowContext(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("dbtest: %s: %v", query, err)
	}
	return n
}

// CheckInvariants asserts the invariants (docs/architecture.md) over every activity in
// the database. Some are the code's to keep, and only these checks can catch
// the code breaking them:
//  1. confirmed_count equals the number of CONFIRMED and HELD rows,
//     waiting_count the number of WAITING rows, and the waitlist buckets
//     cover the WAITING rows exactly (waitlist.BucketSize);
//  2. no WAITING row exists while a seat is free;
//  3. waiters are promoted in queue_seq order: no CONFIRMED row has a larger
//     queue_seq than a WAITING one (it would have jumped the queue, or taken
//     a seat while someone waited);
//  4. one result per place (stream sequence, index in its batch) across
//     partitions (the primary key is (partition_id, seq, batch_index), so
//     two partitions could each hold one);
//  5. no effect applied twice (Effects: the signup history, the counters
//     and the rows against the results' events).
//
// The others restate the schema's constraints, which MySQL enforces on every
// write; they are kept as a check that the constraints exist (a migration
// dropping one would otherwise go unnoticed), not as a check of the code:
// confirmed_count between 0 and capacity (chk_activity_confirmed),
// waitlist_version not negative (chk_activity_waitlist_version), one
// result per request (uk_processed_request), one signup row per user and
// activity (uk_activity_user).
func (d *DB) CheckInvariants(t testing.TB) {
	t.Helper()
	checks := []struct{ name, query string }{
		// The code's.
		{"confirmed_count = CONFIRMED and HELD rows", `SELECT COUNT(*) FROM activity a WHERE a.confirmed_count <>
			(SELECT COUNT(*) FROM activity_signup s WHERE s.activity_id = a.id AND s.status IN ('CONFIRMED', 'HELD'))`},
		{"held_count = HELD rows", `SELECT COUNT(*) FROM activity a WHERE a.held_count <>
			(SELECT COUNT(*) FROM activity_signup s WHERE s.activity_id = a.id AND s.status = 'HELD')`},
		{"no WAITING while a seat is free", `SELECT COUNT(*) FROM activity a WHERE a.confirmed_count < a.capacity AND EXISTS
			(SELECT 1 FROM activity_signup s WHERE s.activity_id = a.id AND s.status = 'WAITING')`},
		{"promotion in queue_seq order", `SELECT COUNT(*) FROM activity_signup c WHERE c.status IN ('CONFIRMED', 'HELD') AND c.queue_seq >
			(SELECT MIN(w.queue_seq) FROM activity_signup w WHERE w.activity_id = c.activity_id AND w.status = 'WAITING')`},
		{"waiting_count = WAITING rows", `SELECT COUNT(*) FROM activity a WHERE a.waiting_count <>
			(SELECT COUNT(*) FROM activity_signup s WHERE s.activity_id = a.id AND s.status = 'WAITING')`},
		{"every WAITING row in a waitlist bucket", `SELECT COUNT(*) FROM activity_signup s WHERE s.status = 'WAITING' AND NOT EXISTS
			(SELECT 1 FROM waitlist_bucket b WHERE b.activity_id = s.activity_id AND b.first_seq <= s.queue_seq)`},
		{"a waitlist bucket counts the WAITING rows it covers, at least one", `SELECT COUNT(*) FROM (SELECT activity_id, first_seq, waiting,
			LEAD(first_seq) OVER (PARTITION BY activity_id ORDER BY first_seq) AS next_first FROM waitlist_bucket) b
			WHERE b.waiting < 1 OR b.waiting <> (SELECT COUNT(*) FROM activity_signup s WHERE s.activity_id = b.activity_id
			AND s.status = 'WAITING' AND s.queue_seq >= b.first_seq AND (b.next_first IS NULL OR s.queue_seq < b.next_first))`},
		{"one result per place", `SELECT COUNT(*) - COUNT(DISTINCT seq, batch_index) FROM processed_request`},
		{"a void changes nothing: REJECTED, no activity, no events", `SELECT COUNT(*) FROM processed_request WHERE op = 'void' AND
			(outcome <> 'REJECTED' OR activity_id <> 0 OR COALESCE(events, '') <> '' OR status IS NOT NULL)`},
		// The database's: schema constraints, checked as present.
		{"confirmed_count <= capacity (chk_activity_confirmed)", `SELECT COUNT(*) FROM activity WHERE confirmed_count > capacity OR confirmed_count < 0`},
		{"waitlist_version >= 0 (chk_activity_waitlist_version)", `SELECT COUNT(*) FROM activity WHERE waitlist_version < 0`},
		{"one result per request (uk_processed_request)", `SELECT COUNT(*) - COUNT(DISTINCT request_id) FROM processed_request`},
		{"one signup row per user (uk_activity_user)", `SELECT COUNT(*) FROM (SELECT activity_id, user_id FROM activity_signup
			GROUP BY activity_id, user_id HAVING COUNT(*) > 1) x`},
	}
	for _, c := range checks {
		if n := d.Count(t, c.query); n != 0 {
			t.Errorf("invariant %q broken: %d offending rows", c.name, n)
		}
	}
	d.CheckEffects(t)
}
