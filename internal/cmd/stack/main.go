// Command stack is `make run`: the whole allot stack in one process on this
// machine. With ALLOT_NATS_URL empty it starts an embedded JetStream server
// (store under ./var/nats); it creates the database if missing, migrates it,
// runs the setup step (`allotctl setup`'s streams and buckets), then runs
// the allocator and ingest until Ctrl-C, and stops them cleanly.
//
// With -reset (`make reset`) it deletes what the stack keeps instead, the
// embedded server's store and the database named in ALLOT_MYSQL_DSN, so
// that the next start begins empty. The two belong together: a request
// stream created anew under a database that applied an older one is
// refused, since its sequence numbers would fall below MySQL's fence.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/binaries"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/ingest"
	"github.com/allot-dev/allot/internal/ingest/access"
	"github.com/allot-dev/allot/internal/lifecycle"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/tracing"
)

const binary = "stack"

type cfg binaries.Stack

func (c *cfg) Validate() error {
	if err := c.Common.Validate(); err != nil {
		return err
	}
	if c.NATSPort < 1 || c.NATSPort > 65535 {
		return fmt.Errorf("ALLOT_EMBEDDED_NATS_PORT must be a port number, got %d", c.NATSPort)
	}
	if err := c.IngestEnv.Validate(); err != nil {
		return err
	}
	if err := c.SetupEnv.Validate(); err != nil {
		return err
	}
	return c.AllocatorEnv.Validate()
}

// defaultHTTPAddr is make run's ingest address: loopback only.
const defaultHTTPAddr = "127.0.0.1:8080"

func main() {
	config.TuneGC(os.Getenv)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string) int {
	flags := flag.NewFlagSet(binary, flag.ContinueOnError)
	reset := flags.Bool("reset", false, "delete the embedded NATS store and the database named in ALLOT_MYSQL_DSN, then exit")
	if code := config.ParseFlags(flags, args); code >= 0 {
		return code
	}
	// make run serves this machine only: on a loopback address ingest may
	// run without authentication (it says so), anywhere else it needs a key.
	if _, set := os.LookupEnv("ALLOT_HTTP_ADDR"); !set {
		os.Setenv("ALLOT_HTTP_ADDR", defaultHTTPAddr)
	}
	var c cfg
	if err := config.Load(&c); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", binary, err)
		return 2
	}
	if *reset {
		return resetStack(ctx, c, os.Stderr)
	}
	config.Print(os.Stderr, binary, &c)
	log := c.Logger(os.Stderr, binary)
	stopTracing, err := tracing.Setup(ctx, "allot") // ingest and allocator in one process
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", binary, err)
		return 2
	}
	defer tracing.Flush(stopTracing, log)

	if err := store.EnsureDatabase(ctx, c.MySQLDSN); err != nil {
		if errors.Is(err, store.ErrUnreachable) {
			fmt.Fprintf(os.Stderr, "%s: %v\n  `make run` starts a private MariaDB/MySQL when none answers; or start one yourself, or point ALLOT_MYSQL_DSN at one\n", binary, err)
		} else {
			fmt.Fprintf(os.Stderr, "%s: %v\n", binary, err)
		}
		return 2
	}

	natsURL := c.NATSURL
	if natsURL == "" {
		dir, _ := filepath.Abs(c.NATSStore)
		srv, err := bus.RunServer(bus.ServerConfig{Port: c.NATSPort, StoreDir: dir, SyncInterval: c.NATSSync})
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v — set ALLOT_EMBEDDED_NATS_PORT or ALLOT_NATS_URL\n", binary, err)
			return 2
		}
		defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
		natsURL = srv.ClientURL()
		log.Info("embedded nats running", "url", natsURL, "store_dir", dir)
	}

	// The setup step first, as `allotctl setup` would run it: the
	// allocator and ingest only check the streams and buckets.
	if code := setup(ctx, c, natsURL); code != 0 {
		return code
	}

	// Each part gets its own pool and connection, as separate processes would.
	var parts []lifecycle.Part
	for _, name := range []string{"allocator", "ingest"} {
		dsn := c.MySQLDSN
		if name == "allocator" {
			var err error
			if dsn, err = c.AllocatorEnv.SessionDSN(dsn); err != nil {
				fmt.Fprintf(os.Stderr, "%s: %v\n", binary, err)
				return 2
			}
		}
		db, err := store.Open(ctx, dsn, c.MySQLMaxConns)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", binary, err)
			return 2
		}
		defer db.Close()
		plog := c.Logger(os.Stderr, name)
		var nopts []nats.Option
		if c.NATSURL != "" { // the embedded server needs no credentials
			if nopts, err = c.NATSOptions(); err != nil {
				fmt.Fprintf(os.Stderr, "%s: %v\n", binary, err)
				return 2
			}
		}
		nc, err := bus.Connect(natsURL, name, plog, nopts...)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", binary, err)
			return 2
		}
		defer nc.Drain() //nolint:errcheck
		switch name {
		case "allocator":
			parts = append(parts, lifecycle.Part{Name: name, Run: func(ctx context.Context) error {
				return allocator.Run(ctx, c.AllocatorEnv, allocator.Deps{DB: db, NATS: nc, Log: plog})
			}})
		case "ingest":
			parts = append(parts, lifecycle.Part{Name: name, Run: func(ctx context.Context) error {
				return ingest.Run(ctx, c.IngestEnv, ingest.Deps{DB: db, NATS: nc, Log: plog})
			}})
		}
	}

	fmt.Fprintf(os.Stderr, "\nallot is up: %s  (NATS %s, MySQL %s)\n%s\nCtrl-C stops everything.\n\n",
		baseURL(c.HTTPAddr), config.MaskURL(natsURL), config.MaskDSN(c.MySQLDSN), authLine(c.IngestEnv.AuthConfig))
	// One part stopping stops the stack; the first error is the one said.
	code := 0
	if err := lifecycle.Run(ctx, parts...); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", binary, err)
		if errors.Is(err, store.ErrStreamReplaced) {
			fmt.Fprintf(os.Stderr, "  the NATS store (%s) and the database no longer belong together: restore the store, or start over with both empty: make reset\n", c.NATSStore)
		}
		code = 1
	}
	fmt.Fprintln(os.Stderr, "allot stopped.")
	return code
}

// setup runs `allotctl setup`'s function in process, with its own
// connection, and prints what it did.
func setup(ctx context.Context, c cfg, natsURL string) int {
	log := c.Logger(os.Stderr, "allotctl")
	var nopts []nats.Option
	if c.NATSURL != "" {
		var err error
		if nopts, err = c.NATSOptions(); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", binary, err)
			return 2
		}
	}
	nc, err := bus.Connect(natsURL, "allotctl", log, nopts...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", binary, err)
		return 2
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", binary, err)
		return 2
	}
	var shardNames []string
	if set, err := c.Shards(); err == nil {
		shardNames = set.Names()
	}
	changes, err := bus.SetupWait(ctx, js, c.SetupEnv, shardNames, log)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: setup: %v\n", binary, err)
		return 2
	}
	fmt.Fprintln(os.Stderr, "setup: the streams and buckets")
	bus.WriteChanges(os.Stderr, changes)
	return 0
}

// baseURL is the URL a browser on this machine opens for the listen
// address addr: a wildcard host (":8080", "0.0.0.0:8080", "[::]:8080")
// reads localhost, a named host stays as it is.
func baseURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port)
}

// resetStack deletes the embedded server's store and the database, for a
// stack that starts over empty. It refuses when ALLOT_NATS_URL names a
// server of its own: that server's streams are not the stack's to delete,
// and dropping the database alone would leave them ahead of it.
func resetStack(ctx context.Context, c cfg, out io.Writer) int {
	if c.NATSURL != "" {
		fmt.Fprintf(out, "%s: -reset only starts over the stack's embedded NATS server; with ALLOT_NATS_URL set, delete the streams there and the database yourself\n", binary)
		return 2
	}
	name, err := store.DropDatabase(ctx, c.MySQLDSN)
	if err != nil {
		fmt.Fprintf(out, "%s: %v\n", binary, err)
		return 2
	}
	dir, _ := filepath.Abs(c.NATSStore)
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintf(out, "%s: database %s dropped, but the NATS store stays: %v\n", binary, name, err)
		return 1
	}
	fmt.Fprintf(out, "%s: dropped database %s and deleted the NATS store %s; the next start begins empty\n", binary, name, dir)
	return 0
}

// authLine says whether the API needs tokens, and how to switch them on.
func authLine(a access.AuthConfig) string {
	if a.HS256Key != "" || a.JWKSURL != "" {
		return "Authentication is on: send Authorization: Bearer <token> (make token USER=1 mints one for ALLOT_AUTH_HS256_KEY)."
	}
	return "Authentication is off (loopback only). To require bearer tokens: ALLOT_AUTH_HS256_KEY=<32+ bytes> make run, then TOKEN=$(make -s token USER=1)."
}
