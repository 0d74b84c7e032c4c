package store_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// TestResultRoundTrip: what the allocator records is what a read gives
// back, the same value (and the same JSON) as the result it published:
// for every op and kind of outcome, applied_at and held_until in whole
// microseconds, a cancel's single promoted user and a resize's list, a
// reason, a void, and a message MySQL refused. The requests sit at places
// (seq, index) of batches of four, so a read gives back both.
func TestResultRoundTrip(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	// A clock reading with nanoseconds, off UTC: the result must not keep
	// either.
	now := time.Date(2026, 3, 1, 12, 0, 0, 987654321, time.FixedZone("CET", 3600))
	t0 := now.Add(-time.Hour)
	capacity := func(c int64) *int64 { return &c }
	const act = 1
	reqs := []wire.Request{
		{Op: wire.OpOpen, Capacity: capacity(2), Hold: wire.Duration(time.Minute)},
		{Op: wire.OpJoin, UserID: 1},                  // HELD
		{Op: wire.OpClaim, UserID: 2},                 // HELD
		{Op: wire.OpJoin, UserID: 3},                  // WAITING, position 1
		{Op: wire.OpJoin, UserID: 4},                  // WAITING, position 2
		{Op: wire.OpJoin, UserID: 5},                  // WAITING, position 3
		{Op: wire.OpClaim, UserID: 1},                 // ALREADY_OWNED, HELD
		{Op: wire.OpClaim, UserID: 9},                 // SOLD_OUT
		{Op: wire.OpClaim, UserID: 4},                 // ALREADY_WAITING
		{Op: wire.OpConfirm, UserID: 1},               // CONFIRMED
		{Op: wire.OpCancel, UserID: 1},                // CANCELLED, promotes 3 (held)
		{Op: wire.OpCancel, UserID: 8},                // NOT_SIGNED_UP
		{Op: wire.OpOpen, Capacity: capacity(4)},      // RESIZED, promotes 4 and 5
		{Op: wire.OpOpen, Capacity: capacity(1)},      // REJECTED, with a reason
		{Op: wire.OpExpire, UserID: 2, HoldSeq: 3},    // EXPIRED (received after the hold of request 3)
		{Op: wire.OpConfirm, UserID: 4},               // CONFIRMED
		{Op: wire.OpJoin, UserID: 6},                  // CONFIRMED (no hold since the resize)
		{Op: wire.OpExpire, UserID: 6, HoldSeq: 17},   // NOT_HELD (request 17 held nothing)
		{Op: wire.OpVoid, UserID: 7},                  // REJECTED, never stored
		{Op: "a-long-op", ActivityID: act, UserID: 9}, // refused by MySQL
	}
	var (
		a       *allocation.Activity
		rows    []store.ResultRow
		want    = map[string]wire.Result{}
		refused []store.RejectedRow
	)
	// placeOf is the place of the request at index i of reqs.
	placeOf := func(i int) uint64 { return wire.Place(uint64(i/4+1), i%4) }
	for i, req := range reqs {
		seq := placeOf(i)
		if req.Op == wire.OpExpire { // HoldSeq above numbers the request that held
			hold := placeOf(int(req.HoldSeq) - 1)
			req.HoldSeq, req.HoldIndex = wire.SeqOf(hold), wire.IndexOf(hold)
		}
		req.RequestID = uuid.NewString()
		req.ReceivedAt = t0.Add(time.Duration(i) * time.Millisecond)
		if req.Op == wire.OpExpire && req.UserID == 2 {
			req.ReceivedAt = t0.Add(2 * time.Minute)
		}
		switch req.Op {
		case wire.OpVoid:
			res := allocation.VoidResult(req, 100, now) // a void is a message of its own
			rows = append(rows, store.ResultRow{Result: res})
			want[req.RequestID] = res
			continue
		case "a-long-op":
			row := store.RejectedRow{Seq: wire.SeqOf(seq), Index: wire.IndexOf(seq), Subject: wire.RequestSubject(act),
				Reason: "cannot be applied: " + strings.Repeat("é", 300) + "\xff", Request: req}
			res, ok := store.RefusedResult(row, now)
			if !ok {
				t.Fatal("a refused request with a valid id has no result")
			}
			refused = append(refused, row)
			want[req.RequestID] = res
			continue
		}
		req.ActivityID = act
		after, d, err := allocation.Apply(a, allocation.RequestOf(req), seq)
		if err != nil {
			t.Fatalf("request %d %+v: %v", seq, req, err)
		}
		a = after
		res := allocation.ResultOf(req, seq, d, after, now)
		rows = append(rows, store.ResultRow{Result: res, Events: store.EncodeEvents(d.Events)})
		want[req.RequestID] = res
	}
	// The scenario is what it says.
	outcomes := map[wire.Outcome]int{}
	for _, r := range want {
		outcomes[r.Outcome]++
		if r.AppliedAt != wire.Instant(now) {
			t.Fatalf("%s: applied_at %v, not the instant %v", r.Op, r.AppliedAt, wire.Instant(now))
		}
	}
	for _, o := range []wire.Outcome{wire.OutcomeHeld, wire.OutcomeWaiting, wire.OutcomeAlreadyOwned, wire.OutcomeSoldOut,
		wire.OutcomeAlreadyWaiting, wire.OutcomeConfirmed, wire.OutcomeCancelled, wire.OutcomeNotSignedUp, wire.OutcomeResized,
		wire.OutcomeRejected, wire.OutcomeExpired, wire.OutcomeNotHeld} {
		if outcomes[o] == 0 {
			t.Fatalf("the scenario has no %s result: %v", o, outcomes)
		}
	}
	err := store.WithTx(ctx, db.DB, store.TxOptions{}, func(tx *sql.Tx) error {
		if err := store.InsertResults(ctx, tx, rows, 0); err != nil {
			return err
		}
		return store.InsertRejected(ctx, tx, refused, now)
	})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 0, len(want))
	for id, w := range want {
		ids = append(ids, id)
		got, ok, err := store.GetResult(ctx, db, id)
		if err != nil || !ok {
			t.Fatalf("%s %s: found %v, %v", w.Op, w.Outcome, ok, err)
		}
		if !reflect.DeepEqual(got, w) {
			t.Errorf("%s %s: read back\n %+v\nrecorded\n %+v", w.Op, w.Outcome, got, w)
		}
		gb, _ := json.Marshal(got)
		wb, _ := json.Marshal(w)
		if string(gb) != string(wb) {
			t.Errorf("%s %s: read back %s, recorded %s", w.Op, w.Outcome, gb, wb)
		}
	}
	all, err := store.GetResults(ctx, db, ids)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(all, want) {
		for id, w := range want {
			if !reflect.DeepEqual(all[id], w) {
				t.Errorf("GetResults %s %s:\n %+v\nrecorded\n %+v", w.Op, w.Outcome, all[id], w)
			}
		}
	}
}
