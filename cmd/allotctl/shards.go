package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/store"
)

// shardsWait bounds how long `allotctl shards` waits for NATS and MySQL.
const shardsWait = 30 * time.Second

type shardsCfg struct{ config.Common }

func (c *shardsCfg) Validate() error {
	if err := c.Common.Validate(); err != nil {
		return err
	}
	if c.NATSURL == "" {
		return errors.New("ALLOT_NATS_URL is empty: set it to your NATS server")
	}
	return nil
}

// runShards is `allotctl shards`: the map, one line a partition (its
// shard, epoch and KV revision) and the partition's fence, the stream
// sequence of the last message applied, read from ALLOT_MYSQL_DSN (the one
// database every partition is applied in today). 0 done, 1 the map could
// not be read, 2 bad usage, configuration or a map not set up.
func runShards(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(binary+" shards", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if code := config.ParseFlags(fs, args); code >= 0 {
		return code
	}
	var c shardsCfg
	if err := config.Load(&c); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 2
	}
	log := c.Logger(stderr, binary)
	nc, js, err := connect(c.Common, log)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 2
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, shardsWait)
	defer cancel()
	kv, err := bus.CheckBucket(ctx, js, bus.ShardsBucketConfig(1))
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		if bus.IsSetupError(err) {
			return 2
		}
		return 1
	}
	m, err := shards.Read(ctx, kv)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 1
	}
	fences, ferr := readFences(ctx, c.MySQLDSN)
	if ferr != nil {
		fmt.Fprintf(stderr, "%s: fences not shown: %v\n", binary, ferr)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tSHARD\tEPOCH\tREVISION\tFENCE")
	for _, pl := range m {
		fence := "-"
		if f, ok := fences[pl.Partition]; ok {
			fence = fmt.Sprint(f)
		} else if ferr == nil {
			fence = "0" // nothing applied on this partition yet
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%s\n", pl.Partition, pl.Shard, pl.Epoch, pl.Revision, fence)
	}
	tw.Flush()
	return 0
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
