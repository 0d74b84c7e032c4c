// Command baseline serves one of the seed designs allot is measured against
// (the seed waitlist and flash sale) over allot's HTTP routes, so that cmd/loadgen can
// drive it exactly as it drives allot:
//
//	baseline -design gated -addr :8090
//	loadgen -url http://127.0.0.1:8090 -activity 9001 -capacity 100 -n 20000 -users 18000 -c 256
//
// Designs: claim (conditional UPDATE + UNIQUE), gated (the same behind a
// Redis DECR gate), join (SELECT … FOR UPDATE waitlist) and floor (claims
// counted in the server's memory, nothing stored: the least a claim costs
// over HTTP, which no one should run). The seed tables live in the
// ALLOT_MYSQL_DSN database with a seed_ prefix; the floor needs none.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/allot-dev/allot/internal/baseline"
	"github.com/allot-dev/allot/internal/binaries"
	"github.com/allot-dev/allot/internal/config"
)

const binary = "baseline"

// cfg is the environment: allot's common settings plus the baseline's own
// (binaries.Baseline).
type cfg binaries.Baseline

func (c *cfg) Validate() error { return c.Common.Validate() }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stderr))
}

func run(ctx context.Context, args []string, stderr io.Writer) int {
	var c cfg
	if err := config.Load(&c); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 2
	}
	fs := flag.NewFlagSet(binary, flag.ContinueOnError)
	fs.SetOutput(stderr)
	design := fs.String("design", baseline.DesignGated, "design to serve: claim, gated, join or floor")
	addr := fs.String("addr", ":8090", "listen address")
	fs.StringVar(&c.RedisAddr, "redis", c.RedisAddr, "Redis address of the gated design (ALLOT_REDIS_ADDR)")
	fs.IntVar(&c.BaselineMaxConns, "max-conns", c.BaselineMaxConns, "MySQL pool size (ALLOT_BASELINE_MYSQL_MAX_CONNS)")
	fs.StringVar(&c.MySQLDSN, "mysql-dsn", c.MySQLDSN, "go-sql-driver DSN (ALLOT_MYSQL_DSN)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	switch {
	case *design != baseline.DesignClaim && *design != baseline.DesignGated && *design != baseline.DesignJoin && *design != baseline.DesignFloor:
		fmt.Fprintf(stderr, "%s: -design must be claim, gated, join or floor, got %q\n", binary, *design)
		return 2
	case c.BaselineMaxConns < 1 || c.BaselineMaxConns > 10_000:
		fmt.Fprintf(stderr, "%s: -max-conns must be between 1 and 10000, got %d\n", binary, c.BaselineMaxConns)
		return 2
	}
	if err := c.Common.Validate(); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 2
	}
	config.Print(stderr, binary, &c)
	fmt.Fprintf(stderr, "  -design=%s -addr=%s\n", *design, *addr)
	log := c.Logger(stderr, binary)

	var db *sql.DB
	if *design != baseline.DesignFloor {
		var err error
		if db, err = baseline.Open(ctx, c.MySQLDSN, c.BaselineMaxConns); err != nil {
			fmt.Fprintf(stderr, "%s: %v — start MariaDB/MySQL or set ALLOT_MYSQL_DSN\n", binary, err)
			return 2
		}
		defer db.Close()
	}
	srv, err := baseline.NewServer(*design, db, c.RedisAddr, log)
	if err != nil {
		hint := ""
		if *design == baseline.DesignGated {
			hint = " — start Redis or set ALLOT_REDIS_ADDR"
		}
		fmt.Fprintf(stderr, "%s: %v%s\n", binary, err, hint)
		return 2
	}
	defer srv.Close()

	hs := &http.Server{Addr: *addr, Handler: srv, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.ListenAndServe() }()
	log.InfoContext(ctx, "serving", "design", *design, "addr", *addr)
	select {
	case err := <-errc:
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 2
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		fmt.Fprintf(stderr, "%s: shutdown: %v\n", binary, err)
		return 1
	}
	return 0
}
