package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/shards/move"
	"github.com/allot-dev/allot/internal/store"
)

// runMove is `allotctl shards move -partition P -to SHARD` (or -undo):
// it moves partition P's MySQL state to SHARD online (package move,
// docs/shards.md), printing each step and its time. 0 done, 1 failed
// (run it again to resume it, or -undo before the flip), 2 bad usage or
// configuration, or refused because another run holds the move's lease.
func runMove(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(binary+" shards move", flag.ContinueOnError)
	fs.SetOutput(stderr)
	partition := fs.Int("partition", -1, "the partition to move (required)")
	to := fs.String("to", "", "the shard of ALLOT_MYSQL_SHARDS to move it to")
	undo := fs.Bool("undo", false, "undo the partition's move under way (before it flipped the map): the partition back on its old shard")
	settle := fs.Duration("settle", 10*time.Second, "how long to wait to see the partition applied on its new shard before its old rows are deleted")
	lease := fs.Duration("lease", move.DefaultLease, "how long the run holds the move without renewing it (renewed every third of that); a run killed keeps the next one out this long")
	if code := config.ParseFlags(fs, args); code >= 0 {
		return code
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "%s: shards move takes no arguments, got %q: use -partition P -to SHARD\n", binary, fs.Args())
		return 2
	case *partition < 0:
		fmt.Fprintf(stderr, "%s: shards move needs -partition P (a partition of the request stream)\n", binary)
		return 2
	case *undo && *to != "":
		fmt.Fprintf(stderr, "%s: -undo takes no -to: it gives the partition back to the shard its move started from\n", binary)
		return 2
	case !*undo && *to == "":
		fmt.Fprintf(stderr, "%s: shards move needs -to SHARD (one of ALLOT_MYSQL_SHARDS), or -undo\n", binary)
		return 2
	case *settle < 0:
		fmt.Fprintf(stderr, "%s: -settle must be 0 or more, got %s\n", binary, *settle)
		return 2
	case *lease < time.Second:
		fmt.Fprintf(stderr, "%s: -lease must be at least 1s, got %s\n", binary, *lease)
		return 2
	}
	c, js, kv, closeNATS, code := openShardMap(ctx, stderr)
	if code >= 0 {
		return code
	}
	defer closeNATS()
	_, partitions, err := bus.CheckRequestStream(ctx, js, 0)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		if bus.IsSetupError(err) {
			return 2
		}
		return 1
	}
	set, _ := c.Shards() // checked by Validate
	pools, err := shards.OpenPools(ctx, set, func(ctx context.Context, dsn string) (*sql.DB, error) { return store.Open(ctx, dsn, 4) })
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 1
	}
	defer pools.Close()
	start := time.Now()
	err = move.Run(ctx, move.Options{Partition: *partition, Partitions: partitions, To: *to, Undo: *undo,
		Pools: pools, KV: kv, JS: js, Out: stdout, Settle: *settle, Lease: *lease, Owner: owner()})
	switch {
	case err == nil:
		fmt.Fprintf(stdout, "took %s\n", time.Since(start).Round(time.Millisecond))
		return 0
	case errors.Is(err, move.ErrUsage), errors.Is(err, move.ErrLeased):
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 2
	}
	fmt.Fprintf(stderr, "%s: %v; run the same command again to resume the move, or with -undo (before the flip) to undo it\n", binary, err)
	return 1
}

// owner names this run in the move's lease: allotctl, its pid and host.
func owner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "an unknown host"
	}
	return fmt.Sprintf("%s pid %d on %s", binary, os.Getpid(), host)
}
