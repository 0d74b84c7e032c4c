package allocator

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// Relay publishes the events of committed requests to ALLOT_EVENTS. The
// outbox is processed_request itself: each row carries the events its
// request caused, written in the business transaction. The relay walks a
// partition's rows in seq order behind a cursor (event_relay), publishes
// with Nats-Msg-Id = event_id, and moves the cursor once JetStream has
// acknowledged every event. After a crash it resumes at the cursor; events
// published but not yet covered by the cursor are published again with the
// same derived event_id, which the stream's duplicate window and consumers'
// dedupe by event_id absorb.
type Relay struct {
	db        *sql.DB
	js        jetstream.JetStream
	log       *slog.Logger
	m         *metrics
	partition int
	wake      chan struct{}
	done      chan struct{}
	batch     int
	period    time.Duration
}

func newRelay(db *sql.DB, js jetstream.JetStream, log *slog.Logger, m *metrics, partition int) *Relay {
	return &Relay{db: db, js: js, log: log, m: m, partition: partition,
		wake: make(chan struct{}, 1), done: make(chan struct{}), batch: 2000, period: time.Second}
}

// kick asks the relay to look at the outbox now.
func (r *Relay) kick() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// stop makes run return after a last pass, once the apply loop has ended.
func (r *Relay) stop() { close(r.done) }

func (r *Relay) run(ctx context.Context) {
	if err := store.EnsureRelay(ctx, r.db, r.partition); err != nil {
		r.log.ErrorContext(ctx, "outbox relay", slog.Any("err", err))
	}
	tick := time.NewTicker(r.period)
	defer tick.Stop()
	for {
		select {
		case <-r.done:
			// Relay what the last batches committed before exiting.
			r.drain(context.WithoutCancel(ctx), 3*time.Second)
			return
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

// once relays one chunk; more reports whether a full chunk was read.
func (r *Relay) once(ctx context.Context) (more bool, err error) {
	var sent int
	err = store.WithTx(ctx, r.db, store.TxOptions{Attempts: 3, Isolation: sql.LevelReadCommitted}, func(tx *sql.Tx) error {
		sent, more = 0, false
		cursor, err := store.LockRelay(ctx, tx, r.partition)
		if err != nil {
			return err
		}
		rows, last, err := store.PendingOutbox(ctx, tx, r.partition, cursor, r.batch)
		if err != nil || last == cursor {
			return err
		}
		var futures []jetstream.PubAckFuture
		for _, row := range rows {
			events, err := allocation.DecodeEvents(row.Events)
			if err != nil {
				return fmt.Errorf("request %s: %w", row.RequestID, err)
			}
			for i, e := range events {
				ev := wire.Event{
					EventID: wire.EventID(row.RequestID, i), Kind: e.Kind, ActivityID: row.ActivityID,
					UserID: e.UserID, RequestID: row.RequestID, Seq: row.Seq, At: row.AppliedAt,
				}
				msg := nats.NewMsg(wire.EventSubject(ev.ActivityID, ev.Kind))
				msg.Data = ev.AppendJSON(make([]byte, 0, 256))
				f, err := r.js.PublishMsgAsync(msg, jetstream.WithMsgID(ev.EventID))
				if err != nil {
					return fmt.Errorf("publish event %s: %w", ev.EventID, err)
				}
				futures = append(futures, f)
			}
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
		sent = len(futures)
		more = true
		return store.SetRelay(ctx, tx, r.partition, last)
	})
	if err != nil {
		return false, err
	}
	r.m.eventsPublished.Add(float64(sent))
	return more, nil
}
