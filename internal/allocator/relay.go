package allocator

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/store"
)

// Relay publishes outbox rows to ALLOT_EVENTS after their transaction has
// committed, with Nats-Msg-Id = event_id, and deletes them once JetStream
// has acknowledged them. After a crash it resumes from the rows left: an
// event published but not yet deleted is published again, and the stream's
// duplicate window (and a consumer's dedupe by event_id) absorbs it.
type Relay struct {
	db     *sql.DB
	js     jetstream.JetStream
	log    *slog.Logger
	m      *metrics
	wake   chan struct{}
	done   chan struct{}
	batch  int
	period time.Duration
}

func newRelay(db *sql.DB, js jetstream.JetStream, log *slog.Logger, m *metrics) *Relay {
	return &Relay{db: db, js: js, log: log, m: m, wake: make(chan struct{}, 1), done: make(chan struct{}),
		batch: 1000, period: time.Second}
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
	tick := time.NewTicker(r.period)
	defer tick.Stop()
	for {
		select {
		case <-r.done:
			// Drain what the last batches wrote before exiting.
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
		n, err := r.once(ctx)
		if err != nil {
			r.log.WarnContext(ctx, "outbox relay", slog.Any("err", err))
			return
		}
		if n < r.batch {
			return
		}
	}
}

// once relays one chunk and returns how many rows it sent.
func (r *Relay) once(ctx context.Context) (int, error) {
	var sent int
	err := store.WithTx(ctx, r.db, store.TxOptions{Attempts: 3, Isolation: sql.LevelReadCommitted}, func(tx *sql.Tx) error {
		rows, err := store.ClaimOutbox(ctx, tx, r.batch)
		if err != nil || len(rows) == 0 {
			sent = 0
			return err
		}
		futures := make([]jetstream.PubAckFuture, 0, len(rows))
		for _, row := range rows {
			msg := nats.NewMsg(row.Subject)
			msg.Data = row.Payload
			f, err := r.js.PublishMsgAsync(msg, jetstream.WithMsgID(row.EventID))
			if err != nil {
				return fmt.Errorf("publish event %s: %w", row.EventID, err)
			}
			futures = append(futures, f)
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
		sent = len(rows)
		return store.DeleteOutbox(ctx, tx, rows)
	})
	if err != nil {
		return 0, err
	}
	r.m.eventsPublished.Add(float64(sent))
	return sent, nil
}
