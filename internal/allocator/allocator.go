// Package allocator is allot's single consumer: it takes requests from one
// partition of ALLOT_REQUESTS in stream order, applies each batch in one
// MySQL transaction (fence, row locks, decisions from the pure domain,
// results, outbox), commits, then acknowledges. The stream is the log; the
// MySQL fence says how much of it is applied, so redeliveries are skipped and
// gaps left by a dead process are filled from the stream itself.
package allocator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/allocator/checkpoints"
	"github.com/allot-dev/allot/internal/allocator/postcommit"
	"github.com/allot-dev/allot/internal/allocator/pull"
	"github.com/allot-dev/allot/internal/allocator/rows"
	"github.com/allot-dev/allot/internal/allocator/viewpub"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/lifecycle"
	"github.com/allot-dev/allot/internal/relay"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/store/waitlist"
)

// ErrCrashed is returned by Wait after a hook simulated a crash.
var ErrCrashed = errors.New("allocator stopped by a crash hook")

// maxPrefetch bounds the messages the consumer keeps buffered ahead of the
// apply loop: a transaction takes up to BatchSize requests, and a message
// may carry up to a thousand, so the buffer need not grow with BatchSize.
const maxPrefetch = 4000

// ErrFenced is returned by Wait when the partition's fence row is not at
// the map's epoch (store.ErrEpoch): frozen by a move, or moved. Nothing
// was committed; package follow waits for the new route.
var ErrFenced = errors.New("the partition is frozen or moved: its fence is not at this allocator's epoch")

// Allocator applies one partition of the request stream.
type Allocator struct {
	cfg  Config
	deps Deps // deps.Log names the partition
	js   jetstream.JetStream
	m    *metrics

	stream jetstream.Stream
	cons   jetstream.Consumer
	relay  *relay.Relay
	// pub writes the views of full activities for ingest's shedding,
	// off the apply loop.
	pub *viewpub.Publisher

	loop  loopState         // the apply loop's own
	stall stallClock        // shared with the stall watch (stall.go)
	post  *postcommit.Queue // acks and result notices, in commit order
	life  lifeState         // Start, Stop and Wait
}

// loopState is what the apply loop alone reads and writes.
type loopState struct {
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
	waits *lru.Cache[int64, *waitlist.Waitlist]
	// lastFence and lastDseq are where this allocator's last commit left
	// the fence and the last delivery it handled (0: unknown).
	lastFence, lastDseq uint64
	// pinID is the pin the server last delivered with: this allocator
	// holds the partition while the consumer's pinned id equals it.
	pinID string
	// lastProbe is when a given-up allocator last tried MySQL.
	lastProbe time.Time
	// changed: the last commit changed an activity; the next pull is eager.
	changed bool
}

// lifeState runs the allocator's parts between Start and Stop.
type lifeState struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	errMu  sync.Mutex
	err    error
}

// New returns the allocator of partition deps.Partition; Start runs it.
// It takes cfg as it is: Run, and a binary's config.Load, check it with
// Validate once (tests shorten timings below what an operator may set).
func New(cfg Config, deps Deps) (*Allocator, error) {
	js, err := jetstream.New(deps.NATS)
	if err != nil {
		return nil, fmt.Errorf("allocator: %w", err)
	}
	if deps.Registerer == nil {
		deps.Registerer = prometheus.NewRegistry()
	}
	if deps.Partition < 0 || deps.Partition >= cfg.Partitions {
		return nil, fmt.Errorf("allocator: partition %d is not one of %d", deps.Partition, cfg.Partitions)
	}
	reg := prometheus.WrapRegistererWith(prometheus.Labels{"partition": strconv.Itoa(deps.Partition)}, deps.Registerer)
	deps.Log = deps.Log.With(slog.Int("partition", deps.Partition))
	a := &Allocator{cfg: cfg, deps: deps, js: js, m: newMetrics(reg)}
	a.relay = relay.New(relay.Deps{DB: deps.DB, JS: js, Log: deps.Log, Registerer: reg, Partition: deps.Partition,
		AwaitingAcks: deps.Test.AwaitingAcks, Period: deps.Test.RelayPeriod})
	// Both callbacks run in the apply loop, which alone uses the caches.
	if a.loop.cache, err = lru.New[int64, *allocation.Activity](cfg.Cache); err != nil {
		return nil, fmt.Errorf("allocator: %w", err)
	}
	if a.loop.waits, err = lru.New[int64, *waitlist.Waitlist](cfg.Cache); err != nil {
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
		Partition: a.deps.Partition, Partitions: a.cfg.Partitions,
		MaxAckPending: 4 * a.cfg.BatchSize, AckWait: a.deps.Test.ackWait(), PinnedTTL: a.cfg.PinnedTTL,
	})
	if err != nil {
		return err
	}
	if err := store.EnsurePartition(ctx, a.deps.DB, a.deps.Partition, a.deps.Tenure.Epoch()); err != nil {
		return err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", bus.ErrUnavailable, err)
	}
	if err := store.BindPartition(ctx, a.deps.DB, a.deps.Partition, info.Created.UTC().Format(time.RFC3339Nano), info.State.LastSeq); err != nil {
		return err
	}
	kv, err := bus.CheckBucket(ctx, a.js, bus.ViewBucketConfig(1))
	if err != nil {
		return err
	}
	if a.pub, err = viewpub.New(a.viewDeps(kv)); err != nil {
		return fmt.Errorf("allocator: %w", err)
	}
	// The views are rebuilt before the first batch, as at every takeover;
	// they are an optimisation, so a failure there does not fail Start.
	a.loop.viewsStale = true
	return nil
}

// viewDeps is what the allocator's view publisher works with.
func (a *Allocator) viewDeps(kv jetstream.KeyValue) viewpub.Deps {
	return viewpub.Deps{NATS: a.deps.NATS, KV: kv, DB: a.deps.DB, Log: a.deps.Log, Metrics: a.m.views,
		Partition: a.deps.Partition, Partitions: a.cfg.Partitions, ClearTTL: a.deps.Test.ViewClearTTL,
		Track: 4 * a.cfg.Cache, Restore: rows.Activity, Between: a.deps.Test.ViewSnapshot}
}

// launch runs the allocator's parts on one lifecycle until Stop, or
// until one of them fails: the apply loop; after it, in this order, the
// post-commit loop, the view publisher and the outbox relay, each stopped
// only once the one before it has returned (so the relay's last pass
// covers the last commit); and, beside them, the checkpoints and the
// gauges. Wait returns once every one has returned.
func (a *Allocator) launch(ctx context.Context) error {
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a.life.cancel = cancel
	a.post = a.newPost()
	parts := lifecycle.Chain(
		// No name: the allocator's errors are returned as they always were.
		lifecycle.Part{Run: a.run},
		lifecycle.Part{Name: "allocator post-commit", Run: a.post.Run},
		lifecycle.Part{Name: "allocator views", Run: a.pub.Run},
		lifecycle.Part{Name: "allocator relay", Run: a.relay.Run},
	)
	parts = append(parts, lifecycle.Part{Name: "allocator gauges", Run: func(ctx context.Context) error {
		return a.m.gauges.Run(ctx, a.cons, a.deps.DB, a.deps.Partition)
	}})
	if a.cfg.checkpoints() {
		cp := &checkpoints.Taker{DB: a.deps.DB, Stream: a.stream, Log: a.deps.Log,
			Partition: a.deps.Partition, Partitions: a.cfg.Partitions, Every: a.cfg.CheckpointInterval}
		parts = append(parts, lifecycle.Part{Name: "allocator checkpoints", Run: cp.Run})
	}
	a.life.wg.Add(1)
	go func() {
		defer a.life.wg.Done()
		if err := lifecycle.Run(runCtx, parts...); err != nil {
			a.setErr(err)
			if !errors.Is(err, ErrFenced) {
				a.deps.Log.ErrorContext(runCtx, "allocator stopped", slog.Any("err", err))
			}
		}
	}()
	return nil
}

// Stop finishes the batch in hand (commit and ack), stops the relay and
// returns once every part has exited.
func (a *Allocator) Stop() {
	if a.deps.Test.Stopping != nil {
		a.deps.Test.Stopping()
	}
	if a.life.cancel != nil {
		a.life.cancel()
	}
	a.life.wg.Wait()
}

// Wait blocks until the allocator exits by itself or is stopped, and returns
// why it exited (nil after Stop).
func (a *Allocator) Wait() error {
	a.life.wg.Wait()
	a.life.errMu.Lock()
	defer a.life.errMu.Unlock()
	return a.life.err
}

func (a *Allocator) setErr(err error) {
	a.life.errMu.Lock()
	a.life.err = err
	a.life.errMu.Unlock()
	if a.life.cancel != nil {
		a.life.cancel()
	}
}

// run is the apply loop: collect a batch, apply it, repeat.
func (a *Allocator) run(ctx context.Context) error {
	var p pull.Puller
	stopWatch := context.AfterFunc(ctx, p.Stop)
	defer stopWatch()
	defer func() {
		p.Stop()
		a.handOver(context.WithoutCancel(ctx))
	}()
	for ctx.Err() == nil {
		if !a.prefers() {
			a.standBy(ctx, &p)
			continue
		}
		it := p.Current()
		if it == nil {
			var err error
			if it, err = pull.Open(a.cons, bus.PriorityGroup, min(2*a.cfg.BatchSize, maxPrefetch)); err != nil {
				a.deps.Log.WarnContext(ctx, "consume requests", slog.Any("err", err))
				time.Sleep(250 * time.Millisecond)
				continue
			}
			p.Set(it)
			a.loop.viewsStale = true
			if ctx.Err() != nil {
				break
			}
		}
		msgs, err := pull.Collect(it, a.deps.Test.idleCheck(), a.cfg.BatchWait, a.cfg.BatchSize, a.loop.changed, a.relay.Flush)
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			// Stopped (shutdown, a handover) or its connection closed: a
			// new one is made on the next round.
			p.Forget(it)
			if len(msgs) == 0 {
				if ctx.Err() == nil {
					time.Sleep(100 * time.Millisecond)
				}
				continue
			}
		} else if err != nil {
			a.deps.Log.WarnContext(ctx, "fetch requests", slog.Any("err", err))
		}
		if len(msgs) > 0 {
			a.notePin(msgs)
		} else if ctx.Err() != nil || !a.holdsPartition(ctx) {
			continue
		}
		// Apply what is in hand even when stopping: shutdown drains the
		// batch, it never leaves it half done.
		if err := a.handleUntilDone(ctx, msgs); errors.Is(err, errGaveUp) || errors.Is(err, ErrFenced) {
			// Hand the partition over at once, and the batch in hand with
			// it: redelivered now to the next owner, not after AckWait.
			p.Stop()
			a.handOver(ctx)
			for _, m := range msgs {
				m.Nak() //nolint:errcheck // unacknowledged anyway: redelivered after AckWait
			}
			if errors.Is(err, ErrFenced) {
				return err // follow waits for the partition's new route
			}
		} else if err != nil {
			return err
		}
	}
	return ctx.Err()
}

// standBy is a round of an allocator that another live one outranks on
// its partition: it stops pulling and hands the pin over rather than wait
// it out, waits a little, and probes MySQL if it gave the partition up.
func (a *Allocator) standBy(ctx context.Context, p *pull.Puller) {
	if p.Current() != nil {
		p.Stop()
		a.handOver(ctx)
		if a.pub != nil {
			a.pub.Forget() // the next owner rebuilds them
		}
	}
	select {
	case <-ctx.Done():
	case <-time.After(250 * time.Millisecond):
	}
	a.probe(ctx)
}

// notePin remembers the pin msgs were delivered with.
func (a *Allocator) notePin(msgs []jetstream.Msg) {
	if pin := msgs[len(msgs)-1].Headers().Get("Nats-Pin-Id"); pin != "" {
		if pin != a.loop.pinID {
			// Newly pinned here: this allocator takes the partition, and
			// with it the views of its activities.
			a.loop.viewsStale = true
		}
		a.loop.pinID = pin
	}
}

// prefers reports whether this allocator should pull on its partition:
// never while it is given up for want of commits.
func (a *Allocator) prefers() bool {
	return !a.stalled() && (a.deps.Prefers == nil || a.deps.Prefers(a.deps.Partition))
}

// handOver unpins the partition if it is pinned to this allocator, so that
// the server pins a puller of another process at once instead of after
// PinnedTTL.
func (a *Allocator) handOver(ctx context.Context) {
	if a.loop.pinID == "" {
		return
	}
	// The last batch's acks first, so the next owner is not handed
	// messages that are already applied.
	if a.post != nil {
		a.post.Flush()
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, err := a.cons.Info(ctx)
	if err != nil {
		return
	}
	for _, g := range info.PriorityGroups {
		if g.Group == bus.PriorityGroup && g.PinnedClientID == a.loop.pinID {
			if err := a.stream.UnpinConsumer(ctx, bus.AllocatorConsumer(a.deps.Partition), bus.PriorityGroup); err == nil {
				a.deps.Log.InfoContext(ctx, "partition handed over")
			}
		}
	}
	a.loop.pinID = ""
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
	if a.loop.viewsStale && a.pub != nil {
		// Off the apply loop: the publisher rebuilds while this batch
		// is applied; views of later states queued meanwhile win.
		a.pub.RequestRebuild()
		a.loop.viewsStale = false
	}
	backoff := 100 * time.Millisecond
	for {
		err := a.handle(hctx, msgs)
		if err == nil || errors.Is(err, ErrCrashed) {
			return err
		}
		if errors.Is(err, store.ErrEpoch) {
			return fmt.Errorf("%w: %w", ErrFenced, err)
		}
		if ctx.Err() != nil {
			a.deps.Log.WarnContext(ctx, "stopping with a batch not applied; it will be applied later", slog.Any("err", err))
			return nil
		}
		if a.stalled() {
			a.deps.Log.WarnContext(ctx, "batch not applied; handing it over with the partition", slog.Any("err", err))
			return errGaveUp
		}
		a.deps.Log.ErrorContext(ctx, "batch not applied; trying again", slog.Any("err", err), slog.Duration("backoff", backoff))
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
		if g.Group == bus.PriorityGroup && g.PinnedClientID != "" && g.PinnedClientID != a.loop.pinID {
			return false
		}
	}
	return true
}
