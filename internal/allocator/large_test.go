package allocator

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// publishAll stores reqs in order, pipelined, and returns the last stream
// sequence.
func (e *env) publishAll(reqs []wire.Request) uint64 {
	e.t.Helper()
	futures := make([]jetstream.PubAckFuture, 0, len(reqs))
	for _, r := range reqs {
		b, err := json.Marshal(r)
		if err != nil {
			e.t.Fatal(err)
		}
		f, err := e.js.PublishAsync(wire.RequestSubject(r.ActivityID), b, jetstream.WithMsgID(r.RequestID))
		if err != nil {
			e.t.Fatal(err)
		}
		futures = append(futures, f)
	}
	var last uint64
	for _, f := range futures {
		select {
		case ack := <-f.Ok():
			last = max(last, ack.Sequence)
		case err := <-f.Err():
			e.t.Fatal(err)
		case <-time.After(20 * time.Second):
			e.t.Fatal("no PubAck within 20s")
		}
	}
	return last
}

// promotedEvents waits until ALLOT_EVENTS holds want promoted events of
// activity and returns them in stream order.
func (e *env) promotedEvents(activity int64, want int) []wire.Event {
	e.t.Helper()
	ctx := context.Background()
	cons, err := e.js.OrderedConsumer(ctx, wire.EventStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{wire.EventSubject(activity, wire.EventPromoted)},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []wire.Event
	deadline := time.Now().Add(60 * time.Second)
	for len(out) < want {
		if time.Now().After(deadline) {
			e.t.Fatalf("%d promoted events relayed within 60s, want %d", len(out), want)
		}
		batch, err := cons.FetchNoWait(1000)
		if err != nil {
			e.t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			var ev wire.Event
			if err := json.Unmarshal(m.Data(), &ev); err != nil {
				e.t.Fatal(err)
			}
			out = append(out, ev)
			n++
		}
		if n == 0 {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return out
}

// checkResize checks that the resize of activity (capacity 1, then
// joiners joined in user order 1..joiners) promoted every waiter: the
// result reads back whole, every promoted event is relayed once with the
// event id of its place in the list, nothing was skipped, the audit agrees.
func checkResize(t *testing.T, e *env, a *Allocator, activity int64, resize wire.Request, joiners int) {
	t.Helper()
	res := e.result(resize.RequestID)
	if res.Outcome != wire.OutcomeResized || len(res.PromotedUserIDs) != joiners-1 {
		t.Fatalf("resize: outcome %s with %d promoted, want RESIZED with %d", res.Outcome, len(res.PromotedUserIDs), joiners-1)
	}
	for i, u := range res.PromotedUserIDs {
		if u != int64(i+2) {
			t.Fatalf("promoted[%d] = user %d, want %d (queue order)", i, u, i+2)
		}
	}
	evs := e.promotedEvents(activity, joiners-1)
	if len(evs) != joiners-1 {
		t.Fatalf("%d promoted events, want %d", len(evs), joiners-1)
	}
	ids := make(map[string]bool, len(evs))
	for i, ev := range evs {
		if ev.UserID != int64(i+2) || ev.RequestID != resize.RequestID || ids[ev.EventID] {
			t.Fatalf("promoted event %d: %+v, want user %d of request %s, a new event id", i, ev, i+2, resize.RequestID)
		}
		ids[ev.EventID] = true
	}
	// Event ids follow the events' order in the decision (the resized
	// event first), however the list was stored.
	if want := wire.EventID(resize.RequestID, 1); evs[0].EventID != want {
		t.Errorf("first promoted event id %s, want %s", evs[0].EventID, want)
	}
	if want := wire.EventID(resize.RequestID, joiners-1); evs[len(evs)-1].EventID != want {
		t.Errorf("last promoted event id %s, want %s", evs[len(evs)-1].EventID, want)
	}
	if n := testutil.ToFloat64(a.relay.BadEntries()); n != 0 {
		t.Errorf("relay counted %v bad outbox entries, want 0", n)
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM outbox_skipped"); n != 0 {
		t.Errorf("%d outbox entries skipped, want 0", n)
	}
	e.db.CheckInvariants(t)
	rep, err := audit.Run(context.Background(), audit.Config{}, audit.Deps{DB: e.db.DB, JS: e.js})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK {
		var lines []string
		for _, d := range rep.Divergences[:min(len(rep.Divergences), 10)] {
			lines = append(lines, d.String())
		}
		t.Fatalf("audit found %d divergences:\n%s", len(rep.Divergences), strings.Join(lines, "\n"))
	}
}

// TestHugeResizeIsAppliedRelayedAndPollable: capacity
// 1, 5,001 joins, then a resize to 6,000. The result's promoted list
// (about 30 KB) and its events (about 80 KB, past a TEXT column) were cut
// by INSERT IGNORE, and the relay stopped on the cut entry for good.
func TestHugeResizeIsAppliedRelayedAndPollable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const joiners = 5001
	reqs := []wire.Request{open(1, 1)}
	for u := range int64(joiners) {
		reqs = append(reqs, req(wire.OpJoin, 1, u+1))
	}
	resize := open(1, 6000)
	reqs = append(reqs, resize)
	last := e.publishAll(reqs)
	a := e.start(conf(nil), TestHooks{})
	e.waitFence(last)
	checkResize(t, e, a, 1, resize, joiners)
}

// TestResizeStoredInPieces: a result whose promoted list and events are
// longer than a piece (here 256 bytes; by default up to 1 MiB, an eighth
// of the statement budget taken from max_allowed_packet) is stored in
// pieces and read back and relayed whole, one piece per relay pass.
func TestResizeStoredInPieces(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const joiners = 400
	reqs := []wire.Request{open(1, 1)}
	for u := range int64(joiners) {
		reqs = append(reqs, req(wire.OpJoin, 1, u+1))
	}
	resize := open(1, 1000)
	reqs = append(reqs, resize, req(wire.OpJoin, 1, 5000))
	last := e.publishAll(reqs)
	a := e.start(conf(nil), TestHooks{PieceBytes: 256})
	e.waitFence(last)
	var promotedParts, eventParts int
	if err := e.db.QueryRow("SELECT promoted_parts, event_parts FROM processed_request WHERE request_id = ?", resize.RequestID).
		Scan(&promotedParts, &eventParts); err != nil {
		t.Fatal(err)
	}
	if promotedParts < 5 || eventParts < 10 {
		t.Fatalf("resize stored with %d promoted and %d event pieces beyond its row, want several of each", promotedParts, eventParts)
	}
	checkResize(t, e, a, 1, resize, joiners)
	// The request after the pieces is relayed too.
	var cursor store.RelayCursor
	deadline := time.Now().Add(20 * time.Second)
	for cursor.Seq < last {
		if time.Now().After(deadline) {
			t.Fatalf("relay cursor at %+v, want seq %d", cursor, last)
		}
		time.Sleep(20 * time.Millisecond)
		var err error
		if cursor, err = store.ReadRelay(context.Background(), e.db, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMillionPromotions is the extreme: one resize promotes
// 1,000,000 waiters. The waitlist is written to MySQL directly (a million
// joins through the stream take minutes), the stream starts where it
// would after them, and the resize goes through the allocator: applied,
// pollable whole, every promoted event relayed. It takes minutes, so it
// runs only with ALLOT_TEST_MILLION=1.
func TestMillionPromotions(t *testing.T) {
	if os.Getenv("ALLOT_TEST_MILLION") == "" {
		t.Skip("set ALLOT_TEST_MILLION=1 to promote a million waiters (minutes)")
	}
	e := newEnv(t)
	ctx := context.Background()
	const waiters = 1_000_000
	start := time.Now()
	signups := make([]store.SignupRow, 0, waiters+1)
	signups = append(signups, store.SignupRow{ActivityID: 1, UserID: 1, Status: wire.StatusConfirmed, QueueSeq: wire.Place(1, 0)})
	for u := range int64(waiters) {
		signups = append(signups, store.SignupRow{ActivityID: 1, UserID: u + 2, Status: wire.StatusWaiting, QueueSeq: wire.Place(uint64(u+2), 0)})
	}
	next := uint64(waiters + 2) // the stream sequence after the joins; next_seq is a place
	err := store.WithTx(ctx, e.db.DB, store.TxOptions{}, func(tx *sql.Tx) error {
		if err := store.UpsertActivities(ctx, tx, []store.ActivityRow{{ID: 1, Capacity: 1, Confirmed: 1, NextSeq: wire.Place(next-1, 0) + 1, Waiting: waiters}}); err != nil {
			return err
		}
		if err := store.UpsertSignups(ctx, tx, signups); err != nil {
			return err
		}
		if err := store.EnsurePartition(ctx, tx, 0, 1); err != nil {
			return err
		}
		return store.SetPartition(ctx, tx, 0, next-1)
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := e.js.Stream(ctx, wire.RequestStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSequence(next)); err != nil { // the next message is seq next
		t.Fatal(err)
	}
	t.Logf("seeded %d waiters in %s", waiters, time.Since(start).Round(time.Millisecond))

	resize := open(1, waiters+1)
	start = time.Now()
	seq := e.publish(resize, "")
	if seq != next {
		t.Fatalf("resize stored at seq %d, want %d", seq, next)
	}
	a := e.start(conf(nil), TestHooks{})
	e.waitFenceWithin(seq, 5*time.Minute)
	t.Logf("applied in %s", time.Since(start).Round(time.Millisecond))
	res := e.result(resize.RequestID)
	if len(res.PromotedUserIDs) != waiters || res.PromotedUserIDs[0] != 2 || res.PromotedUserIDs[waiters-1] != waiters+1 {
		t.Fatalf("result lists %d promoted, want %d in queue order", len(res.PromotedUserIDs), waiters)
	}
	var pParts, eParts int
	if err := e.db.QueryRow("SELECT promoted_parts, event_parts FROM processed_request WHERE seq = ?", seq).Scan(&pParts, &eParts); err != nil {
		t.Fatal(err)
	}
	t.Logf("result stored in %d + %d pieces beyond its row", pParts, eParts)
	deadline := time.Now().Add(10 * time.Minute)
	for {
		info, err := e.js.Stream(ctx, wire.EventStream)
		if err != nil {
			t.Fatal(err)
		}
		si, err := info.Info(ctx, jetstream.WithSubjectFilter(wire.EventSubject(1, wire.EventPromoted)))
		if err != nil {
			t.Fatal(err)
		}
		if n := si.State.Subjects[wire.EventSubject(1, wire.EventPromoted)]; n == waiters {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("%d promoted events relayed within 10 minutes, want %d", n, waiters)
		}
		time.Sleep(time.Second)
	}
	t.Logf("applied and relayed in %s", time.Since(start).Round(time.Millisecond))
	if n := testutil.ToFloat64(a.relay.BadEntries()); n != 0 {
		t.Errorf("relay counted %v bad outbox entries, want 0", n)
	}
	e.db.CheckInvariants(t)
}
