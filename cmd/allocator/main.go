// Command allocator is allot's single consumer: it applies the requests of
// ALLOT_REQUESTS, partition by partition, in MySQL transactions and relays
// their events. It applies the schema migrations before it consumes; with
// -migrate-only it applies them and exits, for a deploy's migration step.
//
// Usage:
//
//	allocator                 # migrate, then consume until SIGINT/SIGTERM
//	allocator -migrate-only   # migrate every shard (ALLOT_MYSQL_DSN or ALLOT_MYSQL_SHARDS) and exit 0
//
// With several shards, one that does not answer stops only its
// partitions: the allocator starts the others' and migrates it, and starts
// its partitions, once it answers. -migrate-only migrates those that
// answer and exits 2 naming each that does not.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/go-sql-driver/mysql"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/allocator/shardup"
	"github.com/allot-dev/allot/internal/binaries"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/store"
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
	config.TuneGC(os.Getenv)
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
	// With several, a shard that does not answer stops only its
	// partitions: its pool connects once it answers.
	pools, err := shards.OpenPools(ctx, set, func(ctx context.Context, dsn string) (*sql.DB, error) {
		sdsn, err := c.SessionDSN(dsn)
		if err != nil {
			return nil, err
		}
		db, err := store.Open(ctx, sdsn, c.MySQLMaxConns)
		if err != nil && set.Len() > 1 && down(err) {
			if !c.migrateOnly { // which says it at the end
				log.WarnContext(ctx, "a MySQL shard does not answer at start: its partitions wait for it, the others start", slog.Any("err", err))
			}
			return store.OpenLater(sdsn, c.MySQLMaxConns)
		}
		return db, err
	})
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v — start MariaDB/MySQL or set ALLOT_MYSQL_DSN (ALLOT_MYSQL_SHARDS)\n", binary, err)
		return 2
	}
	defer pools.Close()
	if c.migrateOnly {
		return migrateEvery(ctx, pools, log, stderr)
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

// migrateEvery migrates every shard, at once, and returns the exit code:
// 0 when all are migrated; else one line per shard that is not, and 2 when
// one of several did not answer (start it and run again), 1 when a
// migration failed. The shards that answer are migrated whatever the
// others do.
func migrateEvery(ctx context.Context, pools shards.Pools, log *slog.Logger, stderr io.Writer) int {
	names := pools.Names()
	errs := make([]error, len(names))
	downs := make([]bool, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() { downs[i], errs[i] = shardup.Migrate(ctx, pools[name]) })
	}
	wg.Wait()
	code := 0
	for i, err := range errs {
		switch {
		case err == nil:
		case downs[i] && len(names) > 1:
			fmt.Fprintf(stderr, "%s: shard %s does not answer, not migrated: %v — start it and run -migrate-only again\n", binary, names[i], err)
			code = 2
		default:
			fmt.Fprintf(stderr, "%s: shard %s: %v\n", binary, names[i], err)
			code = max(code, 1)
		}
	}
	if code == 0 {
		log.InfoContext(ctx, "schema migrated; exiting (-migrate-only)")
	}
	return code
}

// down reports whether err, of store.Open, says the server does not
// answer (not that it answered with an error: access denied, no such
// database).
func down(err error) bool {
	_, answered := errors.AsType[*mysql.MySQLError](err)
	return errors.Is(err, store.ErrUnreachable) && !answered
}
