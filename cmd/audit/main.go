// Command audit replays ALLOT_REQUESTS through the allocation domain and
// checks MySQL against it. Wiring only: the audit lives in internal/audit.
//
//	audit [-activity 1,2,3] [-from-seq N | -from-time RFC3339 | -from-checkpoint] [-json]
//
// -from-checkpoint starts from the allocator's oldest checkpoint that the
// request stream still reaches back to (what an audit needs once retention
// has removed older requests); the report says which range it verified.
//
// With ALLOT_MYSQL_SHARDS naming several shards it reads the partition →
// shard map and audits each shard's partitions there (docs/shards.md),
// printing a report per shard.
//
// Exit status: 0 when every decision and row matches, 1 when anything
// diverges, 2 when the audit could not run (bad flags or configuration,
// NATS or MySQL unreachable, a shard that does not answer, an incomplete
// stream).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/term"

	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/binaries"
	"github.com/allot-dev/allot/internal/buildinfo"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/store"
)

const binary = "audit"

// Exit codes, as the README's "Auditors" documents them.
const (
	exitOK       = 0
	exitDiverged = 1
	exitError    = 2
)

// cfg is the audit's configuration: ALLOT_ variables (config.Common) and
// the flags (audit.Config).
type cfg binaries.Audit

// Validate reports the first invalid ALLOT_ value as one sentence;
// audit.Config, which the flags set, is validated once the flags are read
// (parseFlags).
func (c *cfg) Validate() error {
	if err := c.Common.Validate(); err != nil {
		return err
	}
	if c.NATSURL == "" {
		return errors.New("ALLOT_NATS_URL is empty: the audit reads the request stream of a running NATS server, set it (e.g. nats://127.0.0.1:4222)")
	}
	return nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// parseFlags sets c's fields from the command line, then validates c
// once: the flags override the Config's fields, before Validate. It
// returns -json.
func parseFlags(args []string, stderr io.Writer, c *audit.Config) (asJSON bool, err error) {
	var activities, fromTS string
	fs := flag.NewFlagSet(binary, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&activities, "activity", "", "comma-separated activity ids to audit (default: all)")
	fs.Uint64Var(&c.FromSeq, "from-seq", c.FromSeq, "compare only from this stream sequence on (the state is still replayed from the start)")
	fs.StringVar(&fromTS, "from-time", "", "compare only from the first request stored at or after this RFC3339 time")
	fs.BoolVar(&c.FromCheckpoint, "from-checkpoint", c.FromCheckpoint, "start from the allocator's oldest checkpoint the stream still reaches back to, instead of from sequence 1")
	fs.BoolVar(&asJSON, "json", false, "print the report as one JSON object")
	version := buildinfo.Flag(fs)
	if err := fs.Parse(args); err != nil {
		return false, err
	}
	if *version {
		buildinfo.Print(os.Stdout, binary)
		return false, flag.ErrHelp // exit 0, like -h
	}
	if fs.NArg() > 0 {
		return false, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if activities != "" {
		for _, s := range strings.Split(activities, ",") {
			id, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
			if err != nil {
				return false, fmt.Errorf("-activity: %q is not a positive activity id", s)
			}
			c.Activities = append(c.Activities, id)
		}
	}
	if fromTS != "" {
		t, err := time.Parse(time.RFC3339, fromTS)
		if err != nil {
			return false, fmt.Errorf("-from-time: %q is not an RFC3339 time (e.g. 2025-01-31T18:00:00Z)", fromTS)
		}
		c.FromTime = t
	}
	return asJSON, c.Validate()
}

// run is the whole command; it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var c cfg
	asJSON, err := parseFlags(args, stderr, &c.Config)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return exitError
	}
	err = config.Load(&c)
	config.Print(stderr, binary, &c)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return exitError
	}
	log := c.Logger(stderr, binary)
	set, _ := c.Shards() // checked by config.Load
	deps := audit.Deps{Shards: shards.Pools{}}
	if set.Len() == 1 {
		// One database: it must answer, as it always had to.
		db, err := store.Open(ctx, set.Shards()[0].DSN, c.MySQLMaxConns)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v — start MariaDB/MySQL or set ALLOT_MYSQL_DSN\n", binary, err)
			return exitError
		}
		deps.DB, deps.Shards[set.Shards()[0].Name] = db, db
	} else {
		// Several shards: one that does not answer is reported as not
		// audited, the others are audited.
		for _, sh := range set.Shards() {
			db, err := store.Open(ctx, sh.DSN, c.MySQLMaxConns)
			if err != nil {
				if deps.Unreachable == nil {
					deps.Unreachable = map[string]error{}
				}
				deps.Unreachable[sh.Name] = err
				continue
			}
			deps.Shards[sh.Name] = db
		}
	}
	defer deps.Shards.Close()
	nc, err := c.ConnectNATS(binary, log)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return exitError
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", binary, err)
		return exitError
	}
	deps.JS = js
	if !asJSON && isTerminal(stderr) {
		deps.Progress = stderr
	}
	rep, err := audit.Run(ctx, c.Config, deps)
	return report(rep, err, asJSON, stdout, stderr)
}

// report prints the outcome of an audit and maps it to the exit code. A
// shard not audited (audit.ErrShard) is an error, printed after the
// report of every shard.
func report(rep audit.Report, runErr error, asJSON bool, stdout, stderr io.Writer) int {
	if runErr != nil && !errors.Is(runErr, audit.ErrShard) {
		fmt.Fprintf(stderr, "%s: %v\n", binary, runErr)
		return exitError
	}
	var err error
	if asJSON {
		enc := json.NewEncoder(stdout)
		err = enc.Encode(rep)
	} else {
		err = rep.WriteText(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: write report: %v\n", binary, err)
		return exitError
	}
	for _, s := range rep.Shards {
		if s.Error != "" {
			fmt.Fprintf(stderr, "%s: %s\n", binary, s.Error)
		}
	}
	if runErr != nil {
		return exitError
	}
	if !rep.OK {
		return exitDiverged
	}
	return exitOK
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
