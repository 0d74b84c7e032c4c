// Package checkpoints takes the checkpoints of an allocator's partition
// for the audit (audit -from-checkpoint) and drops those the request
// stream no longer reaches back to. All of the allocator's checkpoint
// calls to the store are here.
package checkpoints

import (
	"context"
	"database/sql"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/store/checkpoint"
)

// Taker takes the checkpoints of one partition.
type Taker struct {
	DB     *sql.DB
	Stream jetstream.Stream // the request stream
	Log    *slog.Logger
	// Partition is the partition, one of Partitions.
	Partition, Partitions int
	// Every is the checkpoint interval (ALLOT_CHECKPOINT_INTERVAL, > 0).
	Every time.Duration
}

// Run takes a checkpoint of the partition (checkpoint.Take)
// whenever its newest one is older than the interval and the fence has
// moved since, then drops the checkpoints the request stream no longer
// reaches back to. Every allocator process runs it for every partition;
// reading the newest checkpoint's time first keeps them from taking one
// each, and two taking the same fence at once is harmless (one wins the
// primary key). A checkpoint reads a consistent snapshot and locks nothing,
// so it never holds up the apply loop; a failure is logged and tried again
// at the next tick.
// It runs until ctx ends, and returns nil.
func (a *Taker) Run(ctx context.Context) error {
	every := a.Every
	t := time.NewTicker(min(max(every/10, 10*time.Millisecond), time.Minute))
	defer t.Stop()
	var belongs func(activity int64) bool // nil: every activity
	if a.Partitions > 1 {
		belongs = func(activity int64) bool {
			return bus.PartitionOf(activity, a.Partitions) == a.Partition
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		last, ok, err := checkpoint.Latest(ctx, a.DB, a.Partition)
		if err != nil {
			a.Log.WarnContext(ctx, "checkpoint: read the newest", slog.Any("err", err))
			continue
		}
		if ok && time.Since(last.TakenAt) < every {
			continue
		}
		start := time.Now()
		cp, took, err := checkpoint.Take(ctx, a.DB, a.Partition, a.Partitions, belongs)
		if err != nil {
			if ctx.Err() == nil {
				a.Log.WarnContext(ctx, "checkpoint failed; retrying at the next tick", slog.Any("err", err))
			}
			continue
		}
		if !took {
			continue
		}
		a.Log.InfoContext(ctx, "checkpoint taken", slog.Uint64("seq", cp.Seq), slog.Int64("activities", cp.Activities),
			slog.Int64("signups", cp.Signups), slog.Duration("took", time.Since(start)))
		a.prune(ctx)
	}
}

// prune drops the checkpoints older than the request stream's
// first message: the audit can no longer replay from them.
func (a *Taker) prune(ctx context.Context) {
	info, err := a.Stream.Info(ctx)
	if err != nil {
		return // next time
	}
	first := info.State.FirstSeq
	if first <= 1 {
		return
	}
	n, err := checkpoint.Prune(ctx, a.DB, a.Partition, first-1)
	if err != nil {
		a.Log.WarnContext(ctx, "checkpoint: prune", slog.Any("err", err))
		return
	}
	if n > 0 {
		a.Log.InfoContext(ctx, "checkpoints pruned: the request stream no longer reaches back to them",
			slog.Int64("deleted", n), slog.Uint64("stream_first_seq", first))
	}
}
