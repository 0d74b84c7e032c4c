package allocator

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/allot-dev/allot/internal/allocator/follow"
	"github.com/allot-dev/allot/internal/allocator/health"
	"github.com/allot-dev/allot/internal/allocator/members"
	"github.com/allot-dev/allot/internal/allocator/pools"
	"github.com/allot-dev/allot/internal/allocator/shardup"
	"github.com/allot-dev/allot/internal/buildinfo"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/lifecycle"
	"github.com/allot-dev/allot/internal/shards"
)

// Run migrates the schema and runs an allocator for every partition until
// ctx ends, then lets each finish the batch in hand and returns. Every
// allocator process competes for every partition; the server pins each
// partition to one of them and hands it to a survivor when that one stops.
// It is what cmd/allocator runs, and what `make run` runs in-process. cfg
// is checked with Validate.
//
// With several shards, a shard that does not answer stops only its
// partitions, at start too: the others start, and it is migrated and its
// partitions started once it answers (package shardup).
//
// Its parts run on one lifecycle: the partitions (with the membership,
// which leaves once they have stopped), the shards' migrations (with
// several) and the metrics server, which stops last. The first to fail stops the others, and its error is the one
// returned (nil after a clean shutdown).
func Run(ctx context.Context, cfg Config, deps Deps) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("allocator: %w", err)
	}
	if deps.Shards == nil {
		deps.Shards = shards.Pools{shards.DefaultName: deps.DB}
	}
	// One shard is migrated before anything else, and a failure stops the
	// allocator. Several are migrated each on its own, each as soon as it
	// answers (package shardup): its partitions start then, the others'
	// do not wait for it.
	var up *shardup.Shards
	if len(deps.Shards) == 1 {
		if err := pools.Prepare(ctx, deps.Shards, cfg.StallTimeout/2); err != nil {
			return err
		}
	} else {
		up = shardup.New(deps.Shards, cfg.StallTimeout/2, deps.Log)
		up.Tried = deps.Test.ShardTried
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildinfo.Collector())
	deps.Registerer = reg
	// Serve /readyz (503) and /metrics at once, and wait for JetStream
	// rather than exit: a cluster that has just formed may take a while to
	// create R3 streams.
	h := health.New(deps.Shards, deps.NATS)
	reg.MustRegister(h.ShardUp())
	metrics, err := health.Serve(cfg.MetricsAddr, deps.MetricsListener, reg, h)
	if err != nil {
		return err
	}
	ran := make(chan struct{}) // the partitions have stopped
	// No name: the allocator's errors are returned as they always were.
	parts := []lifecycle.Part{{Run: func(ctx context.Context) error {
		defer close(ran)
		return runPartitions(ctx, cfg, deps, h, up)
	}}}
	if up != nil {
		// No name: its errors name the shard, as one shard's do.
		parts = append(parts, lifecycle.Part{Run: up.Run})
	}
	if metrics != nil {
		parts = append(parts, lifecycle.StopAfter(ran, *metrics))
	}
	return lifecycle.Run(ctx, parts...)
}

// runPartitions waits for the streams, joins the membership, and runs the
// partitions and the membership until ctx ends or one of them fails. It
// returns nil when ctx ended.
func runPartitions(ctx context.Context, cfg Config, deps Deps, h *health.Health, up *shardup.Shards) error {
	js, err := jetstream.New(deps.NATS)
	if err != nil {
		return fmt.Errorf("allocator: %w", err)
	}
	err = bus.Retry(ctx, deps.Log, "allocator: check streams", bus.StartAttempt, func(ctx context.Context) error {
		_, err := checkStreams(ctx, js, cfg.Partitions)
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil // asked to stop while waiting
		}
		return err
	}
	// Each partition goes to the shard the map names; the map is watched
	// until ctx ends.
	router, err := shards.Load(ctx, js, deps.Shards, deps.Log)
	if err != nil {
		return fmt.Errorf("allocator: %w", err)
	}
	m, err := members.JoinIfThere(ctx, deps.NATS, deps.Log)
	if err != nil {
		return err
	}
	// A partition given up for want of commits goes to a peer: the
	// membership tells them, /readyz tells the operator.
	deps.OnStall = func(p int, stalled bool) {
		rt, _ := router.Route(p) // a partition without a route never started
		h.SetStalled(p, rt.Shard, stalled)
		if m != nil {
			m.GiveUp(p, stalled)
		}
	}
	// A partition waiting for its shard at start is given up to the
	// peers (one that reaches the shard takes it), not to /readyz.
	waits := func(int) {}
	if m != nil {
		waits = func(p int) { m.GiveUp(p, true) }
	}
	if m == nil {
		return runAll(ctx, cfg, deps, router, h, up, waits)
	}
	deps.Prefers = m.Prefers
	ran := make(chan struct{})
	return lifecycle.Run(ctx,
		// No name: the allocator's errors are returned as they always were.
		lifecycle.Part{Run: func(ctx context.Context) error {
			defer close(ran)
			return runAll(ctx, cfg, deps, router, h, up, waits)
		}},
		// The membership leaves once the partitions have stopped, so that
		// the others take them over at once.
		lifecycle.StopAfter(ran, lifecycle.Part{Name: "allocator membership", Run: m.Run}))
}

// runAll starts an allocator for every partition on the route the map
// names, each as soon as its shard is ready (up nil: one shard; waits runs
// for a partition that waits for its shard), then follows each
// partition's route (package follow: a partition moved is stopped on its
// old shard and started on its new one, a frozen one waits; the others go
// on), until ctx ends or a partition's allocator fails, then stops them
// all at once.
func runAll(ctx context.Context, cfg Config, deps Deps, router *shards.Router, h *health.Health, up *shardup.Shards, waits func(p int)) error {
	start := func(ctx context.Context, rt shards.Route, reg prometheus.Registerer) (follow.Runner, error) {
		d := deps
		d.Partition, d.DB, d.Tenure, d.Registerer = rt.Partition, rt.DB, router.Tenure(rt), reg
		a, err := New(cfg, d)
		if err != nil {
			return nil, err
		}
		if err := bus.Retry(ctx, deps.Log, "allocator start", bus.StartAttempt, a.Start); err != nil {
			return nil, err
		}
		return a, nil
	}
	all := follow.Partitions(cfg.Partitions, follow.Partition{Router: router, Start: start, Registerer: deps.Registerer, Log: deps.Log},
		func(p int) { deps.OnStall(p, false) }, // a new allocator: not given up
		waits)
	var ready follow.Ready
	if up != nil {
		ready = up.Ready
	}
	// Ready once every partition has started, or waits for its shard (a
	// shard down stops only its partitions, at start as later).
	settled := func(started int, waiting []int) {
		attrs := []any{slog.Int("partitions", started), slog.Int("batch_size", cfg.BatchSize), slog.Duration("batch_wait", cfg.BatchWait)}
		if len(waiting) > 0 {
			attrs = append(attrs, slog.Any("waiting_for_their_shard", waiting))
		}
		deps.Log.InfoContext(ctx, "allocator running", attrs...)
		h.SetReady()
	}
	stop := context.AfterFunc(ctx, func() { deps.Log.Info("allocator stopping: finishing the batches in hand") })
	defer stop()
	return follow.All(ctx, all, ready, settled)
}
