// Command allotctl is allot's operator tool. Its subcommands act on the
// broker with an identity that may manage streams (the allotctl NATS user of
// deploy/nats/accounts.conf, or admin), which no runtime binary has.
//
// Usage:
//
//	allotctl setup    # create or update every stream and bucket; idempotent
//	allotctl shards   # print the partition -> shard map (docs/shards.md)
//	allotctl shards move -partition P -to SHARD   # move a partition's state online
//
// setup creates ALLOT_HOLDS, ALLOT_REQUESTS (with ALLOT_PARTITIONS
// partitions; a change of partitions is refused), ALLOT_EVENTS, ALLOT_DLQ and
// the ALLOT_IDEMPOTENCY, ALLOT_VIEW, ALLOT_ALLOCATORS and ALLOT_SHARDS
// buckets (the shard map's missing entries seeded as partition mod the
// shards of ALLOT_MYSQL_SHARDS), or updates
// them to allot's configuration (retention from ALLOT_REQUESTS_MAX_AGE and
// the others, or their defaults); it never lowers replicas and keeps an
// existing request stream's duplicate window. ingest, the allocator and
// the notifier only check at start that what they need is there (exit 2
// otherwise). Run it once before them, and again after an upgrade or a
// change of its settings.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/binaries"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
)

const binary = "allotctl"

// command is one subcommand. Later ones (shards, shards move) are added to
// commands with their own flags.
type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

var commands = []command{
	{"setup", "create or update every stream and bucket allot uses (idempotent)", runSetup},
	{"shards", "print the partition -> shard map, with each partition's fence", runShards},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run dispatches to a subcommand; exit code 2 for an unknown one.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(stdout)
		return 0
	case "-version", "--version":
		fs := flag.NewFlagSet(binary, flag.ContinueOnError)
		return config.ParseFlags(fs, args[:1])
	}
	if len(args) > 1 && args[0] == "shards" && args[1] == "move" {
		return runMove(ctx, args[2:], stdout, stderr)
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "%s: unknown command %q\n", binary, args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "usage: %s <command>; the settings are %s_ environment variables\n\ncommands:\n", binary, config.Prefix)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, "  shards move -partition P -to SHARD\n           move a partition's state to another shard online (-undo before the flip)\n")
}

// setupWait bounds how long setup waits for JetStream to answer: a cluster
// that has just formed elects its meta leader first.
const setupWait = 2 * time.Minute

type setupCfg binaries.Allotctl

// connect opens a command's NATS connection and its JetStream handle.
func connect(c config.Common, log *slog.Logger) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := c.ConnectNATS(binary, log)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

func (c *setupCfg) Validate() error {
	if err := c.Common.Validate(); err != nil {
		return err
	}
	if c.NATSURL == "" {
		return errors.New("ALLOT_NATS_URL is empty: set it to your NATS server (with an identity that may manage streams, e.g. nats://allotctl:<password>@host:4222)")
	}
	return c.Config.Validate()
}

// runSetup is `allotctl setup`: 0 done, 1 the server refused, 2 bad usage,
// configuration, a change of partitions or an unreachable broker.
func runSetup(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(binary+" setup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if code := config.ParseFlags(fs, args); code >= 0 {
		return code
	}
	var c setupCfg
	err := config.Load(&c)
	config.Print(stderr, binary, &c)
	if err != nil {
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
	wctx, cancel := context.WithTimeout(ctx, setupWait)
	defer cancel()
	set, _ := c.Shards() // checked by Validate
	changes, err := bus.SetupWait(wctx, js, c.Config, set.Names(), log)
	bus.WriteChanges(stdout, changes)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, bus.ErrPartitionsChanged), errors.Is(err, context.DeadlineExceeded), errors.Is(err, bus.ErrUnavailable):
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return 2
	}
	fmt.Fprintf(stderr, "%s: %v\n", binary, err)
	return 1
}
