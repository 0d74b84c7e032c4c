package schema_test

import (
	"context"
	"io/fs"
	"sort"
	"strings"
	"testing"

	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/store/schema"
	"github.com/allot-dev/allot/internal/wire"
	"github.com/allot-dev/allot/migrations"
)

// migrateBefore applies the migrations named before first, as the
// version before them did, and records them.
func migrateBefore(t *testing.T, db *dbtest.DB, first string) {
	t.Helper()
	ctx := context.Background()
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(names)
	exec := func(q string) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`CREATE TABLE schema_migration (version VARCHAR(255) NOT NULL PRIMARY KEY,
		applied_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB`)
	for _, name := range names {
		if name >= first {
			break
		}
		body, err := fs.ReadFile(migrations.FS, name)
		if err != nil {
			t.Fatal(err)
		}
		var stmt strings.Builder
		for line := range strings.SplitSeq(string(body), "\n") {
			if l := strings.TrimSpace(line); l == "" || strings.HasPrefix(l, "--") {
				continue
			}
			stmt.WriteString(line + "\n")
			if strings.HasSuffix(strings.TrimSpace(line), ";") {
				exec(strings.TrimSuffix(strings.TrimSpace(stmt.String()), ";"))
				stmt.Reset()
			}
		}
		exec("INSERT INTO schema_migration (version) VALUES ('" + name + "')")
	}
}

// TestPlacesMigration: rows written before request batches (sequences
// where places are now) are shifted into places (seq, 0) by migration
// 0011, once: running the migrations again, even with their record lost,
// leaves them as they are. Old results get batch index 0, and the old
// checkpoints are gone.
func TestPlacesMigration(t *testing.T) {
	t.Parallel()
	db := dbtest.NewEmpty(t)
	ctx := context.Background()
	migrateBefore(t, db, "0011")
	for _, q := range []string{
		"INSERT INTO activity (id, capacity, confirmed_count, next_seq, hold_ns, held_count, waiting_count) VALUES (1, 1, 1, 8, 60000000000, 1, 1)",
		"INSERT INTO activity_signup (activity_id, user_id, status, queue_seq, held_until, hold_seq) VALUES (1, 10, 'HELD', 5, '2026-01-01 00:00:00', 5)",
		"INSERT INTO activity_signup (activity_id, user_id, status, queue_seq) VALUES (1, 11, 'WAITING', 7)",
		"INSERT INTO waitlist_bucket (activity_id, first_seq, waiting) VALUES (1, 5, 1)",
		"INSERT INTO processed_request (request_id, seq, op, activity_id, user_id, outcome, applied_at, partition_id) VALUES ('r5', 5, 'join', 1, 10, 'HELD', NOW(), 0)",
		"INSERT INTO rejected_message (seq, subject, reason, rejected_at) VALUES (6, 'alloc.req.1', 'bad', NOW())",
		"INSERT INTO event_relay (partition_id, last_seq) VALUES (0, 5)",
		"INSERT INTO allocator_checkpoint (partition_id, seq, partitions, activities, signups, digest, taken_at) VALUES (0, 7, 1, 1, 2, REPEAT('0', 64), NOW())",
		"INSERT INTO allocator_checkpoint_activity (partition_id, seq, activity_id, capacity, confirmed_count, next_seq) VALUES (0, 7, 1, 1, 1, 8)",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	check := func(when string) {
		t.Helper()
		for q, want := range map[string]uint64{
			"SELECT queue_seq FROM activity_signup WHERE user_id = 10":    wire.Place(5, 0),
			"SELECT hold_seq FROM activity_signup WHERE user_id = 10":     wire.Place(5, 0),
			"SELECT queue_seq FROM activity_signup WHERE user_id = 11":    wire.Place(7, 0),
			"SELECT next_seq FROM activity WHERE id = 1":                  wire.Place(7, 0) + 1,
			"SELECT first_seq FROM waitlist_bucket WHERE activity_id = 1": wire.Place(5, 0),
			"SELECT seq * 65536 + batch_index FROM processed_request":     wire.Place(5, 0),
			"SELECT seq * 65536 + batch_index FROM rejected_message":      wire.Place(6, 0),
			"SELECT last_seq * 65536 + last_index FROM event_relay":       wire.Place(5, 0),
			"SELECT COUNT(*) FROM allocator_checkpoint":                   0,
			"SELECT COUNT(*) FROM allocator_checkpoint_activity":          0,
		} {
			var got uint64
			if err := db.QueryRowContext(ctx, q).Scan(&got); err != nil {
				t.Fatalf("%s: %s: %v", when, q, err)
			}
			if got != want {
				t.Errorf("%s: %s = %d, want %d", when, q, got, want)
			}
		}
	}
	if err := schema.Migrate(ctx, db.DB); err != nil {
		t.Fatalf("migrate an old database: %v", err)
	}
	check("migrated")
	if err := schema.Migrate(ctx, db.DB); err != nil {
		t.Fatal(err)
	}
	check("migrated twice")
	if _, err := db.ExecContext(ctx, "DELETE FROM schema_migration WHERE version LIKE '0011%'"); err != nil {
		t.Fatal(err)
	}
	if err := schema.Migrate(ctx, db.DB); err != nil {
		t.Fatalf("migrate again with 0011's record lost: %v", err)
	}
	check("0011 run again")
	db.CheckInvariants(t)
}
