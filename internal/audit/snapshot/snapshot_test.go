package snapshot_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/allot-dev/allot/internal/audit/snapshot"
	"github.com/allot-dev/allot/internal/dbtest"
)

// TestResults: the cursor hands over every processed_request row after the
// given seq, in seq order, across its pages (25,000 rows are three), only
// the activities asked for when some are, and the rows of every partition
// once there are several; the fence is the highest last_seq.
func TestResults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.New(t)
	const rows = 25_000
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec(`INSERT INTO processed_request (partition_id, seq, request_id, op, activity_id, user_id, outcome, applied_at)
		WITH d(x) AS (SELECT 0 UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4
			UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9),
		n(i) AS (SELECT 1 + a.x + 10*b.x + 100*c.x + 1000*e.x + 10000*f.x FROM d a, d b, d c, d e, d f)
		SELECT 0, i, UUID(), 'join', i % 3 + 1, i, 'confirmed', NOW(6) FROM n WHERE i <= ?`, rows)
	exec("INSERT INTO allocator_partition (partition_id, last_seq) VALUES (0, ?)", rows)
	exec("INSERT INTO rejected_message (seq, subject, reason, rejected_at) VALUES (?, 'alloc.req.9', 'bad', NOW(6))", rows+1)

	// walk reads the results after seq after (of activities) on a snapshot
	// and returns their seqs, checking their order.
	walk := func(after uint64, activities ...int64) []uint64 {
		t.Helper()
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		c := snapshot.StartResults(ctx, tx, after, activities)
		defer c.Wait()
		var seqs []uint64
		for {
			r, err := c.Peek()
			if err != nil {
				t.Fatal(err)
			}
			if r == nil {
				return seqs
			}
			if len(seqs) > 0 && r.Seq <= seqs[len(seqs)-1] {
				t.Fatalf("seq %d after %d", r.Seq, seqs[len(seqs)-1])
			}
			if r.Op != "join" || r.Outcome != "confirmed" || int64(r.Seq) != r.UserID {
				t.Fatalf("row %d read as %+v", r.Seq, r)
			}
			seqs = append(seqs, r.Seq)
			c.Next()
		}
	}
	if got := walk(100); len(got) != rows-100 || got[0] != 101 || got[len(got)-1] != rows {
		t.Errorf("after 100: %d results (%v ... %v), want %d from 101 to %d", len(got), got[:1], got[len(got)-1:], rows-100, rows)
	}
	got := walk(0, 2)
	for _, seq := range got {
		if seq%3+1 != 2 {
			t.Fatalf("seq %d is not of activity 2", seq)
		}
	}
	if want := (rows + 2) / 3; len(got) != want { // i % 3 == 1: 1, 4, ..., 24997
		t.Errorf("activity 2: %d results, want %d", len(got), want)
	}

	// A second partition: its rows come in seq order with the first's.
	exec("INSERT INTO allocator_partition (partition_id, last_seq) VALUES (1, ?)", rows+2)
	exec("INSERT INTO processed_request (partition_id, seq, request_id, op, activity_id, user_id, outcome, applied_at) VALUES (1, ?, UUID(), 'join', 4, ?, 'confirmed', NOW(6))", rows+2, rows+2)
	if got := walk(rows - 1); len(got) != 2 || got[0] != rows || got[1] != rows+2 {
		t.Errorf("two partitions, after %d: %v, want [%d %d]", rows-1, got, rows, rows+2)
	}

	tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if fence, err := snapshot.ReadFence(ctx, tx); err != nil || fence != rows+2 {
		t.Errorf("fence %d, %v; want %d", fence, err, rows+2)
	}
	rej, err := snapshot.ReadRejected(ctx, tx)
	if r, ok := rej[rows+1]; err != nil || len(rej) != 1 || !ok || r.Subject != "alloc.req.9" || r.Reason != "bad" || r.RequestID != "" {
		t.Errorf("rejected %+v, %v; want the one row", rej, err)
	}
}
