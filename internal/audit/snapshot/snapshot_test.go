package snapshot_test

import (
	"context"
	"database/sql"
	"slices"
	"strconv"
	"testing"

	"github.com/allot-dev/allot/internal/audit/snapshot"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// TestResults: the cursor hands over every processed_request row after the
// given seq, in place order (seq, batch_index), across its pages (25,000
// rows are three), only the activities asked for when some are, and the
// rows of every partition once there are several; the fence is the highest
// last_seq; rejected_message rows are keyed by place.
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
	// and returns their places, checking their order.
	var walk2 func(after uint64, partitions []int, activities ...int64) []uint64
	walk := func(after uint64, activities ...int64) []uint64 {
		t.Helper()
		return walk2(after, nil, activities...)
	}
	walk2 = func(after uint64, partitions []int, activities ...int64) []uint64 {
		t.Helper()
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		c := snapshot.StartResults(ctx, tx, after, activities, partitions)
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
			if len(seqs) > 0 && r.Place() <= seqs[len(seqs)-1] {
				t.Fatalf("place %s after %s", wire.FormatPlace(r.Place()), wire.FormatPlace(seqs[len(seqs)-1]))
			}
			if r.Op != "join" || r.Outcome != "confirmed" || int64(r.Seq)+int64(r.Index) != r.UserID {
				t.Fatalf("row %s read as %+v", wire.FormatPlace(r.Place()), r)
			}
			seqs = append(seqs, r.Place())
			c.Next()
		}
	}
	p := func(seq uint64) uint64 { return wire.Place(seq, 0) }
	if got := walk(100); len(got) != rows-100 || got[0] != p(101) || got[len(got)-1] != p(rows) {
		t.Errorf("after 100: %d results (%v ... %v), want %d from 101 to %d", len(got), got[:1], got[len(got)-1:], rows-100, rows)
	}
	got := walk(0, 2)
	for _, place := range got {
		if wire.SeqOf(place)%3+1 != 2 {
			t.Fatalf("place %s is not of activity 2", wire.FormatPlace(place))
		}
	}
	if want := (rows + 2) / 3; len(got) != want { // i % 3 == 1: 1, 4, ..., 24997
		t.Errorf("activity 2: %d results, want %d", len(got), want)
	}

	// A second partition: its rows come in seq order with the first's.
	exec("INSERT INTO allocator_partition (partition_id, last_seq) VALUES (1, ?)", rows+2)
	exec("INSERT INTO processed_request (partition_id, seq, request_id, op, activity_id, user_id, outcome, applied_at) VALUES (1, ?, UUID(), 'join', 4, ?, 'confirmed', NOW(6))", rows+2, rows+2)
	if got := walk(rows - 1); len(got) != 2 || got[0] != p(rows) || got[1] != p(rows+2) {
		t.Errorf("two partitions, after %d: %v, want [%d %d]", rows-1, got, p(rows), p(rows+2))
	}

	// Of one partition only.
	if got := walk2(rows-1, []int{1}); len(got) != 1 || got[0] != p(rows+2) {
		t.Errorf("partition 1, after %d: %v, want [%d]", rows-1, got, p(rows+2))
	}
	if got := walk2(rows-1, []int{}); len(got) != 0 {
		t.Errorf("no partition: %v, want nothing", got)
	}

	// A batch: its requests' rows, stored out of order, come in index
	// order, after the rows of the messages before it, and a walk after
	// its message has none of them.
	for _, i := range []int{2, 0, 1} {
		exec("INSERT INTO processed_request (partition_id, seq, batch_index, request_id, op, activity_id, user_id, outcome, applied_at) "+
			"VALUES (1, ?, ?, UUID(), 'join', 4, ?, 'confirmed', NOW(6))", rows+3, i, rows+3+i)
	}
	if got := walk(rows + 1); !slices.Equal(got, []uint64{p(rows + 2), wire.Place(rows+3, 0), wire.Place(rows+3, 1), wire.Place(rows+3, 2)}) {
		t.Errorf("a batch after %d: %v, want its three rows after %d's", rows+1, got, rows+2)
	}
	if got := walk(rows + 3); len(got) != 0 {
		t.Errorf("after the batch's message: %v, want nothing", got)
	}
	exec("INSERT INTO rejected_message (seq, batch_index, subject, reason, rejected_at) VALUES (?, 3, 'alloc.req.4', 'bad request', NOW(6))", rows+3)

	// Long values of two requests of one batch: each is read whole from
	// its own pieces.
	long := rows + 4
	for i, ev := range []string{"promoted:1", "promoted:2"} {
		exec("INSERT INTO processed_request (partition_id, seq, batch_index, request_id, op, activity_id, user_id, outcome, events, event_parts, applied_at) "+
			"VALUES (1, ?, ?, UUID(), 'join', 4, ?, 'confirmed', ?, 1, NOW(6))", long, i, long+i, ev)
		exec("INSERT INTO processed_request_part (partition_id, seq, batch_index, col, piece, data) VALUES (1, ?, ?, ?, 1, ?)",
			long, i, store.ColEvents, "waitlisted:"+strconv.Itoa(10+i))
	}
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	c := snapshot.StartResults(ctx, tx, uint64(long-1), nil, nil)
	var events []string
	for {
		r, err := c.Peek()
		if err != nil {
			t.Fatal(err)
		}
		if r == nil {
			break
		}
		events = append(events, r.Events.String)
		c.Next()
	}
	c.Wait()
	tx.Rollback() //nolint:errcheck
	if want := []string{"promoted:1;waitlisted:10", "promoted:2;waitlisted:11"}; !slices.Equal(events, want) {
		t.Errorf("long events of a batch's requests: %q, want %q", events, want)
	}

	tx, err = db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if fence, err := snapshot.ReadFence(ctx, tx); err != nil || fence != rows+2 {
		t.Errorf("fence %d, %v; want %d", fence, err, rows+2)
	}
	if fences, err := snapshot.ReadFences(ctx, tx, true); err != nil || len(fences) != 2 || fences[0].LastSeq != rows || fences[1].LastSeq != rows+2 ||
		fences[1].Epoch.Int64 != 1 {
		t.Errorf("fences %+v, %v; want partition 0 at %d and 1 at %d, epoch 1", fences, err, rows, rows+2)
	}
	rej, err := snapshot.ReadRejected(ctx, tx)
	if r, ok := rej[p(rows+1)]; err != nil || len(rej) != 2 || !ok || r.Subject != "alloc.req.9" || r.Reason != "bad" || r.RequestID != "" {
		t.Errorf("rejected %+v, %v; want the message's row at (%d, 0)", rej, err, rows+1)
	}
	if r, ok := rej[wire.Place(rows+3, 3)]; !ok || r.Reason != "bad request" {
		t.Errorf("rejected %+v; want the batched request's row at (%d, 3)", rej, rows+3)
	}
}
