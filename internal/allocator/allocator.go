// Package allocator is allot's single consumer: it takes requests from one
// partition of ALLOT_REQUESTS in stream order, applies each batch in one
// MySQL transaction (fence, row locks, decisions from the pure domain,
// results, outbox), commits, then acknowledges. The stream is the log; the
// MySQL fence says how much of it is applied, so redeliveries are skipped and
// gaps left by a dead process are filled from the stream itself.
package allocator

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// Config tunes an Allocator. Zero values take the defaults.
type Config struct {
	// Partition is the request-stream partition this allocator applies.
	Partition int
	// BatchSize is the most requests applied in one transaction (default 500).
	BatchSize int
	// BatchWait is how long a batch waits for more requests after its first
	// one (default 2ms): a little latency buys much larger commits under load.
	BatchWait time.Duration
	// AckWait is the consumer's redelivery timeout (default 30s).
	AckWait time.Duration
	// IdleCheck is how often an idle allocator looks for a gap between its
	// fence and the stream (default 1s), which a crashed peer leaves behind.
	IdleCheck time.Duration
}

func (c Config) withDefaults() Config {
	if c.BatchSize <= 0 {
		c.BatchSize = 500
	}
	if c.BatchWait <= 0 {
		c.BatchWait = 2 * time.Millisecond
	}
	if c.AckWait <= 0 {
		c.AckWait = 30 * time.Second
	}
	if c.IdleCheck <= 0 {
		c.IdleCheck = time.Second
	}
	return c
}

// Hooks let tests stop the allocator at the points where a real process can
// die. Production code leaves them nil.
type Hooks struct {
	// AfterCommit runs after a batch commits and before its messages are
	// acknowledged. A non-nil error makes the allocator stop right there, as
	// if the process had been killed between commit and ack.
	AfterCommit func() error
}

// ErrCrashed is returned by Wait after a hook simulated a crash.
var ErrCrashed = errors.New("allocator stopped by a crash hook")

// Allocator applies one partition of the request stream.
type Allocator struct {
	cfg   Config
	db    *sql.DB
	nc    *nats.Conn
	js    jetstream.JetStream
	log   *slog.Logger
	m     *metrics
	hooks Hooks

	stream jetstream.Stream
	cons   jetstream.Consumer
	relay  *Relay
	// views holds the views of full activities for ingest's shedding;
	// viewFull says which activities have one.
	views    jetstream.KeyValue
	viewFull map[int64]bool

	// cache holds each activity's live state between batches. An entry is
	// trusted only while its NextSeq, capacity and count match the row
	// locked in the transaction; otherwise it is reloaded.
	cache map[int64]*allocation.Activity
	// checkDuplicates makes a batch look up which of its requests were
	// already applied before deciding; set only to redo a batch that ran
	// into one.
	checkDuplicates bool

	cancel context.CancelFunc
	wg     sync.WaitGroup
	errMu  sync.Mutex
	err    error
}

// New returns an allocator; Start runs it.
func New(db *sql.DB, nc *nats.Conn, log *slog.Logger, reg prometheus.Registerer, cfg Config, hooks Hooks) (*Allocator, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("allocator: %w", err)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := newMetrics(reg)
	cfg = cfg.withDefaults()
	log = log.With(slog.Int("partition", cfg.Partition))
	return &Allocator{
		cfg: cfg, db: db, nc: nc, js: js, log: log, m: m, hooks: hooks,
		relay:    newRelay(db, js, log, m, cfg.Partition),
		cache:    make(map[int64]*allocation.Activity),
		viewFull: make(map[int64]bool),
	}, nil
}

// Start ensures the streams, the durable consumer and the fence row, then
// runs the apply loop and the outbox relay until Stop.
func (a *Allocator) Start(ctx context.Context) error {
	if err := bus.EnsureStreams(ctx, a.js, bus.StreamConfig{}); err != nil {
		return err
	}
	st, err := a.js.Stream(ctx, wire.RequestStream)
	if err != nil {
		return fmt.Errorf("%w: %w", bus.ErrUnavailable, err)
	}
	a.stream = st
	a.cons, err = bus.EnsureAllocatorConsumer(ctx, a.js, a.cfg.Partition, 4*a.cfg.BatchSize, a.cfg.AckWait)
	if err != nil {
		return err
	}
	if err := store.EnsurePartition(ctx, a.db, a.cfg.Partition); err != nil {
		return err
	}
	if a.views, err = bus.EnsureViewBucket(ctx, a.js, bus.StreamConfig{}); err != nil {
		return err
	}
	if err := a.repairViews(ctx); err != nil {
		return fmt.Errorf("allocator: repair views: %w", err)
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a.cancel = cancel
	a.wg.Add(2)
	go func() {
		defer a.wg.Done()
		if err := a.run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
			a.setErr(err)
			a.log.ErrorContext(runCtx, "allocator stopped", slog.Any("err", err))
		}
		a.relay.stop()
	}()
	go func() {
		defer a.wg.Done()
		a.relay.run(runCtx)
	}()
	return nil
}

// Stop finishes the batch in hand (commit and ack), stops the relay and
// returns once both have exited.
func (a *Allocator) Stop() {
	if a.cancel != nil {
		a.cancel()
	}
	a.wg.Wait()
}

// Wait blocks until the allocator exits by itself or is stopped, and returns
// why it exited (nil after Stop).
func (a *Allocator) Wait() error {
	a.wg.Wait()
	a.errMu.Lock()
	defer a.errMu.Unlock()
	return a.err
}

func (a *Allocator) setErr(err error) {
	a.errMu.Lock()
	a.err = err
	a.errMu.Unlock()
	if a.cancel != nil {
		a.cancel()
	}
}

// run is the apply loop: collect a batch, apply it, repeat.
func (a *Allocator) run(ctx context.Context) error {
	iter, err := a.cons.Messages(jetstream.PullMaxMessages(2 * a.cfg.BatchSize))
	if err != nil {
		return fmt.Errorf("allocator: consume: %w", err)
	}
	go func() { <-ctx.Done(); iter.Stop() }()
	for ctx.Err() == nil {
		msgs, err := a.collect(iter)
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			if len(msgs) == 0 {
				return ctx.Err()
			}
		} else if err != nil {
			a.log.WarnContext(ctx, "fetch requests", slog.Any("err", err))
		}
		// Apply what is in hand even when stopping: shutdown drains the
		// batch, it never leaves it half done.
		if err := a.handle(context.WithoutCancel(ctx), msgs); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// collect returns the next batch: it waits up to IdleCheck for a first
// message, then up to BatchWait more for the rest.
func (a *Allocator) collect(iter jetstream.MessagesContext) ([]jetstream.Msg, error) {
	first, err := iter.Next(jetstream.NextMaxWait(a.cfg.IdleCheck))
	if err != nil {
		if errors.Is(err, nats.ErrTimeout) {
			return nil, nil
		}
		return nil, err
	}
	msgs := make([]jetstream.Msg, 1, a.cfg.BatchSize)
	msgs[0] = first
	deadline := time.Now().Add(a.cfg.BatchWait)
	for len(msgs) < a.cfg.BatchSize {
		wait := time.Until(deadline)
		if wait <= 0 {
			break
		}
		m, err := iter.Next(jetstream.NextMaxWait(wait))
		if err != nil {
			if errors.Is(err, nats.ErrTimeout) {
				break
			}
			return msgs, err
		}
		msgs = append(msgs, m)
	}
	return msgs, nil
}
