package bench

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

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/allocator/follow"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/wire"
)

// ShardsConfig describes a drain over several shards: Drain's requests in
// a request stream of Partitions partitions, each partition applied on the
// shard the map names.
type ShardsConfig struct {
	Drain      DrainConfig
	Partitions int
}

// ShardsResult is what a drain over shards measured: the drain, and the
// partitions each shard applied.
type ShardsResult struct {
	DrainResult
	PartitionsOf map[string][]int // shard name → its partitions
}

// DrainShards is Drain over the shards of pools, named in order by names
// (ALLOT_MYSQL_SHARDS's order; every pool migrated and empty of allot
// state, nc's server empty): it sets the streams and the shard map up as
// `allotctl setup` does (partition p on names[p mod N]), pre-publishes the
// requests, then starts one allocator per partition on the shard the map
// routes it to, each following the map (package follow), as the allocator
// process does, and times them until every partition's fence has passed
// its last request.
//
// cfg.Drain.AfterStart runs once every allocator has started.
func DrainShards(ctx context.Context, pools shards.Pools, names []string, nc *nats.Conn, log *slog.Logger, cfg ShardsConfig) (ShardsResult, error) {
	sr, err := newShardRun(ctx, pools, names, nc, log, cfg.Partitions, cfg.Drain.Allocator)
	if err != nil {
		return ShardsResult{}, err
	}
	defer sr.close()
	if err := publishBacklog(sr.js, cfg.Drain); err != nil {
		return ShardsResult{}, err
	}
	last, err := partitionLastSeqs(ctx, sr.js, cfg.Partitions)
	if err != nil {
		return ShardsResult{}, err
	}
	res := ShardsResult{PartitionsOf: map[string][]int{}}
	for p := range cfg.Partitions {
		rt, err := sr.router.Route(p)
		if err != nil {
			return ShardsResult{}, err
		}
		res.PartitionsOf[rt.Shard] = append(res.PartitionsOf[rt.Shard], p)
	}
	start := time.Now()
	run, err := sr.start(ctx)
	if err != nil {
		return ShardsResult{}, err
	}
	defer run.stop()
	if cfg.Drain.AfterStart != nil {
		cfg.Drain.AfterStart()
	}
	if err := run.wait(ctx, sr.all(), last); err != nil {
		return ShardsResult{}, err
	}
	res.DrainResult = DrainResult{Decisions: cfg.Drain.Requests + cfg.Drain.Activities, Elapsed: time.Since(start)}
	return res, nil
}

// shardRun is a request stream over shards, set up as `allotctl setup`
// sets it up, and the map watched: backlogs are drained on it one after
// another, each by allocators started for it (start).
type shardRun struct {
	pools      shards.Pools
	nc         *nats.Conn
	js         jetstream.JetStream
	log        *slog.Logger
	partitions int
	ac         allocator.Config
	router     *shards.Router
	stopWatch  context.CancelFunc
}

func newShardRun(ctx context.Context, pools shards.Pools, names []string, nc *nats.Conn, log *slog.Logger, partitions int, ac allocator.Config) (*shardRun, error) {
	if len(names) == 0 || partitions < 1 {
		return nil, errors.New("bench: a drain over shards needs at least one shard and one partition")
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return nil, err
	}
	bc := config.Defaults[bus.Config]()
	bc.Partitions = partitions
	if _, err := bus.Setup(ctx, js, bc, names); err != nil {
		return nil, err
	}
	wctx, stopWatch := context.WithCancel(ctx)
	router, err := shards.Load(wctx, js, pools, log)
	if err != nil {
		stopWatch()
		return nil, err
	}
	ac = allocatorConfig(ac)
	ac.Partitions = partitions
	return &shardRun{pools: pools, nc: nc, js: js, log: log, partitions: partitions, ac: ac, router: router, stopWatch: stopWatch}, nil
}

func (s *shardRun) close() { s.stopWatch() }

// all is every partition.
func (s *shardRun) all() []int {
	ps := make([]int, s.partitions)
	for p := range ps {
		ps[p] = p
	}
	return ps
}

// allocators are the running allocators of a drain: one follower per
// partition.
type allocators struct {
	cancel context.CancelFunc
	runs   sync.WaitGroup
	errs   chan error
	s      *shardRun
}

// start starts one allocator per partition on the route the map names for
// it, each following the map from then on (a partition moved is stopped
// on its old shard and started on its new one, a frozen one waits), as
// the allocator process runs them.
func (s *shardRun) start(ctx context.Context) (*allocators, error) {
	ctx, cancel := context.WithCancel(ctx)
	start := func(ctx context.Context, rt shards.Route, reg prometheus.Registerer) (follow.Runner, error) {
		a, err := allocator.New(s.ac, allocator.Deps{DB: rt.DB, Tenure: s.router.Tenure(rt), NATS: s.nc, Log: s.log,
			Partition: rt.Partition, Registerer: reg})
		if err != nil {
			return nil, err
		}
		// As the allocator process starts one: a broker slow to answer
		// is tried again.
		if err := bus.Retry(ctx, s.log, "allocator start", bus.StartAttempt, a.Start); err != nil {
			return nil, err
		}
		return a, nil
	}
	var fs []*follow.Partition
	for p := range s.partitions {
		f := &follow.Partition{P: p, Router: s.router, Start: start, Log: s.log}
		if err := f.Launch(ctx, nil, nil); err != nil {
			cancel()
			for _, f := range fs {
				_ = f.Run(ctx) // ctx has ended: stops its allocator
			}
			return nil, fmt.Errorf("start partition %d: %w", p, err)
		}
		fs = append(fs, f)
	}
	a := &allocators{cancel: cancel, errs: make(chan error, len(fs)), s: s}
	for _, f := range fs {
		a.runs.Go(func() {
			if err := f.Run(ctx); err != nil {
				a.errs <- fmt.Errorf("partition %d's allocator: %w", f.P, err)
			}
		})
	}
	return a, nil
}

// stop stops every allocator, each after its batch in hand.
func (a *allocators) stop() {
	a.cancel()
	a.runs.Wait()
}

// wait returns once the fence of each partition of ps, read on the shard
// the map names for it then, has passed last[p], or with the first
// allocator's failure, or after 5 minutes.
func (a *allocators) wait(ctx context.Context, ps []int, last []uint64) error {
	deadline := time.Now().Add(5 * time.Minute)
	for _, p := range ps {
		for {
			fence, shard, err := a.s.fence(ctx, p)
			if err != nil {
				return err
			}
			if fence >= last[p] {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("partition %d on shard %s: drain stalled at %d of %d", p, shard, fence, last[p])
			}
			select {
			case err := <-a.errs:
				return err
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(2 * time.Millisecond):
			}
		}
	}
	return nil
}

// fence is partition p's fence on the shard the map names for it now (0
// before its fence row exists), and that shard.
func (s *shardRun) fence(ctx context.Context, p int) (uint64, string, error) {
	rt, err := s.router.Route(p)
	if err != nil {
		return 0, "", err
	}
	var fence uint64
	err = rt.DB.QueryRowContext(ctx, "SELECT last_seq FROM allocator_partition WHERE partition_id = ?", p).Scan(&fence)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return 0, rt.Shard, fmt.Errorf("read partition %d's fence on shard %s: %w", p, rt.Shard, err)
	}
	return fence, rt.Shard, nil
}

// partitionLastSeqs is the stream sequence of each partition's last
// message, 0 for a partition without any.
func partitionLastSeqs(ctx context.Context, js jetstream.JetStream, partitions int) ([]uint64, error) {
	st, err := js.Stream(ctx, wire.RequestStream)
	if err != nil {
		return nil, err
	}
	out := make([]uint64, partitions)
	for p := range partitions {
		m, err := st.GetLastMsgForSubject(ctx, bus.PartitionFilter(p, partitions))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("the last message of partition %d: %w", p, err)
		}
		out[p] = m.Sequence
	}
	return out, nil
}
