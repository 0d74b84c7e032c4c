package main

// The shard benchmark (make bench-shards): the main run's drain of joins
// over 1,000 activities, applied on 1 MySQL shard and on 3, in one run;
// then, on the 3, the move of a partition with 100,000 signups to another
// shard (package move, as `allotctl shards move` runs it) while the other
// partitions drain. The shards are private mariadbd (or mysqld) servers on
// this machine, so they share its cores and its disk: the figures show
// what routing and a move cost on one machine, not what separate machines
// would give (docs/performance.md, "Shards").

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/allot-dev/allot/internal/bench"
	"github.com/allot-dev/allot/internal/devdb"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/store/schema"
)

// shardCounts are the runs of the shard benchmark, side by side.
var shardCounts = []int{1, 3}

// shardServers starts n private servers, each with a fresh data directory
// under a temporary directory, and returns their DSNs and what stops them
// all.
func shardServers(ctx context.Context, n int) ([]string, func(), error) {
	dir, err := os.MkdirTemp("", "allot-bench-shards-")
	if err != nil {
		return nil, nil, err
	}
	var dbs []*devdb.DB
	stop := func() {
		for _, db := range dbs {
			if err := db.Stop(); err != nil {
				fmt.Fprintf(os.Stderr, "bench: stop a shard server: %v\n", err)
			}
		}
		os.RemoveAll(dir)
	}
	dsns := make([]string, 0, n)
	for i := range n {
		db, err := devdb.StartServer(ctx, filepath.Join(dir, "s"+strconv.Itoa(i)), "root@tcp(127.0.0.1:3306)/allot_bench?parseTime=true", io.Discard)
		if err != nil {
			stop()
			return nil, nil, fmt.Errorf("start shard server %d of %d: %w", i+1, n, err)
		}
		dbs = append(dbs, db)
		dsns = append(dsns, db.DSN)
	}
	return dsns, stop, nil
}

// onShards runs f on the first k of servers, each with a fresh migrated
// database (shards s0, s1, … in that order, as ALLOT_MYSQL_SHARDS would
// list them), and a fresh JetStream server.
func onShards(ctx context.Context, o opts, log *slog.Logger, servers []string, k int, f func(shards.Pools, []string, *nats.Conn) error) error {
	pools := shards.Pools{}
	var names []string
	defer func() {
		for _, db := range pools {
			db.Close()
		}
	}()
	for i := range k {
		dsn, drop, err := freshDB(ctx, servers[i], "allot_bench_shard_")
		if err != nil {
			return err
		}
		defer drop()
		db, err := store.Open(ctx, dsn, 16)
		if err != nil {
			return err
		}
		name := "s" + strconv.Itoa(i)
		pools[name], names = db, append(names, name)
		if err := schema.Migrate(ctx, db); err != nil {
			return fmt.Errorf("migrate shard %s: %w", name, err)
		}
	}
	return withNATS(o, log, func(nc *nats.Conn) error { return f(pools, names, nc) })
}

// drainOnShards is one drain of cfg on the first k servers.
func drainOnShards(ctx context.Context, o opts, log *slog.Logger, servers []string, k int, cfg bench.DrainConfig) (bench.ShardsResult, error) {
	var res bench.ShardsResult
	err := onShards(ctx, o, log, servers, k, func(pools shards.Pools, names []string, nc *nats.Conn) error {
		var err error
		res, err = bench.DrainShards(ctx, pools, names, nc, log, bench.ShardsConfig{Drain: cfg, Partitions: o.shardPartitions})
		return err
	})
	return res, err
}

// shardsBench is -shards-only: the drains, then (-move-signups) the move.
func shardsBench(ctx context.Context, o opts) error {
	if o.shardPartitions < slices.Max(shardCounts) {
		return fmt.Errorf("-shard-partitions must be at least %d, one partition per shard of the largest run", slices.Max(shardCounts))
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	fmt.Fprintf(os.Stderr, "bench: starting %d private MySQL servers (the shards)\n", slices.Max(shardCounts))
	servers, stop, err := shardServers(ctx, slices.Max(shardCounts))
	if err != nil {
		return err
	}
	defer stop()
	cfg := o.spreadJoins()
	cfg.Allocator = o.allocator()
	// A first, small drain on every server warms them up; not reported.
	warm := cfg
	warm.Requests = 2000
	if _, err := drainOnShards(ctx, o, log, servers, slices.Max(shardCounts), warm); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	// Rounds alternate the shard counts, so that a drift of the machine
	// (page cache, another process) falls on both alike.
	runs := map[int][]bench.ShardsResult{}
	for round := range max(o.repeat, 1) {
		for _, k := range shardCounts {
			res, err := drainOnShards(ctx, o, log, servers, k, cfg)
			if err != nil {
				return fmt.Errorf("drain on %d shards: %w", k, err)
			}
			fmt.Fprintf(os.Stderr, "  round %d, %d shard(s): %.0f requests/s\n", round+1, k, res.PerSecond())
			runs[k] = append(runs[k], res)
		}
	}
	med := map[int]bench.ShardsResult{}
	for _, k := range shardCounts {
		r := runs[k]
		slices.SortFunc(r, func(a, b bench.ShardsResult) int { return cmp.Compare(a.PerSecond(), b.PerSecond()) })
		med[k] = r[len(r)/2]
	}

	fmt.Printf("\n== shards: %d joins over 1,000 activities (messages of up to %d), %d partitions, on 1 and %d MySQL shards of this machine (median of %d, alternating; %s) ==\n",
		cfg.Requests, cfg.Batch, o.shardPartitions, slices.Max(shardCounts), max(o.repeat, 1), loadAverage())
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "shards\trequests/s\tdetail\tpartitions by shard\t")
	for _, k := range shardCounts {
		r := med[k]
		fmt.Fprintf(tw, "%d\t%.0f\t%d decisions in %s\t%s\t\n", k, r.PerSecond(), r.Decisions, r.Elapsed.Round(time.Millisecond), byShard(r.PartitionsOf))
	}
	tw.Flush()
	first, last := shardCounts[0], shardCounts[len(shardCounts)-1]
	fmt.Printf("ratio %d shards / %d shard: %.2f (every server on this machine, sharing its cores and its disk)\n",
		last, first, med[last].PerSecond()/med[first].PerSecond())
	if o.moveSignups <= 0 {
		return nil
	}
	return moveBench(ctx, o, log, servers)
}

// moveBench measures, on the 3 servers, the move of partition 0 (on s0)
// to s1 with its -move-signups signups, while the other partitions drain
// -move-requests joins, next to their drain of as many without a move
// (bench.MoveShards), and prints the move's own report.
func moveBench(ctx context.Context, o opts, log *slog.Logger, servers []string) error {
	k := slices.Max(shardCounts)
	cfg := bench.MoveConfig{Partitions: o.shardPartitions, Partition: 0, To: "s1", Activities: 1000, Capacity: 10,
		Signups: o.moveSignups, Requests: o.moveRequests, DuringRequests: o.moveDuring, Waiting: o.moveWaiting, Batch: o.drainBatch, Allocator: o.allocator(), Progress: os.Stderr}
	fmt.Fprintf(os.Stderr, "bench: moving partition 0 with %d signups from s0 to s1 while the others drain %d joins (%d before and after)\n", cfg.Signups, cfg.DuringRequests, cfg.Requests)
	var res bench.MoveResult
	err := onShards(ctx, o, log, servers, k, func(pools shards.Pools, names []string, nc *nats.Conn) error {
		var err error
		res, err = bench.MoveShards(ctx, pools, names, nc, log, cfg)
		return err
	})
	if err != nil {
		return fmt.Errorf("move: %w", err)
	}
	fmt.Printf("\n== shards: a move of partition 0 (%d signups) from %s to %s while the other %d partitions drain, %d MySQL shards of this machine (%s) ==\n",
		res.Signups, res.From, res.To, o.shardPartitions-1, k, loadAverage())
	for _, line := range strings.Split(strings.TrimRight(res.Report, "\n"), "\n") {
		fmt.Println("  " + line)
	}
	fmt.Printf("partition 0 was frozen for %s; the whole move took %s (steps: %s)\n",
		res.Frozen, res.Took.Round(time.Millisecond), stepTimes(res.Steps))
	fmt.Println("the other partitions' drains, each measured while all of them had requests waiting:")
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "drain\trequests/s\tdetail\t")
	fmt.Fprintf(tw, "without a move, before it\t%.0f\t%d requests in %s\t\n", res.Without.PerSecond(), res.Without.Decisions, res.Without.Elapsed.Round(time.Millisecond))
	during := fmt.Sprintf("%d requests in %s, the whole move", res.During.Decisions, res.During.Elapsed.Round(time.Millisecond))
	if !res.Covered {
		during = fmt.Sprintf("%d requests in %s, until one ran out, in the move's %s step", res.During.Decisions, res.During.Elapsed.Round(time.Millisecond), res.Until)
	}
	fmt.Fprintf(tw, "during the move\t%.0f\t%s\t\n", res.During.PerSecond(), during)
	fmt.Fprintf(tw, "without a move, after it\t%.0f\t%d requests in %s\t\n", res.WithoutAfter.PerSecond(), res.WithoutAfter.Decisions, res.WithoutAfter.Elapsed.Round(time.Millisecond))
	tw.Flush()
	without := (res.Without.PerSecond() + res.WithoutAfter.PerSecond()) / 2
	fmt.Printf("ratio during / without (the mean of before and after, %.0f): %.2f\n", without, res.During.PerSecond()/without)
	var counts []string
	for _, name := range slices.Sorted(maps.Keys(res.Results)) {
		counts = append(counts, fmt.Sprintf("%s %d", name, res.Results[name]))
	}
	fmt.Printf("checked: %d requests, each applied once, on its partition's shard (results: %s); partition 0's rows on %s only; audit %s\n",
		res.Requests, strings.Join(counts, ", "), res.To, res.Audit)
	return nil
}

// stepTimes prints steps as "freeze 12ms, copy 2.1s, …".
func stepTimes(steps []bench.MoveStep) string {
	out := make([]string, len(steps))
	for i, s := range steps {
		out[i] = s.Name + " " + s.Took.String()
	}
	return strings.Join(out, ", ")
}

// byShard prints a shard → partitions map as "s0: 0,3  s1: 1,4".
func byShard(m map[string][]int) string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(m)) {
		ps := make([]string, len(m[name]))
		for i, p := range m[name] {
			ps[i] = strconv.Itoa(p)
		}
		out = append(out, name+": "+strings.Join(ps, ","))
	}
	return strings.Join(out, "  ")
}
