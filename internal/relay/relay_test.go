package relay

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/internal/wire"
)

// env is a migrated database and a JetStream server with the streams.
type env struct {
	t  *testing.T
	db *dbtest.DB
	js jetstream.JetStream
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ns := natstest.New(t)
	ns.Setup(t, natstest.Config(1))
	_, js := ns.Connect(t)
	return &env{t: t, db: dbtest.New(t), js: js}
}

// outbox writes the result rows of partition 0 that carry events (an
// open of activity 1 each), as the allocator's transaction writes them.
func (e *env) outbox(ids, events []string) {
	e.t.Helper()
	for i := range ids {
		if _, err := e.db.Exec("INSERT INTO processed_request (partition_id, seq, request_id, op, activity_id, user_id, outcome, events, applied_at) "+
			"VALUES (0, ?, ?, 'open', 1, 0, 'RESIZED', ?, NOW(6))", i+1, ids[i], events[i]); err != nil {
			e.t.Fatal(err)
		}
	}
}

// run runs r until the test ends.
func run(t *testing.T, r *Relay) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx) //nolint:errcheck // it returns nil
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// promoted waits until ALLOT_EVENTS holds want promoted events of
// activity 1 and returns them in stream order.
func (e *env) promoted(want int) []wire.Event {
	e.t.Helper()
	ctx := context.Background()
	cons, err := e.js.OrderedConsumer(ctx, wire.EventStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{wire.EventSubject(1, wire.EventPromoted)},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []wire.Event
	testenv.WaitFor(e.t, 30*time.Second, fmt.Sprintf("%d promoted events", want), func() bool {
		batch, err := cons.FetchNoWait(100)
		if err != nil {
			e.t.Fatal(err)
		}
		for m := range batch.Messages() {
			var ev wire.Event
			if err := json.Unmarshal(m.Data(), &ev); err != nil {
				e.t.Fatal(err)
			}
			out = append(out, ev)
		}
		return len(out) >= want
	})
	return out
}

// TestRelaySkipsAnEntryItCannotRead: an outbox entry the relay cannot read
// (an event list cut short, as INSERT IGNORE used to leave it) stopped the
// partition's relay for good. Now its readable events are relayed, the
// rest is counted, logged and recorded in outbox_skipped, and the requests
// after it are relayed as usual.
func TestRelaySkipsAnEntryItCannotRead(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := []string{"01a22ef1-1297-7592-b831-fc9513c7c801", "01a22ef1-1297-7592-b831-fc9513c7c802"}
	e.outbox(ids, []string{"resized:0;promoted:5;promoted:6;promo", "promoted:7"})
	r := New(Deps{DB: e.db.DB, JS: e.js, Log: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()})
	run(t, r)
	evs := e.promoted(3)
	for i, want := range []struct {
		user int64
		id   string
	}{{5, wire.EventID(ids[0], 1)}, {6, wire.EventID(ids[0], 2)}, {7, wire.EventID(ids[1], 0)}} {
		if evs[i].UserID != want.user || evs[i].EventID != want.id {
			t.Errorf("promoted event %d: user %d id %s, want user %d id %s", i, evs[i].UserID, evs[i].EventID, want.user, want.id)
		}
	}
	// Recorded once the cursor has passed the entry, just after the publish.
	testenv.WaitFor(t, 10*time.Second, "the entry recorded", func() bool {
		return e.db.Count(t, "SELECT COUNT(*) FROM outbox_skipped") > 0
	})
	if n := testutil.ToFloat64(r.BadEntries()); n != 1 {
		t.Errorf("bad outbox entries counted: %v, want 1", n)
	}
	var seq uint64
	var reason string
	if err := e.db.QueryRow("SELECT seq, reason FROM outbox_skipped").Scan(&seq, &reason); err != nil || seq != 1 || !strings.Contains(reason, `"promo"`) {
		t.Errorf("outbox_skipped: seq %d reason %q (err %v), want seq 1 naming the entry \"promo\"", seq, reason, err)
	}
}

// TestRelayHoldsNoLockWhileAwaitingAcks: the relay used to publish inside
// the transaction that locked its cursor row, so a slow broker held a row
// lock and a pooled connection for up to 10s per pass. While its publishes
// await their PubAcks the cursor row must be free and the relay's pool
// idle.
func TestRelayHoldsNoLockWhileAwaitingAcks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	pool, err := store.Open(ctx, e.db.DSN, 4) // the relay's own pool, to count its connections
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	e.outbox([]string{"01a22ef1-1297-7592-b831-fc9513c7c803"}, []string{"promoted:5"})
	checked := make(chan error, 1)
	var once sync.Once
	r := New(Deps{DB: pool, JS: e.js, Log: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
		AwaitingAcks: func() { once.Do(func() { checked <- holdsNothing(ctx, e.db.DB, pool) }) }})
	run(t, r)
	select {
	case err := <-checked:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the relay published nothing within 20s")
	}
	e.promoted(1)
}

// holdsNothing checks that another transaction can lock the relay's
// cursor row at once and that pool has no connection in use.
func holdsNothing(ctx context.Context, other, pool *sql.DB) error {
	tx, err := other.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck
	var last uint64
	if err := tx.QueryRowContext(ctx, "SELECT last_seq FROM event_relay WHERE partition_id = 0 FOR UPDATE NOWAIT").Scan(&last); err != nil {
		return fmt.Errorf("the relay cursor is locked while publishes await their PubAcks: %w", err)
	}
	if n := pool.Stats().InUse; n > 0 {
		return fmt.Errorf("%d connections of the relay's pool in use while publishes await their PubAcks", n)
	}
	return nil
}

// TestRelayWalksPlaces: the requests of a batch share a stream sequence;
// the relay walks them in place order (seq, index), a request whose event
// list is stored in pieces among them, and its events carry their
// request's place.
func TestRelayWalksPlaces(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rows := []struct {
		seq   uint64
		index int
		id    string
		parts int
		ev    string
	}{
		{1, 0, "01a22ef1-1297-7592-b831-fc9513c7c811", 0, "promoted:5"},
		{1, 1, "01a22ef1-1297-7592-b831-fc9513c7c812", 1, "promoted:6"},
		{1, 2, "01a22ef1-1297-7592-b831-fc9513c7c813", 0, "promoted:8"},
		{2, 0, "01a22ef1-1297-7592-b831-fc9513c7c814", 0, "promoted:9"},
	}
	for _, r := range rows {
		if _, err := e.db.Exec("INSERT INTO processed_request (partition_id, seq, batch_index, request_id, op, activity_id, user_id, outcome, events, event_parts, applied_at) "+
			"VALUES (0, ?, ?, ?, 'open', 1, 0, 'RESIZED', ?, ?, NOW(6))", r.seq, r.index, r.id, r.ev, r.parts); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.db.Exec("INSERT INTO processed_request_part (partition_id, seq, batch_index, col, piece, first_event, data) VALUES (0, 1, 1, 'e', 1, 1, 'promoted:7')"); err != nil {
		t.Fatal(err)
	}
	run(t, New(Deps{DB: e.db.DB, JS: e.js, Log: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()}))
	evs := e.promoted(5)
	for i, want := range []struct {
		user  int64
		row   int
		event int
	}{{5, 0, 0}, {6, 1, 0}, {7, 1, 1}, {8, 2, 0}, {9, 3, 0}} {
		r := rows[want.row]
		if ev := evs[i]; ev.UserID != want.user || ev.Seq != r.seq || ev.Index != r.index || ev.EventID != wire.EventID(r.id, want.event) {
			t.Errorf("event %d: user %d at %d#%d id %s; want user %d at %d#%d id %s", i, ev.UserID, ev.Seq, ev.Index, ev.EventID,
				want.user, r.seq, r.index, wire.EventID(r.id, want.event))
		}
	}
	testenv.WaitFor(t, 10*time.Second, "the cursor at the last place", func() bool {
		c, err := store.ReadRelay(context.Background(), e.db, 0)
		return err == nil && c == store.RelayCursor{Seq: 2, Index: 0, Piece: 0}
	})
}

// TestFlushWakesOnlyForDueEvents: a commit that wrote events marks the
// relay due; the apply loop's Flush wakes it then, once, and not when no
// commit wrote events since.
func TestFlushWakesOnlyForDueEvents(t *testing.T) {
	r := New(Deps{Log: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()})
	r.Flush()
	if len(r.wake) != 0 {
		t.Fatal("Flush woke the relay with no events due")
	}
	r.Due()
	r.Due()
	r.Flush()
	if len(r.wake) != 1 {
		t.Fatal("Flush did not wake the relay for due events")
	}
	<-r.wake
	r.Flush()
	if len(r.wake) != 0 {
		t.Fatal("a second Flush woke the relay again for the same events")
	}
}
