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
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/store"
)

// Config tunes an Allocator. Zero values take the defaults.
type Config struct {
	// Partition is the request-stream partition this allocator applies,
	// one of Partitions (default 1).
	Partition, Partitions int
	// Prefers, when set, says whether this process should pull on a
	// partition (Members.Prefers); nil pulls on every partition.
	Prefers func(partition int) bool
	// PinnedTTL is how long the server waits for a pinned allocator that
	// stopped pulling before it hands the partition to another (default 5s).
	PinnedTTL time.Duration
	// BatchSize is the most requests applied in one transaction (default 2000).
	BatchSize int
	// BatchWait is how long a batch waits for more requests after its first
	// one (default 2ms): a little latency buys much larger commits under load.
	BatchWait time.Duration
	// AckWait is the consumer's redelivery timeout (default 30s).
	AckWait time.Duration
	// CheckpointInterval is how often the partition's state is
	// checkpointed for the audit (default DefaultCheckpointInterval;
	// negative: never). See checkpoints.
	CheckpointInterval time.Duration
	// IdleCheck is how often an idle allocator looks for a gap between its
	// fence and the stream (default 1s), which a crashed peer leaves behind.
	IdleCheck time.Duration
	// CacheActivities bounds the activities whose live state the allocator
	// keeps between batches (default DefaultCacheActivities); the least
	// recently used is dropped and reloaded from MySQL when next needed.
	// Four times as many full activities are tracked for their views.
	CacheActivities int
	// ViewClearTTL is how long a cleared view stays in the view bucket
	// before it expires (default DefaultViewClearTTL, at least a second):
	// while it is there, a late put of an older view is refused by the
	// bucket (see viewpub.go); after it, the key is gone.
	ViewClearTTL time.Duration
	// PieceBytes bounds a piece of a long promoted or event list in MySQL
	// (0: derived from the server's max_allowed_packet; tests set it low).
	PieceBytes int
	// StallTimeout is how long the allocator may go without a commit while
	// requests of its partition wait before it gives the partition up to a
	// peer (default DefaultStallTimeout; negative: never). See stall.go.
	StallTimeout time.Duration
	// OnStall, when set, is told when the allocator gives its partition up
	// (stalled true) and when it can commit again (false): Run tells the
	// membership, so that peers take the partition.
	OnStall func(partition int, stalled bool)
	// bucketSize bounds the waiters of a waitlist bucket; 0:
	// store.BucketSize (tests choose smaller ones).
	bucketSize int64
}

// DefaultCacheActivities is Config.CacheActivities' default.
const DefaultCacheActivities = 10_000

func (c Config) withDefaults() Config {
	if c.BatchSize <= 0 {
		c.BatchSize = 2000
	}
	if c.BatchWait <= 0 {
		c.BatchWait = 2 * time.Millisecond
	}
	if c.AckWait <= 0 {
		c.AckWait = 30 * time.Second
	}
	if c.CheckpointInterval == 0 {
		c.CheckpointInterval = DefaultCheckpointInterval
	}
	if c.IdleCheck <= 0 {
		c.IdleCheck = time.Second
	}
	if c.CacheActivities <= 0 {
		c.CacheActivities = DefaultCacheActivities
	}
	if c.ViewClearTTL <= 0 {
		c.ViewClearTTL = DefaultViewClearTTL
	}
	c.Partitions = max(c.Partitions, 1)
	if c.PinnedTTL <= 0 {
		c.PinnedTTL = 5 * time.Second
	}
	if c.StallTimeout == 0 {
		c.StallTimeout = DefaultStallTimeout
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
	// BeforeConfirm runs in the post-commit goroutine before it confirms a
	// batch's acks: a slow broker round trip, for tests of the ordering.
	BeforeConfirm func()
	// Stopping runs when Stop begins: a slow drain, for tests of shutdown.
	Stopping func()
	// ViewSnapshot runs inside a view rebuild's MySQL snapshot, between
	// its read of the activity rows and of the signups.
	ViewSnapshot func()
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
	// views holds the views of full activities for ingest's shedding,
	// written by pub off the apply loop.
	views jetstream.KeyValue
	pub   *viewPub
	// viewsStale says the views must be rebuilt before the next batch: this
	// allocator has (re)started pulling or was newly pinned.
	viewsStale bool

	// cache holds each activity's live state between batches. An entry is
	// trusted only while its NextSeq, capacity and count match the row
	// locked in the transaction; otherwise it is reloaded.
	cache *lru.Cache[int64, *allocation.Activity]
	// waits holds the waitlist buckets of cached activities, valid exactly
	// as long as the cached state they go with: an activity loaded from
	// MySQL loads its buckets anew.
	waits *lru.Cache[int64, *store.Waitlist]
	// lastFence and lastDseq are where this allocator's last commit left
	// the fence and the last delivery it handled (0: unknown).
	lastFence, lastDseq uint64
	// pinID is the pin the server last delivered with: this allocator
	// holds the partition while the consumer's pinned id equals it.
	pinID string
	// checkDuplicates makes a batch look up which of its requests were
	// already applied before deciding; set only to redo a batch that ran
	// into one.
	checkDuplicates bool
	// single makes a transaction apply one message only: isolate's mode;
	// tried is then the stream sequence of the message it tried last.
	single bool
	tried  uint64
	// post carries what follows a commit but need not hold up the next
	// batch (confirming the acks, telling waiting clients) to postLoop, in
	// commit order.
	post     chan postCommit
	postDone chan struct{}
	// gaveUp is set while the partition is given up for want of commits;
	// lastCommit is when a transaction last committed (UnixNano), and
	// lastProbe when a given-up allocator last tried MySQL (apply loop).
	gaveUp     atomic.Bool
	lastCommit atomic.Int64
	lastProbe  time.Time
	// idleChecks counts the times the stall watch found nothing waiting.
	idleChecks atomic.Int64
	// applied is the fence as this allocator's last commit left it, for
	// the stall watch (lastFence is the apply loop's own).
	applied atomic.Uint64

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
	cfg = cfg.withDefaults()
	if cfg.Partition < 0 || cfg.Partition >= cfg.Partitions {
		return nil, fmt.Errorf("allocator: partition %d is not one of %d", cfg.Partition, cfg.Partitions)
	}
	m := newMetrics(prometheus.WrapRegistererWith(prometheus.Labels{"partition": strconv.Itoa(cfg.Partition)}, reg))
	log = log.With(slog.Int("partition", cfg.Partition))
	a := &Allocator{
		cfg: cfg, db: db, nc: nc, js: js, log: log, m: m, hooks: hooks,
		relay: newRelay(db, js, log, m, cfg.Partition),
	}
	// Both callbacks run in the apply loop, which alone uses the caches.
	if a.cache, err = lru.New[int64, *allocation.Activity](cfg.CacheActivities); err != nil {
		return nil, fmt.Errorf("allocator: %w", err)
	}
	if a.waits, err = lru.New[int64, *store.Waitlist](cfg.CacheActivities); err != nil {
		return nil, fmt.Errorf("allocator: %w", err)
	}
	return a, nil
}

// Start checks the streams, ensures the durable consumer and the fence row, then
// runs the apply loop and the outbox relay until Stop.
func (a *Allocator) Start(ctx context.Context) error {
	if err := a.prepare(ctx); err != nil {
		return err
	}
	return a.launch(ctx)
}

// checkStreams checks the streams an allocator uses (only `allotctl setup`
// creates or changes them) and returns the request stream.
func checkStreams(ctx context.Context, js jetstream.JetStream, partitions int) (jetstream.Stream, error) {
	st, _, err := bus.CheckRequestStream(ctx, js, partitions)
	if err != nil {
		return nil, err
	}
	if err := bus.CheckHoldStream(ctx, js); err != nil {
		return nil, err
	}
	if err := bus.CheckEventStream(ctx, js); err != nil {
		return nil, err
	}
	return st, nil
}

// prepare checks the streams and ensures the consumer and the fence row:
// everything the apply loop needs.
func (a *Allocator) prepare(ctx context.Context) error {
	st, err := checkStreams(ctx, a.js, a.cfg.Partitions)
	if err != nil {
		return err
	}
	a.stream = st
	a.cons, err = bus.EnsureAllocatorConsumer(ctx, a.js, bus.ConsumerConfig{
		Partition: a.cfg.Partition, Partitions: a.cfg.Partitions,
		MaxAckPending: 4 * a.cfg.BatchSize, AckWait: a.cfg.AckWait, PinnedTTL: a.cfg.PinnedTTL,
	})
	if err != nil {
		return err
	}
	if err := store.EnsurePartition(ctx, a.db, a.cfg.Partition); err != nil {
		return err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", bus.ErrUnavailable, err)
	}
	if err := store.BindPartition(ctx, a.db, a.cfg.Partition, info.Created.UTC().Format(time.RFC3339Nano), info.State.LastSeq); err != nil {
		return err
	}
	if a.views, err = bus.CheckBucket(ctx, a.js, bus.ViewBucketConfig(1)); err != nil {
		return err
	}
	if a.pub, err = newViewPub(a, a.views); err != nil {
		return fmt.Errorf("allocator: %w", err)
	}
	// The views are rebuilt before the first batch, as at every takeover;
	// they are an optimisation, so a failure there does not fail Start.
	a.viewsStale = true
	return nil
}

// launch runs the apply loop and the relay.
func (a *Allocator) launch(ctx context.Context) error {
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a.cancel = cancel
	a.wg.Add(2)
	a.post = make(chan postCommit, postQueue)
	a.postDone = make(chan struct{})
	go a.postLoop()
	if a.pub != nil {
		go a.pub.run()
	}
	go func() {
		defer a.wg.Done()
		err := a.run(runCtx)
		// The acks of the last batches are confirmed before Stop returns.
		close(a.post)
		<-a.postDone
		if a.pub != nil {
			a.pub.close() // writes what is pending, for a bounded while
		}
		if err != nil && !errors.Is(err, context.Canceled) {
			a.setErr(err)
			a.log.ErrorContext(runCtx, "allocator stopped", slog.Any("err", err))
		}
		a.relay.stop()
	}()
	go func() {
		defer a.wg.Done()
		a.relay.run(runCtx)
	}()
	go a.watch(runCtx, 2*time.Second)
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		a.checkpoints(runCtx)
	}()
	return nil
}

// Stop finishes the batch in hand (commit and ack), stops the relay and
// returns once both have exited.
func (a *Allocator) Stop() {
	if a.hooks.Stopping != nil {
		a.hooks.Stopping()
	}
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
	var (
		mu   sync.Mutex
		iter jetstream.MessagesContext
	)
	stopIter := func() {
		mu.Lock()
		defer mu.Unlock()
		if iter != nil {
			iter.Stop()
			iter = nil
		}
	}
	stopWatch := context.AfterFunc(ctx, stopIter)
	defer stopWatch()
	defer func() {
		stopIter()
		a.handOver(context.WithoutCancel(ctx))
	}()
	for ctx.Err() == nil {
		if !a.prefers() {
			// Another live allocator is this partition's preferred owner:
			// stop pulling and hand the pin over rather than wait it out.
			mu.Lock()
			pulling := iter != nil
			mu.Unlock()
			if pulling {
				stopIter()
				a.handOver(ctx)
				if a.pub != nil {
					a.pub.forget() // the next owner rebuilds them
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
			a.probe(ctx)
			continue
		}
		mu.Lock()
		it := iter
		mu.Unlock()
		if it == nil {
			var err error
			it, err = a.cons.Messages(jetstream.PullMaxMessages(2*a.cfg.BatchSize), jetstream.PullPriorityGroup(bus.PriorityGroup))
			if err != nil {
				a.log.WarnContext(ctx, "consume requests", slog.Any("err", err))
				time.Sleep(250 * time.Millisecond)
				continue
			}
			mu.Lock()
			iter = it
			mu.Unlock()
			a.viewsStale = true
			if ctx.Err() != nil {
				break
			}
		}
		msgs, err := a.collect(it)
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			// Stopped (shutdown, a handover) or its connection closed: a
			// new one is made on the next round.
			mu.Lock()
			if iter == it {
				iter = nil
			}
			mu.Unlock()
			if len(msgs) == 0 {
				if ctx.Err() == nil {
					time.Sleep(100 * time.Millisecond)
				}
				continue
			}
		} else if err != nil {
			a.log.WarnContext(ctx, "fetch requests", slog.Any("err", err))
		}
		if len(msgs) > 0 {
			if pin := msgs[len(msgs)-1].Headers().Get("Nats-Pin-Id"); pin != "" {
				if pin != a.pinID {
					// Newly pinned here: this allocator takes the
					// partition, and with it the views of its activities.
					a.viewsStale = true
				}
				a.pinID = pin
			}
		} else if ctx.Err() != nil || !a.holdsPartition(ctx) {
			continue
		}
		// Apply what is in hand even when stopping: shutdown drains the
		// batch, it never leaves it half done.
		if err := a.handleUntilDone(ctx, msgs); errors.Is(err, errGaveUp) {
			// Hand the partition over at once, and the batch in hand with
			// it: redelivered now to the next owner, not after AckWait.
			stopIter()
			a.handOver(ctx)
			for _, m := range msgs {
				m.Nak() //nolint:errcheck // unacknowledged anyway: redelivered after AckWait
			}
		} else if err != nil {
			return err
		}
	}
	return ctx.Err()
}

// prefers reports whether this allocator should pull on its partition:
// never while it is given up for want of commits.
func (a *Allocator) prefers() bool {
	return !a.stalled() && (a.cfg.Prefers == nil || a.cfg.Prefers(a.cfg.Partition))
}

// handOver unpins the partition if it is pinned to this allocator, so that
// the server pins a puller of another process at once instead of after
// PinnedTTL.
func (a *Allocator) handOver(ctx context.Context) {
	if a.pinID == "" {
		return
	}
	// The last batch's acks first, so the next owner is not handed
	// messages that are already applied.
	a.flushPost()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, err := a.cons.Info(ctx)
	if err != nil {
		return
	}
	for _, g := range info.PriorityGroups {
		if g.Group == bus.PriorityGroup && g.PinnedClientID == a.pinID {
			if err := a.stream.UnpinConsumer(ctx, bus.AllocatorConsumer(a.cfg.Partition), bus.PriorityGroup); err == nil {
				a.log.InfoContext(ctx, "partition handed over")
			}
		}
	}
	a.pinID = ""
}

// shutdownGrace bounds how long a stopping allocator keeps trying to
// finish its batch.
const shutdownGrace = 10 * time.Second

// handleUntilDone applies msgs, trying again with backoff while the broker
// or the database is away, holding on to the messages meanwhile. On
// shutdown it gives up: the messages stay unacknowledged, and this or
// another allocator applies them later, in order, past the fence. After
// StallTimeout without a commit while requests wait it gives the partition
// up (stall.go) and returns errGaveUp, the messages unacknowledged.
func (a *Allocator) handleUntilDone(ctx context.Context, msgs []jetstream.Msg) error {
	// The batch in hand may finish after a stop, but not for ever: a
	// database that stays away ends it ShutdownGrace after the stop.
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(shutdownGrace, cancel)
		context.AfterFunc(hctx, func() { t.Stop() })
	})
	defer stop()
	// No commit for StallTimeout while requests wait: the attempt in
	// flight is aborted (a hung connection included) and the partition
	// given up.
	defer a.watchStall(hctx, a.unapplied(msgs), cancel)()
	if a.viewsStale && a.pub != nil {
		// Off the apply loop: the publisher rebuilds while this batch
		// is applied; views of later states queued meanwhile win.
		a.pub.requestRebuild()
		a.viewsStale = false
	}
	backoff := 100 * time.Millisecond
	for {
		err := a.handle(hctx, msgs)
		if err == nil || errors.Is(err, ErrCrashed) {
			return err
		}
		if ctx.Err() != nil {
			a.log.WarnContext(ctx, "stopping with a batch not applied; it will be applied later", slog.Any("err", err))
			return nil
		}
		if a.stalled() {
			a.log.WarnContext(ctx, "batch not applied; handing it over with the partition", slog.Any("err", err))
			return errGaveUp
		}
		a.log.ErrorContext(ctx, "batch not applied; trying again", slog.Any("err", err), slog.Duration("backoff", backoff))
		for _, m := range msgs {
			m.InProgress() //nolint:errcheck // best effort: keep the lease
		}
		select {
		case <-ctx.Done():
		case <-hctx.Done(): // given up meanwhile
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// holdsPartition reports, when idle, whether this allocator may look for a
// gap between the fence and the stream: when the partition is pinned to it,
// or to nobody (a crashed holder left messages the server will redeliver
// only after AckWait). An allocator that another one outranks stays idle.
func (a *Allocator) holdsPartition(ctx context.Context) bool {
	if !a.prefers() {
		return false
	}
	info, err := a.cons.Info(ctx)
	if err != nil {
		return false
	}
	for _, g := range info.PriorityGroups {
		if g.Group == bus.PriorityGroup && g.PinnedClientID != "" && g.PinnedClientID != a.pinID {
			return false
		}
	}
	return true
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
