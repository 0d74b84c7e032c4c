// Command ingest serves allot's HTTP API: it validates requests, publishes
// them to JetStream and answers 202 after the PubAck. Wiring only: the
// service lives in internal/ingest.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go"

	"github.com/allot-dev/allot/internal/binaries"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/ingest"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/tracing"
)

const binary = "ingest"

// cfg is ingest's configuration, read from ALLOT_ variables.
type cfg binaries.Ingest

// Validate reports the first invalid value as one sentence.
func (c cfg) Validate() error {
	if err := c.Common.Validate(); err != nil {
		return err
	}
	if c.NATSURL == "" {
		return errors.New("ALLOT_NATS_URL is empty: set it to a NATS server with JetStream (e.g. nats://127.0.0.1:4222), or use `make run`, which starts an embedded one")
	}
	return c.Config.Validate()
}

func main() {
	config.TuneGC(os.Getenv)
	// No flags but -version and -h: the settings are ALLOT_ variables.
	if code := config.ParseFlags(flag.NewFlagSet(binary, flag.ContinueOnError), os.Args[1:]); code >= 0 {
		os.Exit(code)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx)
	stop()
	os.Exit(code)
}

// run returns the exit code: 0 after a clean shutdown, 1 when serving
// failed, 2 for invalid configuration or an unreachable dependency.
func run(ctx context.Context) int {
	var c cfg
	err := config.Load(&c)
	config.Print(os.Stderr, binary, &c)
	if err != nil {
		return fail(err)
	}
	log := c.Logger(os.Stderr, binary)
	stopTracing, err := tracing.Setup(ctx, "allot-"+binary)
	if err != nil {
		return fail(err)
	}
	defer tracing.Flush(stopTracing, log)

	set, err := c.Shards()
	if err != nil {
		return fail(err)
	}
	// One pool per shard of ALLOT_MYSQL_SHARDS (without it: ALLOT_MYSQL_DSN
	// as the one shard, default); reads go to each activity's shard.
	pools, err := shards.OpenPools(ctx, set, func(ctx context.Context, dsn string) (*sql.DB, error) {
		db, err := store.Open(ctx, dsn, c.MySQLMaxConns)
		if err != nil && set.Len() > 1 && errors.Is(err, store.ErrUnreachable) {
			// A shard down stops only its activities' reads, also when
			// ingest starts meanwhile: its pool connects once it answers.
			log.WarnContext(ctx, "a MySQL shard does not answer at start: its activities' reads answer 503 until it does", slog.Any("err", err))
			return store.OpenLater(dsn, c.MySQLMaxConns)
		}
		if err != nil {
			return nil, mysqlError(dsn, err)
		}
		return db, nil
	})
	if err != nil {
		if set.Len() == 1 {
			err = errors.Unwrap(err) // "shard default: " says nothing to a deployment of one database
		}
		return fail(err)
	}
	defer pools.Close()

	nopts, err := c.NATSOptions()
	if err != nil {
		return fail(err)
	}
	nc, err := bus.Connect(c.NATSURL, binary, log, nopts...)
	if err != nil {
		return fail(fmt.Errorf("NATS is unreachable at %s: %v — start nats-server -js or use `make run`", config.MaskURL(c.NATSURL), cause(err)))
	}
	defer drain(nc, log)

	err = ingest.Run(ctx, c.Config, ingest.Deps{Shards: pools, NATS: nc, Log: log})
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", binary, err)
		if errors.Is(err, bus.ErrUnavailable) || bus.IsSetupError(err) {
			return 2
		}
		return 1
	}
	return 0
}

// fail prints err as the one line of a fail-fast exit.
func fail(err error) int {
	fmt.Fprintf(os.Stderr, "%s: %v\n", binary, err)
	return 2
}

// mysqlError turns a store.Open failure into one actionable sentence.
func mysqlError(dsn string, err error) error {
	addr := "the ALLOT_MYSQL_DSN address"
	if c, perr := mysql.ParseDSN(dsn); perr == nil {
		addr = c.Addr
	}
	if me, ok := errors.AsType[*mysql.MySQLError](err); ok && me.Number == 1049 {
		return fmt.Errorf("MySQL at %s has no such database: %v — run `make run` (it migrates) or fix ALLOT_MYSQL_DSN", addr, me)
	}
	if !errors.Is(err, store.ErrUnreachable) {
		return fmt.Errorf("MySQL: %w — fix ALLOT_MYSQL_DSN", err)
	}
	return fmt.Errorf("MySQL is unreachable at %s: %v — start MariaDB/MySQL or set ALLOT_MYSQL_DSN", addr, cause(err))
}

// cause is the underlying error of a "%w at %s: %w" error of store or bus,
// whose text would otherwise repeat what the caller's sentence says.
func cause(err error) error {
	if multi, ok := err.(interface{ Unwrap() []error }); ok {
		if errs := multi.Unwrap(); len(errs) > 1 {
			return errs[len(errs)-1]
		}
	}
	return err
}

// drain lets the subscription finish and flushes pending publishes before
// the connection closes; Drain is asynchronous, so wait for it, bounded.
func drain(nc *nats.Conn, log *slog.Logger) {
	if err := nc.Drain(); err != nil {
		log.Warn("drain nats", slog.Any("err", err))
		nc.Close()
		return
	}
	deadline := time.Now().Add(5 * time.Second)
	for !nc.IsClosed() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	nc.Close()
}
