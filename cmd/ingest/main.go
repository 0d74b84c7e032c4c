// Command ingest serves allot's HTTP API: it validates requests, publishes
// them to JetStream and answers 202 after the PubAck. Wiring only: the
// service lives in internal/ingest.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/ingest"
	"github.com/allot-dev/allot/internal/store"
)

const binary = "ingest"

// cfg is ingest's configuration, read from ALLOT_ variables.
type cfg struct {
	config.Common
	HTTPAddr        string        `envconfig:"HTTP_ADDR" default:":8080" desc:"HTTP listen address"`
	IDSecret        string        `envconfig:"ID_SECRET" desc:"key of the request-id checksum; the same on every ingest instance; empty = built-in default"`
	PublishTimeout  time.Duration `envconfig:"INGEST_PUBLISH_TIMEOUT" default:"5s" desc:"bound on one publish to JetStream, PubAck included"`
	ShutdownTimeout time.Duration `envconfig:"INGEST_SHUTDOWN_TIMEOUT" default:"15s" desc:"bound on the graceful shutdown"`
	StreamReplicas  int           `envconfig:"STREAM_REPLICAS" default:"1" desc:"replicas of the streams and the idempotency bucket"`
	UserRate        float64       `envconfig:"INGEST_USER_RATE" default:"20" desc:"writes per second per user, 429 beyond; 0 = off"`
	RateLimit       float64       `envconfig:"INGEST_RATE_LIMIT" default:"0" desc:"accepted writes per second of this instance, 429 beyond; 0 = off"`
	Partitions      int           `envconfig:"PARTITIONS" default:"1" desc:"partitions of the request stream, fixed when it is created"`
	Shed            bool          `envconfig:"SHED" default:"true" desc:"answer claims for a full activity at once from the allocator's view"`
	MaxInFlight     int           `envconfig:"INGEST_MAX_IN_FLIGHT" default:"2048" desc:"publishes awaiting their PubAck; 503 beyond"`
}

// Validate reports the first invalid value as one sentence.
func (c cfg) Validate() error {
	if err := c.Common.Validate(); err != nil {
		return err
	}
	if c.NATSURL == "" {
		return errors.New("ALLOT_NATS_URL is empty: set it to a NATS server with JetStream (e.g. nats://127.0.0.1:4222), or use `make run`, which starts an embedded one")
	}
	if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
		return fmt.Errorf("ALLOT_HTTP_ADDR must be host:port or :port, got %q", c.HTTPAddr)
	}
	if c.PublishTimeout <= 0 || c.PublishTimeout > time.Minute {
		return fmt.Errorf("ALLOT_INGEST_PUBLISH_TIMEOUT must be between 0 and 1m, got %s", c.PublishTimeout)
	}
	if c.ShutdownTimeout <= 0 {
		return fmt.Errorf("ALLOT_INGEST_SHUTDOWN_TIMEOUT must be positive, got %s", c.ShutdownTimeout)
	}
	if c.StreamReplicas < 1 || c.StreamReplicas > 5 {
		return fmt.Errorf("ALLOT_STREAM_REPLICAS must be between 1 and 5, got %d", c.StreamReplicas)
	}
	if c.MaxInFlight < 1 || c.MaxInFlight > 4000 {
		return fmt.Errorf("ALLOT_INGEST_MAX_IN_FLIGHT must be between 1 and 4000, got %d", c.MaxInFlight)
	}
	if c.Partitions < 1 || c.Partitions > 1024 {
		return fmt.Errorf("ALLOT_PARTITIONS must be between 1 and 1024, got %d", c.Partitions)
	}
	if c.UserRate < 0 {
		return fmt.Errorf("ALLOT_INGEST_USER_RATE must not be negative, got %g", c.UserRate)
	}
	if c.RateLimit < 0 {
		return fmt.Errorf("ALLOT_INGEST_RATE_LIMIT must not be negative, got %g", c.RateLimit)
	}
	return nil
}

func main() {
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

	db, err := store.Open(ctx, c.MySQLDSN, c.MySQLMaxConns)
	if err != nil {
		return fail(mysqlError(c.MySQLDSN, err))
	}
	defer db.Close()

	nc, err := bus.Connect(c.NATSURL, binary, log)
	if err != nil {
		return fail(fmt.Errorf("NATS is unreachable at %s: %v — start nats-server -js or use `make run`", c.NATSURL, cause(err)))
	}
	defer drain(nc, log)

	err = ingest.Run(ctx, ingest.RunConfig{
		HTTPAddr: c.HTTPAddr,
		Options: ingest.Options{
			IDSecret:       c.IDSecret,
			PublishTimeout: c.PublishTimeout,
			StreamReplicas: c.StreamReplicas,
			RateLimit:      c.RateLimit,
			UserRate:       c.UserRate,
			DisableShed:    !c.Shed,
			Partitions:     c.Partitions,
			MaxInFlight:    c.MaxInFlight,
		},
		ShutdownTimeout: c.ShutdownTimeout,
	}, db, nc, log)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", binary, err)
		if errors.Is(err, bus.ErrUnavailable) {
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
