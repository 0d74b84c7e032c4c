// Package relay publishes the outbox: the events each committed request
// caused, written with its result row in the allocator's transaction, go
// to ALLOT_EVENTS (and the expiries of the holds they gave to
// ALLOT_HOLDS), behind a cursor per partition.
package relay

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// Relay publishes the events of committed requests to ALLOT_EVENTS. The
// outbox is processed_request itself: each row carries the events its
// request caused, written in the business transaction. The relay walks a
// partition's rows in place order (seq, batch index) behind a cursor (event_relay), publishes
// with Nats-Msg-Id = event_id, and moves the cursor once JetStream has
// acknowledged every event, holding no lock or connection meanwhile. After
// a crash it resumes at the cursor; events published but not yet covered
// by the cursor are published again with the same derived event_id, which
// the stream's duplicate window and consumers' dedupe by event_id absorb.
type Relay struct {
	db        *sql.DB
	js        jetstream.JetStream
	log       *slog.Logger
	m         metrics
	partition int
	wake      chan struct{}
	batch     int
	period    time.Duration
	// awaitingAcks, when set, runs while a pass's publishes await their
	// PubAcks: a test's look at what the relay holds then.
	awaitingAcks func()
	// warnedAtomic marks the streams the relay said once do not take
	// atomic batches.
	warnedAtomic map[string]bool
	book         traceBook // decision spans of traced requests (trace.go)
	// due says a commit wrote events the relay was not woken for yet
	// (Due, Flush).
	due atomic.Bool
}

// Deps is what a relay works with.
type Deps struct {
	DB  *sql.DB
	JS  jetstream.JetStream
	Log *slog.Logger
	// Registerer takes the relay's metrics (labelled by the caller).
	Registerer prometheus.Registerer
	Partition  int
	// AwaitingAcks, when set, runs while a pass's publishes await their
	// PubAcks (tests only).
	AwaitingAcks func()
	// Period is how often the relay passes unwoken (0: every second).
	Period time.Duration
}

type metrics struct {
	eventsPublished prometheus.Counter
	holdsScheduled  prometheus.Counter
	badEntries      prometheus.Counter
}

// New returns the relay of d.Partition; Run runs it.
func New(d Deps) *Relay {
	f := promauto.With(d.Registerer)
	m := metrics{
		eventsPublished: f.NewCounter(prometheus.CounterOpts{
			Name: "allot_allocator_events_published_total", Help: "Outbox events relayed to ALLOT_EVENTS.",
		}),
		holdsScheduled: f.NewCounter(prometheus.CounterOpts{
			Name: "allot_allocator_holds_scheduled_total", Help: "Hold expiries scheduled in ALLOT_HOLDS by the outbox relay.",
		}),
		badEntries: f.NewCounter(prometheus.CounterOpts{
			Name: "allot_allocator_outbox_bad_entries_total",
			Help: "Outbox entries the relay could not read and skipped (recorded in outbox_skipped).",
		}),
	}
	return &Relay{db: d.DB, js: d.JS, log: d.Log, m: m, partition: d.Partition,
		wake: make(chan struct{}, 1), batch: 2000, period: cmp.Or(d.Period, time.Second),
		awaitingAcks: d.AwaitingAcks, warnedAtomic: make(map[string]bool)}
}

// BadEntries is how many outbox entries the relay skipped (tests).
func (r *Relay) BadEntries() prometheus.Counter { return r.m.badEntries }

// Due notes that a commit wrote events; Flush wakes the relay for them.
// The allocator flushes when its apply loop has no request in hand, so the
// relay's reads and publishes do not compete with a backlog being
// applied (a drain runs about a sixth faster on two cores); meanwhile the
// relay still passes every second.
func (r *Relay) Due() { r.due.Store(true) }

// Flush wakes the relay if a commit wrote events since the last Flush.
func (r *Relay) Flush() {
	if r.due.Swap(false) {
		r.Kick()
	}
}

// Kick asks the relay to look at the outbox now.
func (r *Relay) Kick() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run relays until ctx ends, then makes a last pass (bounded) over what
// the last batches committed: the allocator ends it only once its apply
// loop has stopped. It returns nil.
func (r *Relay) Run(ctx context.Context) error {
	if err := store.EnsureRelay(ctx, r.db, r.partition); err != nil {
		r.log.ErrorContext(ctx, "outbox relay", slog.Any("err", err))
	}
	tick := time.NewTicker(r.period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			// Relay what the last batches committed before exiting.
			r.drain(context.WithoutCancel(ctx), 3*time.Second)
			return nil
		case <-r.wake:
		case <-tick.C:
		}
		r.drain(ctx, 0)
	}
}

// drain relays until the outbox is empty, an error occurs or limit passes.
func (r *Relay) drain(ctx context.Context, limit time.Duration) {
	if limit > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, limit)
		defer cancel()
	}
	for ctx.Err() == nil {
		more, err := r.once(ctx)
		if err != nil {
			r.log.WarnContext(ctx, "outbox relay", slog.Any("err", err))
			return
		}
		if !more {
			return
		}
	}
}

// relayBytes bounds the events one pass reads, relayWindow how many
// publishes await their PubAck at a time.
const (
	relayBytes  = 4 << 20
	relayWindow = 1000
)

// once relays one chunk; more reports whether there may be more to relay.
//
// It holds no lock and no connection while it waits for PubAcks: it reads
// the cursor and the outbox, publishes, and then moves the cursor only if
// it is still where it was read (store.AdvanceRelay). Two relays of one
// partition (a handover) may both publish a chunk; the copies carry the
// same Nats-Msg-Id and are dropped as duplicates.
//
// A request whose event list is stored in pieces is relayed one piece per
// pass, so a resize that promotes a million waiters moves through the
// relay like a thousand ordinary batches.
func (r *Relay) once(ctx context.Context) (more bool, err error) {
	from, err := store.ReadRelay(ctx, r.db, r.partition)
	if err != nil {
		return false, err
	}
	rows, last, err := store.PendingOutbox(ctx, r.db, r.partition, from, r.batch, relayBytes)
	if err != nil || last.Seq == from.Seq && last.Index == from.Index {
		return false, err
	}
	var (
		events []wire.Event
		skips  []skip
	)
	to := last
	for i, row := range rows {
		if row.EventParts > 0 || from.Piece > 0 {
			if i > 0 {
				// What comes before it first; then it, piece by piece.
				to = store.RelayCursor{Seq: rows[i-1].Seq, Index: rows[i-1].Index}
				break
			}
			events, to, skips, err = r.piece(ctx, row, from)
			if err != nil {
				return false, err
			}
			break
		}
		evs, sk := decode(row, row.Events, 0)
		events, skips = append(events, evs...), append(skips, sk...)
	}
	if err := r.publish(ctx, events); err != nil {
		return false, err
	}
	r.m.eventsPublished.Add(float64(len(events)))
	moved, err := store.AdvanceRelay(ctx, r.db, r.partition, from, to)
	if err != nil {
		return false, err
	}
	if !moved {
		r.log.InfoContext(ctx, "outbox relay: another relay moved the cursor; its events and these are the same",
			slog.Uint64("from_seq", from.Seq), slog.Int("from_index", from.Index))
		return true, nil
	}
	// Said once the cursor has passed them, so that a pass that failed
	// and runs again does not count them twice.
	for _, sk := range skips {
		r.bad(ctx, sk)
	}
	return true, nil
}

// skip is an outbox entry the relay could not read, and why.
type skip struct {
	row    store.OutboxRow
	reason string
}

// piece returns the events of the piece of row the cursor from is at, and
// where the cursor goes once they are relayed.
func (r *Relay) piece(ctx context.Context, row store.OutboxRow, from store.RelayCursor) ([]wire.Event, store.RelayCursor, []skip, error) {
	next := store.RelayCursor{Seq: from.Seq, Index: from.Index, Piece: from.Piece + 1}
	if from.Piece >= row.EventParts {
		next = store.RelayCursor{Seq: row.Seq, Index: row.Index}
	}
	if from.Piece == 0 {
		evs, skips := decode(row, row.Events, 0)
		return evs, next, skips, nil
	}
	data, first, err := store.OutboxPiece(ctx, r.db, r.partition, row.Seq, row.Index, from.Piece)
	if errors.Is(err, sql.ErrNoRows) {
		// A piece that is not there cannot be relayed by waiting: record
		// it and go on with the next request.
		return nil, store.RelayCursor{Seq: row.Seq, Index: row.Index},
			[]skip{{row, fmt.Sprintf("piece %d of %d of the event list is missing", from.Piece, row.EventParts)}}, nil
	}
	if err != nil {
		return nil, from, nil, err
	}
	evs, skips := decode(row, data, first)
	return evs, next, skips, nil
}

// decode turns the encoded events of row (a piece whose first event has
// index first) into events. An entry it cannot read (say, a list cut short
// by an older version) is left out and returned as a skip, to be counted
// and recorded: the partition's other events must not wait for ever
// behind it.
func decode(row store.OutboxRow, data string, first int) ([]wire.Event, []skip) {
	entries := strings.Split(data, ";")
	out := make([]wire.Event, 0, len(entries))
	var bad []string
	for i, entry := range entries {
		es, err := store.DecodeEvents(entry)
		if err != nil || len(es) != 1 {
			bad = append(bad, fmt.Sprintf("%q", entry))
			continue
		}
		ev := wire.Event{
			EventID: wire.EventID(row.RequestID, first+i), Kind: es[0].Kind, ActivityID: row.ActivityID,
			UserID: es[0].UserID, RequestID: row.RequestID, Seq: row.Seq, Index: row.Index, At: row.AppliedAt,
		}
		if until := es[0].HeldUntil; !until.IsZero() {
			ev.HeldUntil = &until
		}
		out = append(out, ev)
	}
	if len(bad) == 0 {
		return out, nil
	}
	return out, []skip{{row, fmt.Sprintf("%d unreadable event entries, skipped: %s", len(bad), strings.Join(bad[:min(len(bad), 5)], ", "))}}
}

// holdSchedule is the message schedule of the expire of the hold ev gave:
// on its own subject in ALLOT_HOLDS, due at wire.HoldDue, targeting
// alloc.hold.due.<activity>, with the expire's derived request_id as
// Nats-Msg-Id so that a schedule relayed again is stored once. The time is
// written to the nanosecond (nats.go's WithScheduleAt cuts it to the
// second, which could fire an expire before its hold ends).
func holdSchedule(ev wire.Event) (*nats.Msg, string) {
	hold := wire.Place(ev.Seq, ev.Index) // the hold's place: the request that gave it
	req := wire.ExpireRequest(ev.ActivityID, ev.UserID, hold, *ev.HeldUntil)
	msg := nats.NewMsg(wire.HoldScheduleSubject(ev.ActivityID, ev.UserID, hold))
	msg.Header.Set(jetstream.ScheduleHeader, "@at "+req.ReceivedAt.Format(time.RFC3339Nano))
	msg.Header.Set(jetstream.ScheduleTargetHeader, wire.HoldDueSubject(ev.ActivityID))
	msg.Data, _ = json.Marshal(req) // a struct of plain fields: cannot fail
	return msg, req.RequestID
}

// bad says loudly that events of a request cannot be relayed, counts it
// and records it in outbox_skipped.
func (r *Relay) bad(ctx context.Context, sk skip) {
	r.m.badEntries.Inc()
	r.log.ErrorContext(ctx, "outbox relay: events cannot be read; skipped them", slog.Uint64("seq", sk.row.Seq), slog.Int("index", sk.row.Index),
		slog.String("request_id", sk.row.RequestID), slog.String("reason", sk.reason))
	if err := store.SkipOutbox(ctx, r.db, r.partition, sk.row.Seq, sk.row.Index, sk.row.RequestID, sk.reason); err != nil {
		r.log.ErrorContext(ctx, "outbox relay", slog.Any("err", err))
	}
}

// publish publishes events with Nats-Msg-Id = event_id and waits until
// every one is stored, relayWindow at a time. An event that gave a hold
// (held, or promoted with held_until) also schedules the hold's expire,
// first: the outbox is what makes an expiry survive any crash after the
// commit. Each window goes out as atomic batches (one fsync per batch, not
// per message), or, when a batch is refused (a copy already stored, after
// a crash) or unanswered, one message at a time.
func (r *Relay) publish(ctx context.Context, events []wire.Event) error {
	nc := r.js.Conn()
	var (
		futures   []jetstream.PubAckFuture
		schedules []*nats.Msg
		sids      []string
		msgs      []*nats.Msg
		ids       []string
	)
	tr := r.traceRelay()
	defer tr.end()
	for lo := 0; lo < len(events); lo += relayWindow {
		futures, schedules, sids, msgs, ids = futures[:0], schedules[:0], sids[:0], msgs[:0], ids[:0]
		for _, ev := range events[lo:min(lo+relayWindow, len(events))] {
			if ev.HeldUntil != nil && (ev.Kind == wire.EventHeld || ev.Kind == wire.EventPromoted) {
				msg, id := holdSchedule(ev)
				schedules, sids = append(schedules, msg), append(sids, id)
			}
			msg := nats.NewMsg(wire.EventSubject(ev.ActivityID, ev.Kind))
			msg.Data = ev.AppendJSON(make([]byte, 0, 256))
			tr.event(ev, msg)
			msgs, ids = append(msgs, msg), append(ids, ev.EventID)
		}
		for _, batch := range []struct {
			stream string
			msgs   []*nats.Msg
			ids    []string
		}{{wire.HoldStream, schedules, sids}, {wire.EventStream, msgs, ids}} {
			if len(batch.msgs) == 0 {
				continue
			}
			_, err := bus.PublishAtomic(nc, batch.stream, batch.msgs, batch.ids, 10*time.Second)
			switch {
			case err == nil:
				continue
			case errors.Is(err, bus.ErrAtomicRefused):
				// The expected answer to a copy published again.
			case errors.Is(err, bus.ErrAtomicUnsupported):
				if !r.warnedAtomic[batch.stream] {
					r.warnedAtomic[batch.stream] = true
					r.log.WarnContext(ctx, "outbox relay: the stream does not take atomic batches; publishing one by one",
						slog.String("stream", batch.stream), slog.Any("err", err))
				}
			default:
				r.log.WarnContext(ctx, "outbox relay: atomic batch failed; publishing one by one",
					slog.String("stream", batch.stream), slog.Int("size", len(batch.msgs)), slog.Any("err", err))
			}
			for i, msg := range batch.msgs {
				f, err := r.js.PublishMsgAsync(msg, jetstream.WithMsgID(batch.ids[i]))
				if err != nil {
					return fmt.Errorf("publish %s to %s: %w", batch.ids[i], batch.stream, err)
				}
				futures = append(futures, f)
			}
		}
		r.m.holdsScheduled.Add(float64(len(schedules)))
		if r.awaitingAcks != nil {
			r.awaitingAcks()
		}
		timeout := time.After(10 * time.Second)
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return fmt.Errorf("publish event: %w", err)
			case <-timeout:
				return fmt.Errorf("publish events: no ack within 10s")
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}
