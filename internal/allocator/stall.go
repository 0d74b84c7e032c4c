package allocator

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocator/stallwatch"
)

// errGaveUp says the batch in hand was given up: the allocator could not
// commit for StallTimeout while requests waited.
var errGaveUp = errors.New("partition given up: no commit while requests wait")

// A stalled partition: see package stallwatch.

// probeEvery is how often a given-up allocator tries MySQL again.
const probeEvery = time.Second

// stallClock is what the apply loop and the stall watch share.
type stallClock struct {
	// gaveUp is set while the partition is given up for want of commits;
	// lastCommit is when a transaction last committed (UnixNano).
	gaveUp     atomic.Bool
	lastCommit atomic.Int64
	// idleChecks counts the times the stall watch found nothing waiting.
	idleChecks atomic.Int64
	// applied is the fence as this allocator's last commit left it, for
	// the stall watch (loop.lastFence is the apply loop's own).
	applied atomic.Uint64
}

// stalled reports whether the allocator gave its partition up.
func (a *Allocator) stalled() bool { return a.stall.gaveUp.Load() }

// noteProgress records a commit: the stall clock restarts.
func (a *Allocator) noteProgress() { a.stall.lastCommit.Store(time.Now().UnixNano()) }

// watchStall watches the batch in hand (msgs, when inHand) from now on
// (stallwatch.Watch): once nothing has committed for StallTimeout while
// requests wait, it gives the partition up and calls abort, which ends the
// attempt in flight. The returned stop ends and joins the watch.
func (a *Allocator) watchStall(ctx context.Context, inHand bool, abort func()) (stop func()) {
	if !a.cfg.stallWatched() {
		return func() {}
	}
	return stallwatch.Watch(ctx, stallwatch.Watched{
		Timeout:    a.cfg.StallTimeout,
		LastCommit: func() int64 { return a.stall.lastCommit.Load() },
		Waiting:    func(ctx context.Context) bool { return inHand || a.requestsWait(ctx) },
		Idle:       func() { a.stall.idleChecks.Add(1) },
		Stalled: func(since time.Duration) {
			a.giveUp(since)
			abort()
		},
	})
}

// requestsWait reports whether requests of the partition wait: stored and
// not delivered, or delivered and not applied. An idle partition is never
// stalled. A message this allocator applied whose ack is still on its way
// (postLoop confirms acks off the apply loop, and a loaded machine can take
// a while) is pending on the consumer but waits for nothing: delivered
// messages count only when one lies past the fence this allocator's last
// commit left.
func (a *Allocator) requestsWait(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, err := a.cons.Info(ctx)
	if err != nil {
		return false // nobody can tell; the broker is away as well
	}
	return info.NumPending > 0 || (info.NumAckPending > 0 && info.Delivered.Stream > a.stall.applied.Load())
}

// unapplied reports whether msgs hold a request past the fence of this
// allocator's last commit: a redelivery, or a message the fence already
// covers (applied through a walk of the stream before its delivery came),
// waits for nothing, even while MySQL cannot say so.
func (a *Allocator) unapplied(msgs []jetstream.Msg) bool {
	applied := a.stall.applied.Load()
	for _, m := range msgs {
		md, err := m.Metadata()
		if err != nil || md.Sequence.Stream > applied {
			return true
		}
	}
	return false
}

// giveUp marks the partition given up and says so.
func (a *Allocator) giveUp(since time.Duration) {
	if a.stall.gaveUp.Swap(true) {
		return
	}
	a.m.stalled.Set(1)
	a.m.giveUps.Inc()
	a.deps.Log.Error("partition given up: no commit while its requests wait; a peer takes it over",
		slog.Duration("without_commit", since.Round(time.Millisecond)), slog.Duration("stall_timeout", a.cfg.StallTimeout))
	if a.deps.OnStall != nil {
		a.deps.OnStall(a.deps.Partition, true)
	}
}

// probe ends the stall once a transaction commits again.
func (a *Allocator) probe(ctx context.Context) {
	if !a.stall.gaveUp.Load() || time.Since(a.loop.lastProbe) < probeEvery {
		return
	}
	a.loop.lastProbe = time.Now()
	if stallwatch.Probe(ctx, a.deps.DB, probeEvery) != nil {
		return
	}
	a.stall.gaveUp.Store(false)
	a.noteProgress()
	a.m.stalled.Set(0)
	a.deps.Log.Info("partition can commit again; taking part as a member")
	if a.deps.OnStall != nil {
		a.deps.OnStall(a.deps.Partition, false)
	}
}
