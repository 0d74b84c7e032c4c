// Command allocator is allot's single consumer: it applies the requests of
// one partition of ALLOT_REQUESTS in MySQL transactions and relays events.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/store"
)

const binary = "allocator"

type cfg struct {
	config.Common
	allocator.Env
}

func (c *cfg) Validate() error {
	if err := c.Common.Validate(); err != nil {
		return err
	}
	if c.NATSURL == "" {
		return fmt.Errorf("ALLOT_NATS_URL is empty: set it to your NATS server, or use `make run`, which embeds one")
	}
	return c.Env.Validate()
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
	err = allocator.Run(ctx, c.RunConfig(), db, nc, log)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", binary, err)
		return 1
	}
	return 0
}
