package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocator"
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
// routes it to, with its tenure (as the allocator process does), and times
// them until every partition's fence has passed its last request.
//
// cfg.Drain.AfterStart runs once every allocator has started: a
// measurement of a partition's move between shards starts the move there
// and measures the other partitions' drain meanwhile.
func DrainShards(ctx context.Context, pools shards.Pools, names []string, nc *nats.Conn, log *slog.Logger, cfg ShardsConfig) (ShardsResult, error) {
	if len(names) == 0 || cfg.Partitions < 1 {
		return ShardsResult{}, errors.New("bench: a drain over shards needs at least one shard and one partition")
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return ShardsResult{}, err
	}
	bc := config.Defaults[bus.Config]()
	bc.Partitions = cfg.Partitions
	if _, err := bus.Setup(ctx, js, bc, names); err != nil {
		return ShardsResult{}, err
	}
	if err := publishBacklog(js, cfg.Drain); err != nil {
		return ShardsResult{}, err
	}
	last, err := partitionLastSeqs(ctx, js, cfg.Partitions)
	if err != nil {
		return ShardsResult{}, err
	}
	total := cfg.Drain.Requests + cfg.Drain.Activities

	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	router, err := shards.Load(wctx, js, pools, log)
	if err != nil {
		return ShardsResult{}, err
	}
	ac := allocatorConfig(cfg.Drain.Allocator)
	ac.Partitions = cfg.Partitions
	res := ShardsResult{PartitionsOf: map[string][]int{}}
	routes := make([]shards.Route, cfg.Partitions)
	all := make([]*allocator.Allocator, 0, cfg.Partitions)
	defer func() {
		for _, a := range all {
			a.Stop()
		}
	}()
	start := time.Now()
	for p := range cfg.Partitions {
		rt, err := router.Route(p)
		if err != nil {
			return ShardsResult{}, err
		}
		routes[p] = rt
		res.PartitionsOf[rt.Shard] = append(res.PartitionsOf[rt.Shard], p)
		a, err := allocator.New(ac, allocator.Deps{DB: rt.DB, Tenure: router.Tenure(rt), NATS: nc, Log: log, Partition: p})
		if err != nil {
			return ShardsResult{}, err
		}
		if err := a.Start(ctx); err != nil {
			return ShardsResult{}, err
		}
		all = append(all, a)
	}
	if cfg.Drain.AfterStart != nil {
		cfg.Drain.AfterStart()
	}
	for p, rt := range routes {
		if last[p] == 0 {
			continue // no request landed in p
		}
		if err := waitFence(ctx, rt.DB, p, last[p], 5*time.Minute); err != nil {
			return ShardsResult{}, fmt.Errorf("partition %d on shard %s: %w", p, rt.Shard, err)
		}
	}
	res.DrainResult = DrainResult{Decisions: total, Elapsed: time.Since(start)}
	return res, nil
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
