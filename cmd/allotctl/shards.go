package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// shardsWait bounds how long `allotctl shards` waits for NATS and MySQL.
const shardsWait = 30 * time.Second

type shardsCfg struct{ config.Common }

// openShardMap is how the shard commands start: the configuration, a
// connection to NATS and the map's bucket, checked. On failure it prints
// one line and returns the exit code (2 bad configuration, an unreachable
// broker or a map not set up; 1 the map could not be read), else -1 and
// the connection's close.
func openShardMap(ctx context.Context, stderr io.Writer) (shardsCfg, jetstream.JetStream, jetstream.KeyValue, func(), int) {
	var c shardsCfg
	if err := config.Load(&c); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return c, nil, nil, nil, 2
	}
	nc, js, err := connect(c.Common, c.Logger(stderr, binary))
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return c, nil, nil, nil, 2
	}
	kv, err := bus.CheckBucket(ctx, js, bus.ShardsBucketConfig(1))
	if err != nil {
		nc.Close()
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		if bus.IsSetupError(err) {
			return c, nil, nil, nil, 2
		}
		return c, nil, nil, nil, 1
	}
	return c, js, kv, nc.Close, -1
}

func (c *shardsCfg) Validate() error {
	if err := c.Common.Validate(); err != nil {
		return err
	}
	if c.NATSURL == "" {
		return errors.New("ALLOT_NATS_URL is empty: set it to your NATS server")
	}
	return nil
}

// shardWait bounds how long `allotctl shards` waits for one shard's
// answer before showing `-` for its partitions.
const shardWait = 10 * time.Second

// runShards is `allotctl shards`: the map, one line a partition (its
// shard, epoch and KV revision), the partition's fence, the stream
// sequence of the last message applied, read from the partition's own
// shard, and its lag, the messages its allocator consumer has not had
// acknowledged yet (pending plus unacknowledged). A shard that does not
// answer shows `-` for its partitions and a line on stderr naming it. 0
// done, 1 the map could not be read, 2 bad usage, configuration or a map
// not set up.
func runShards(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(binary+" shards", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if code := config.ParseFlags(fs, args); code >= 0 {
		return code
	}
	ctx, cancel := context.WithTimeout(ctx, shardsWait)
	defer cancel()
	c, js, kv, closeNATS, code := openShardMap(ctx, stderr)
	if code >= 0 {
		return code
	}
	defer closeNATS()
	m, err := shards.Read(ctx, kv)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 1
	}
	set, _ := c.Shards() // checked by config.Load
	fences := shardFences(ctx, set, m, stderr)
	lags := consumerLags(ctx, js, m, stderr)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tSHARD\tEPOCH\tREVISION\tFENCE\tLAG")
	for _, pl := range m {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%s\t%s\n", pl.Partition, pl.Shard, pl.Epoch, pl.Revision, fences[pl.Partition], lags[pl.Partition])
	}
	tw.Flush()
	return 0
}

// shardFences reads each partition's fence (allocator_partition.last_seq)
// on the shard the map puts it on, each shard once: "0" when the shard has
// no row for it yet (nothing applied), "-" when the shard does not answer
// or is not in set (one line on stderr each).
func shardFences(ctx context.Context, set shards.Set, m []shards.Placement, stderr io.Writer) map[int]string {
	out := make(map[int]string, len(m))
	byShard := map[string][]int{}
	for _, pl := range m {
		out[pl.Partition] = "-"
		byShard[pl.Shard] = append(byShard[pl.Shard], pl.Partition)
	}
	for _, name := range slices.Sorted(maps.Keys(byShard)) {
		dsn, ok := set.DSN(name)
		if !ok {
			fmt.Fprintf(stderr, "%s: the map puts partitions %v on shard %s, which ALLOT_MYSQL_SHARDS does not name (it names %s): their fences are not shown\n",
				binary, byShard[name], name, strings.Join(set.Names(), ", "))
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, shardWait)
		fences, err := readFences(sctx, dsn)
		cancel()
		if err != nil {
			fmt.Fprintf(stderr, "%s: shard %s does not answer, fences of partitions %v not shown: %v\n", binary, name, byShard[name], err)
			continue
		}
		for _, p := range byShard[name] {
			out[p] = strconv.FormatUint(fences[p], 10)
		}
	}
	return out
}

// lagWait bounds the reads of the consumers' info: a server that refuses
// them (the allotctl user without CONSUMER.INFO on ALLOT_REQUESTS) never
// answers.
const lagWait = 5 * time.Second

// consumerLags reads each partition's lag from its allocator consumer's
// info: the messages not yet delivered plus those delivered and not yet
// acknowledged. "-" when the consumer does not exist (no allocator has
// started), and for every partition from the first consumer that cannot
// be read (one line on stderr).
func consumerLags(ctx context.Context, js jetstream.JetStream, m []shards.Placement, stderr io.Writer) map[int]string {
	out := make(map[int]string, len(m))
	for _, pl := range m {
		out[pl.Partition] = "-"
	}
	ctx, cancel := context.WithTimeout(ctx, lagWait)
	defer cancel()
	for _, pl := range m {
		name := bus.AllocatorConsumer(pl.Partition)
		cons, err := js.Consumer(ctx, wire.RequestStream, name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue
		}
		var info *jetstream.ConsumerInfo
		if err == nil {
			info, err = cons.Info(ctx)
		}
		if err != nil {
			fmt.Fprintf(stderr, "%s: lags not shown: consumer %s of %s: %v (allotctl's NATS user needs $JS.API.CONSUMER.INFO.%s.*)\n",
				binary, name, wire.RequestStream, err, wire.RequestStream)
			return out
		}
		out[pl.Partition] = strconv.FormatUint(info.NumPending+uint64(info.NumAckPending), 10)
	}
	return out
}

// readFences reads every partition's fence (allocator_partition.last_seq)
// from the database of dsn.
func readFences(ctx context.Context, dsn string) (map[int]uint64, error) {
	db, err := store.Open(ctx, dsn, 1)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	return queryFences(ctx, db)
}

func queryFences(ctx context.Context, db *sql.DB) (map[int]uint64, error) {
	rows, err := db.QueryContext(ctx, "SELECT partition_id, last_seq FROM allocator_partition")
	if err != nil {
		return nil, fmt.Errorf("read fences: %w", err)
	}
	defer rows.Close()
	out := map[int]uint64{}
	for rows.Next() {
		var p int
		var seq uint64
		if err := rows.Scan(&p, &seq); err != nil {
			return nil, fmt.Errorf("read fences: %w", err)
		}
		out[p] = seq
	}
	return out, rows.Err()
}
