package store_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// TestEveryConnectionIsStrict: a value that does not fit is an error on
// every connection of the pool, never a silent cut.
func TestEveryConnectionIsStrict(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	var conns []*sql.Conn
	for range 3 {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	for i, c := range conns {
		var mode string
		if err := c.QueryRowContext(ctx, "SELECT @@SESSION.sql_mode").Scan(&mode); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(mode, "STRICT_ALL_TABLES") {
			t.Errorf("connection %d: sql_mode %q, want STRICT_ALL_TABLES", i, mode)
		}
		_, err := c.ExecContext(ctx, "INSERT INTO rejected_message (seq, subject, reason, rejected_at) VALUES (?, ?, 'r', NOW(6))",
			i+1, strings.Repeat("x", 300))
		if err == nil || !store.Rejectable(err) {
			t.Errorf("connection %d: a 300-character subject in VARCHAR(255): %v, want a data error", i, err)
		}
	}
}

// TestResultLargerThanAPacket: one request's result, whose promoted list
// and events together are larger than the server's max_allowed_packet (a
// resize that promotes a million waiters), is recorded whole and reads
// back whole.
func TestResultLargerThanAPacket(t *testing.T) {
	if testing.Short() {
		t.Skip("writes tens of megabytes")
	}
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	var packet int
	if err := db.QueryRow("SELECT @@max_allowed_packet").Scan(&packet); err != nil {
		t.Fatal(err)
	}
	const n = 1_000_000
	ids := make([]int64, n)
	events := []allocation.Event{{Kind: wire.EventResized}}
	for i := range ids {
		ids[i] = int64(1_000_000 + i)
		events = append(events, allocation.Event{Kind: wire.EventPromoted, UserID: ids[i]})
	}
	encoded := store.EncodeEvents(events)
	promoted, _ := json.Marshal(ids)
	if size := len(encoded) + len(promoted); size <= packet {
		t.Fatalf("the result is %d bytes, not more than max_allowed_packet (%d): the test proves nothing", size, packet)
	}
	capacity := int64(n + 1)
	row := store.ResultRow{
		Result: wire.Result{RequestID: "01a22ef1-1297-7592-b831-fc9513c7c879", Seq: 7, Op: wire.OpOpen, ActivityID: 1,
			Outcome: wire.OutcomeResized, PromotedUserIDs: ids, Capacity: &capacity, AppliedAt: time.Now().UTC()},
		Events: encoded,
	}
	err := store.WithTx(ctx, db.DB, store.TxOptions{}, func(tx *sql.Tx) error {
		return store.InsertResults(ctx, tx, []store.ResultRow{row}, 0)
	})
	if err != nil {
		t.Fatalf("insert a %d-byte result: %v", len(encoded)+len(promoted), err)
	}
	got, ok, err := store.GetResult(ctx, db, row.RequestID)
	if err != nil || !ok {
		t.Fatalf("read it back: found %v, err %v", ok, err)
	}
	if !slices.Equal(got.PromotedUserIDs, ids) {
		t.Fatalf("read back %d promoted users, want the %d written", len(got.PromotedUserIDs), n)
	}
	var head string
	var parts int
	if err := db.QueryRow("SELECT events, event_parts FROM processed_request WHERE seq = 7").Scan(&head, &parts); err != nil {
		t.Fatal(err)
	}
	if parts == 0 {
		t.Fatal("events stored without pieces")
	}
	whole, err := store.WholeValue(ctx, db, 0, 7, 0, store.ColEvents, head)
	if err != nil {
		t.Fatal(err)
	}
	if whole != encoded {
		t.Fatalf("events read back are %d bytes, want the %d written", len(whole), len(encoded))
	}
	// Every piece's first_event is the index of its first event.
	rows, err := db.Query("SELECT data, first_event FROM processed_request_part WHERE seq = 7 AND col = 'e' ORDER BY piece")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var data string
		var first int
		if err := rows.Scan(&data, &first); err != nil {
			t.Fatal(err)
		}
		evs, err := store.DecodeEvents(data)
		if err != nil || evs[0] != events[first] {
			t.Fatalf("piece starting at event %d decodes to %v (err %v), want %v first", first, evs[:1], err, events[first])
		}
	}
}
