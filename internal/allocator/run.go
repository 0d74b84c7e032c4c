package allocator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/allot-dev/allot/internal/allocator/follow"
	"github.com/allot-dev/allot/internal/allocator/health"
	"github.com/allot-dev/allot/internal/allocator/members"
	"github.com/allot-dev/allot/internal/allocator/pools"
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
// Its parts run on one lifecycle: the partitions (with the membership,
// which leaves once they have stopped) and the metrics server, which stops
// last. The first to fail stops the others, and its error is the one
// returned (nil after a clean shutdown).
func Run(ctx context.Context, cfg Config, deps Deps) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("allocator: %w", err)
	}
	if deps.Shards == nil {
		deps.Shards = shards.Pools{shards.DefaultName: deps.DB}
	}
	// Every shard is migrated before any partition is applied.
	if err := pools.Prepare(ctx, deps.Shards, cfg.StallTimeout/2); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildinfo.Collector())
	deps.Registerer = reg
	// Serve /readyz (503) and /metrics at once, and wait for JetStream
	// rather than exit: a cluster that has just formed may take a while to
	// create R3 streams.
	h := health.New(deps.Shards, deps.NATS)
	metrics, err := health.Serve(cfg.MetricsAddr, deps.MetricsListener, reg, h)
	if err != nil {
		return err
	}
	ran := make(chan struct{}) // the partitions have stopped
	// No name: the allocator's errors are returned as they always were.
	parts := []lifecycle.Part{{Run: func(ctx context.Context) error {
		defer close(ran)
		return runPartitions(ctx, cfg, deps, h)
	}}}
	if metrics != nil {
		parts = append(parts, lifecycle.StopAfter(ran, *metrics))
	}
	return lifecycle.Run(ctx, parts...)
}

// runPartitions waits for the streams, joins the membership, and runs the
// partitions and the membership until ctx ends or one of them fails. It
// returns nil when ctx ended.
func runPartitions(ctx context.Context, cfg Config, deps Deps, h *health.Health) error {
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
	if m == nil {
		return runAll(ctx, cfg, deps, router, h)
	}
	deps.Prefers = m.Prefers
	ran := make(chan struct{})
	return lifecycle.Run(ctx,
		// No name: the allocator's errors are returned as they always were.
		lifecycle.Part{Run: func(ctx context.Context) error {
			defer close(ran)
			return runAll(ctx, cfg, deps, router, h)
		}},
		// The membership leaves once the partitions have stopped, so that
		// the others take them over at once.
		lifecycle.StopAfter(ran, lifecycle.Part{Name: "allocator membership", Run: m.Run}))
}

// runAll starts an allocator for every partition on the route the map
// names, then follows each partition's route (package follow: a partition
// moved is stopped on its old shard and started on its new one, a frozen
// one waits; the others go on), until ctx ends or a partition's allocator
// fails, then stops them all at once.
func runAll(ctx context.Context, cfg Config, deps Deps, router *shards.Router, h *health.Health) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
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
	var all []*follow.Partition
	// All at once: each allocator's Stop may take its shutdown grace (the
	// batch in hand, the relay's last pass); one after another, a process
	// with several partitions would need a multiple of it and be killed
	// half way.
	stopAll := func() {
		var wg sync.WaitGroup
		for _, f := range all {
			wg.Go(f.Stop)
		}
		wg.Wait()
	}
	for p := range cfg.Partitions {
		f := &follow.Partition{P: p, Router: router, Start: start, Registerer: deps.Registerer, Log: deps.Log,
			Restarted: func(shards.Route) {
				if deps.OnStall != nil {
					deps.OnStall(p, false) // a new allocator: not given up
				}
			}}
		if err := f.First(ctx); err != nil {
			stopAll()
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		all = append(all, f)
	}
	deps.Log.InfoContext(ctx, "allocator running", slog.Int("partitions", len(all)),
		slog.Int("batch_size", cfg.BatchSize), slog.Duration("batch_wait", cfg.BatchWait))
	h.SetReady()
	done := make(chan error, len(all))
	var runs sync.WaitGroup
	for _, f := range all {
		runs.Go(func() { done <- f.Run(ctx) })
	}
	var err error
	select {
	case <-ctx.Done():
		deps.Log.Info("allocator stopping: finishing the batches in hand")
	case err = <-done:
	}
	cancel() // each follower stops its allocator, all at once
	runs.Wait()
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}
