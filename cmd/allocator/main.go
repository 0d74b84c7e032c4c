// Command allocator is allot's single consumer: it applies the requests of
// one partition of ALLOT_REQUESTS in MySQL transactions and relays events.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/store"
)

const binary = "allocator"

type cfg struct {
	config.Common
	Partitions  int           `envconfig:"PARTITIONS" default:"1" desc:"partitions of the request stream, fixed when it is created"`
	PinnedTTL   time.Duration `envconfig:"PINNED_TTL" default:"5s" desc:"failover time: how long a partition stays pinned to an allocator that stopped pulling"`
	BatchSize   int           `envconfig:"BATCH_SIZE" default:"500"`
	BatchWait   time.Duration `envconfig:"BATCH_WAIT" default:"2ms"`
	MetricsAddr string        `envconfig:"METRICS_ADDR" default:":9091"`
}

func (c *cfg) Validate() error {
	if err := c.Common.Validate(); err != nil {
		return err
	}
	if c.NATSURL == "" {
		return fmt.Errorf("ALLOT_NATS_URL is empty: set it to your NATS server, or use `make run`, which embeds one")
	}
	if c.BatchSize < 1 || c.BatchSize > 10_000 {
		return fmt.Errorf("ALLOT_BATCH_SIZE must be between 1 and 10000, got %d", c.BatchSize)
	}
	if c.BatchWait < 0 || c.BatchWait > time.Second {
		return fmt.Errorf("ALLOT_BATCH_WAIT must be between 0 and 1s, got %s", c.BatchWait)
	}
	if c.Partitions < 1 || c.Partitions > 1024 {
		return fmt.Errorf("ALLOT_PARTITIONS must be between 1 and 1024, got %d", c.Partitions)
	}
	if c.PinnedTTL < time.Second {
		return fmt.Errorf("ALLOT_PINNED_TTL must be at least 1s, got %s", c.PinnedTTL)
	}
	return nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx))
}

func run(ctx context.Context) int {
	var c cfg
	if err := config.Load(&c); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", binary, err)
		return 2
	}
	config.Print(os.Stderr, binary, &c)
	log := c.Logger(os.Stderr, binary)
	db, err := store.Open(ctx, c.MySQLDSN, c.MySQLMaxConns)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v — start MariaDB/MySQL or set ALLOT_MYSQL_DSN\n", binary, err)
		return 2
	}
	defer db.Close()
	nc, err := bus.Connect(c.NATSURL, binary, log)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v — start NATS with JetStream or set ALLOT_NATS_URL\n", binary, err)
		return 2
	}
	defer nc.Drain() //nolint:errcheck
	err = allocator.Run(ctx, allocator.RunConfig{
		Config: allocator.Config{Partitions: c.Partitions, PinnedTTL: c.PinnedTTL,
			BatchSize: c.BatchSize, BatchWait: c.BatchWait},
		MetricsAddr: c.MetricsAddr,
	}, db, nc, log)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", binary, err)
		return 1
	}
	return 0
}
