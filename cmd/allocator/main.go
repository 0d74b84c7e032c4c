// Command allocator is allot's single consumer: it applies the requests of
// ALLOT_REQUESTS, partition by partition, in MySQL transactions and relays
// their events. It applies the schema migrations before it consumes; with
// -migrate-only it applies them and exits, for a deploy's migration step.
//
// Usage:
//
//	allocator                 # migrate, then consume until SIGINT/SIGTERM
//	allocator -migrate-only   # migrate every shard (ALLOT_MYSQL_DSN or ALLOT_MYSQL_SHARDS) and exit 0
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/binaries"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/store/schema"
	"github.com/allot-dev/allot/internal/tracing"
)

const binary = "allocator"

type cfg struct {
	binaries.Allocator

	migrateOnly bool // -migrate-only: MySQL is all it needs
}

func (c *cfg) Validate() error {
	if err := c.Common.Validate(); err != nil {
		return err
	}
	if c.migrateOnly {
		return nil
	}
	if c.NATSURL == "" {
		return fmt.Errorf("ALLOT_NATS_URL is empty: set it to your NATS server, or use `make run`, which embeds one")
	}
	return c.Config.Validate()
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stderr))
}

// run is the whole command; it returns the exit code: 0 done, 1 failed
// while running, 2 bad usage, configuration or unreachable dependency.
func run(ctx context.Context, args []string, stderr io.Writer) int {
	flags := flag.NewFlagSet(binary, flag.ContinueOnError)
	flags.SetOutput(stderr)
	migrateOnly := flags.Bool("migrate-only", false, "apply the schema migrations to every shard (ALLOT_MYSQL_DSN, or each of ALLOT_MYSQL_SHARDS) and exit, without consuming")
	if code := config.ParseFlags(flags, args); code >= 0 {
		return code
	}
	c := cfg{migrateOnly: *migrateOnly}
	if err := config.Load(&c); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 2
	}
	config.Print(stderr, binary, &c)
	log := c.Logger(stderr, binary)
	stopTracing, err := tracing.Setup(ctx, "allot-"+binary)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 2
	}
	defer tracing.Flush(stopTracing, log)
	set, err := c.Shards()
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 2
	}
	// One pool per shard of ALLOT_MYSQL_SHARDS (without it: ALLOT_MYSQL_DSN
	// as the one shard, default), each with the allocator's session DSN.
	pools, err := shards.OpenPools(ctx, set, func(ctx context.Context, dsn string) (*sql.DB, error) {
		sdsn, err := c.SessionDSN(dsn)
		if err != nil {
			return nil, err
		}
		return store.Open(ctx, sdsn, c.MySQLMaxConns)
	})
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v — start MariaDB/MySQL or set ALLOT_MYSQL_DSN (ALLOT_MYSQL_SHARDS)\n", binary, err)
		return 2
	}
	defer pools.Close()
	if c.migrateOnly {
		for _, name := range pools.Names() {
			if err := schema.Migrate(ctx, pools[name]); err != nil {
				fmt.Fprintf(stderr, "%s: shard %s: %v\n", binary, name, err)
				return 1
			}
		}
		log.InfoContext(ctx, "schema migrated; exiting (-migrate-only)")
		return 0
	}
	nc, err := c.ConnectNATS(binary, log)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 2
	}
	defer nc.Drain() //nolint:errcheck
	err = allocator.Run(ctx, c.Config, allocator.Deps{DB: pools[set.Names()[0]], Shards: pools, NATS: nc, Log: log})
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		if bus.IsSetupError(err) { // a stream missing or not as set up
			return 2
		}
		return 1
	}
	return 0
}
