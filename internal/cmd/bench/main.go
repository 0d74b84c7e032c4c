// Command bench is `make bench`: one run on one machine, printing side by
// side allot's allocator draining a backlog, the seed designs a user would
// otherwise build under the same request count, their ratio, and an
// end-to-end burst through HTTP against allot and against the Redis-gated
// seed design, both driven by the same load generator (with what allot's
// broker stored meanwhile), and an open loop at a fixed arrival rate
// (vegeta) against the same two.
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/baseline"
	"github.com/allot-dev/allot/internal/bench"
	"github.com/allot-dev/allot/internal/binaries"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/loadgen"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/store/schema"
	"github.com/allot-dev/allot/internal/wire"
)

type opts struct {
	n, conc, httpConc int
	bin, dsn          string
	skipE2E, e2eOnly  bool
	memoryOnly        bool
	memRequests       int
	memActivities     int
	batch             int
	drainBatch        int
	repeat            int
	e2eRounds         int
	floor             bool
	holds             int
	holdsOnly         bool
	reads             bench.ReadsConfig
	readsOnly         bool
	tracing           bool
	natsSync          time.Duration
	openLoopOnly      bool
	openRates         string
	openDurations     string
	openItems         string
	diskProbe         time.Duration
	shardsOnly        bool
	shardPartitions   int
	moveSignups       int
	moveRequests      int
	moveDuring        int
	moveWaiting       int
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var o opts
	flag.IntVar(&o.n, "n", 20000, "requests per measurement")
	flag.IntVar(&o.conc, "conc", 64, "MySQL connections (and callers) of the seed designs")
	flag.IntVar(&o.httpConc, "http-conc", 256, "concurrent HTTP clients of the end-to-end burst")
	flag.IntVar(&o.batch, "batch", config.Defaults[allocator.Config]().BatchSize, "allocator batch size (most requests per transaction; the default is ALLOT_BATCH_SIZE's)")
	flag.IntVar(&o.drainBatch, "drain-batch", 100, "requests per message in the drains' backlog, as ingest's group commit batches a burst (1: one request per message)")
	flag.IntVar(&o.repeat, "repeat", 3, "runs of each drain and seed measurement; the median is reported")
	flag.StringVar(&o.bin, "bin", "bin", "directory of the built binaries (stack, baseline)")
	flag.BoolVar(&o.skipE2E, "skip-e2e", false, "skip the end-to-end HTTP bursts and the open loop")
	flag.BoolVar(&o.e2eOnly, "e2e-only", false, "run only the end-to-end HTTP bursts")
	flag.IntVar(&o.e2eRounds, "e2e-rounds", 3, "rounds of the end-to-end burst: allot, the Redis-gated seed design and (-floor) the floor once each a round, rotating which goes first; each round's ratios and their medians (the higher middle one of an even number) are printed")
	flag.BoolVar(&o.floor, "floor", true, "run the floor beside allot and the Redis-gated seed design, in each round of the end-to-end burst and in each open-loop run: claims counted in the server's memory, nothing stored, the least a claim costs over HTTP beside the same load tool")
	flag.BoolVar(&o.memoryOnly, "memory", false, "run only the memory benchmark: each process's resident set over a long stream of requests")
	flag.IntVar(&o.memRequests, "mem-requests", 1_000_000, "requests of the memory benchmark")
	flag.IntVar(&o.holds, "holds", 100_000, "holds given at once and expiring at once in the holds benchmark (0: skip it)")
	flag.BoolVar(&o.holdsOnly, "holds-only", false, "run only the holds benchmark")
	flag.IntVar(&o.reads.Waiters, "reads", 1_000_000, "waiters of the hot activity in the reads benchmark (0: skip it)")
	flag.BoolVar(&o.readsOnly, "reads-only", false, "run only the reads benchmark")
	flag.IntVar(&o.reads.Joins, "reads-joins", 800_000, "join backlog drained during the reads benchmark (enough for both windows)")
	flag.IntVar(&o.reads.Readers, "reads-readers", 200, "concurrent HTTP readers of the reads benchmark")
	flag.DurationVar(&o.reads.Interval, "reads-interval", 500*time.Millisecond, "each reader's pause between two reads (jittered; 0: none)")
	flag.DurationVar(&o.reads.Window, "reads-window", 10*time.Second, "each measured drain window of the reads benchmark")
	flag.DurationVar(&o.natsSync, "nats-sync", 0, "fsync interval of the benchmarks' JetStream server (0: every write, as production); another value shows what fsync costs")
	flag.BoolVar(&o.tracing, "tracing", false, "run only the tracing benchmark: the end-to-end burst and a drain, each with tracing off and on (every span sampled, exported to an in-process receiver); -repeat rounds, alternating")
	flag.BoolVar(&o.openLoopOnly, "open-loop-only", false, "run only the open-loop benchmark: claims at a fixed arrival rate (vegeta), each a distinct user, against allot and the Redis-gated seed design")
	flag.StringVar(&o.openRates, "open-rate", "4000,6000", "claims per second of each open-loop run (a comma-separated list, paired with -open-duration and -open-items)")
	flag.StringVar(&o.openDurations, "open-duration", "5s,10s", "duration of each open-loop run")
	flag.StringVar(&o.openItems, "open-items", "100,500", "items of each open-loop run")
	flag.DurationVar(&o.diskProbe, "disk-probe", 10*time.Millisecond, "interval of the disk probe beside each burst and open-loop run: 4 KiB appended and synced, as JetStream's file store stores a message with fsync always, whose slowest writes show when the disk stalled (0: no probe)")
	flag.BoolVar(&o.shardsOnly, "shards-only", false, "run only the shard benchmark: the drain of joins over 1,000 activities applied on 1 and on 3 MySQL shards (private mariadbd servers on this machine), alternating, -repeat rounds; then a partition's move between the 3 while the others drain (-move-signups)")
	flag.IntVar(&o.shardPartitions, "shard-partitions", 6, "partitions of the request stream in the shard benchmark, the same at every shard count (partition p on shard p mod N)")
	flag.IntVar(&o.moveSignups, "move-signups", 100_000, "signups of the partition the shard benchmark moves between shards (allotctl shards move, in process) while the others drain (0: no move)")
	flag.IntVar(&o.moveRequests, "move-requests", 300_000, "joins of the other partitions in each of their drains without a move (before it and after it) in the shard benchmark")
	flag.IntVar(&o.moveDuring, "move-requests-during", 2_000_000, "joins of the other partitions in their drain with the move (enough to outlast it)")
	flag.IntVar(&o.moveWaiting, "move-waiting", 1000, "joins to the moved partition published once it is frozen (they wait, then are applied on its new shard)")
	flag.IntVar(&o.memActivities, "mem-activities", 200_000, "activities of the memory benchmark")
	flag.Parse()
	o.dsn = binaries.Getenv[binaries.Bench]().MySQLDSN
	if o.dsn == "" {
		o.dsn = "root@tcp(127.0.0.1:3306)/allot_bench?parseTime=true"
	}
	if err := run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

// median runs measure n times and returns the run with the median rate.
func median[T any](n int, measure func() (T, error), rate func(T) float64) (T, error) {
	runs := make([]T, 0, max(n, 1))
	for range max(n, 1) {
		r, err := measure()
		if err != nil {
			return r, err
		}
		runs = append(runs, r)
	}
	slices.SortFunc(runs, func(a, b T) int { return cmp.Compare(rate(a), rate(b)) })
	return runs[len(runs)/2], nil
}

// freshDB creates a new empty database on the server of dsn.
func freshDB(ctx context.Context, dsn, prefix string) (string, func(), error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", nil, err
	}
	var b [4]byte
	rand.Read(b[:])
	cfg.DBName = prefix + hex.EncodeToString(b[:])
	d := cfg.FormatDSN()
	if err := store.EnsureDatabase(ctx, d); err != nil {
		return "", nil, err
	}
	drop := func() {
		if db, err := store.Open(context.Background(), d, 1); err == nil {
			db.Exec("DROP DATABASE " + cfg.DBName) //nolint:errcheck
			db.Close()
		}
	}
	return d, drop, nil
}

type row struct {
	name, design string
	perSec       float64
	detail       string
}

// allocator is the allocator's configuration of a run: the defaults,
// with the batch size asked for.
func (o opts) allocator() allocator.Config {
	c := config.Defaults[allocator.Config]()
	c.BatchSize = o.batch
	return c
}

// spreadJoins is the drain of o.n joins over 1,000 activities of 10
// seats, in messages of -drain-batch requests: the main run's spread drain
// and the shard run's.
func (o opts) spreadJoins() bench.DrainConfig {
	return bench.DrainConfig{Requests: o.n, Activities: 1000, Capacity: 10, Op: wire.OpJoin, Batch: o.drainBatch}
}

func run(ctx context.Context, o opts) error {
	if o.e2eOnly {
		return e2e(ctx, o)
	}
	if o.openLoopOnly {
		return openLoop(ctx, o)
	}
	if o.tracing {
		return tracingBench(ctx, o)
	}
	if o.shardsOnly {
		return shardsBench(ctx, o)
	}
	if o.memoryOnly {
		if o.memRequests < 10 || o.memActivities < 1 || o.memActivities > o.memRequests {
			return fmt.Errorf("-mem-requests must be at least 10 and -mem-activities between 1 and it")
		}
		return memory(ctx, o)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if o.holdsOnly {
		return holds(ctx, o, log)
	}
	if o.readsOnly {
		return reads(ctx, o, log)
	}
	var rows []row
	fmt.Fprintf(os.Stderr, "bench: %d requests per measurement, seed designs with %d connections\n", o.n, o.conc)

	drains := []struct {
		name string
		cfg  bench.DrainConfig
	}{
		{"drain: joins, one hot activity", bench.DrainConfig{Requests: o.n, Activities: 1, Capacity: 100, Op: wire.OpJoin, Batch: o.drainBatch}},
		{"drain: claims, one hot activity", bench.DrainConfig{Requests: o.n, Activities: 1, Capacity: 100, Op: wire.OpClaim, Users: o.n * 9 / 10, Batch: o.drainBatch}},
		{"drain: joins over 1,000 activities", o.spreadJoins()},
		// The same hot join drain with one request per message: what
		// batches save the allocator (a fetch, an ack and a fence check
		// per message).
		{"drain: joins, one hot activity, one request per message", bench.DrainConfig{Requests: o.n, Activities: 1, Capacity: 100, Op: wire.OpJoin, Batch: 1}},
	}
	// A first, small drain warms MySQL and the page cache up; it is not
	// reported.
	if _, err := drain(ctx, o, log, bench.DrainConfig{Requests: 2000, Activities: 1, Capacity: 100, Op: wire.OpJoin,
		Allocator: o.allocator()}); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	var hotJoin, hotClaim float64
	for i, d := range drains {
		d.cfg.Allocator = o.allocator()
		res, err := median(o.repeat, func() (bench.DrainResult, error) { return drain(ctx, o, log, d.cfg) },
			func(r bench.DrainResult) float64 { return r.PerSecond() })
		if err != nil {
			return fmt.Errorf("%s: %w", d.name, err)
		}
		fmt.Fprintf(os.Stderr, "  %s: %.0f decisions/s\n", d.name, res.PerSecond())
		rows = append(rows, row{d.name, "allot", res.PerSecond(), fmt.Sprintf("%d decisions in %s", res.Decisions, res.Elapsed.Round(time.Millisecond))})
		switch i {
		case 0:
			hotJoin = res.PerSecond()
		case 1:
			hotClaim = res.PerSecond()
		}
	}

	seedJoin, seedClaim, err := seeds(ctx, o)
	if err != nil {
		return err
	}
	rows = append(rows,
		row{"seed join (SELECT … FOR UPDATE)", "seed", seedJoin.PerSecond, fmt.Sprintf("p50 %s p99 %s", seedJoin.P50.Round(time.Millisecond), seedJoin.P99.Round(time.Millisecond))},
		row{"seed claim (conditional UPDATE)", "seed", seedClaim.PerSecond, fmt.Sprintf("p50 %s p99 %s", seedClaim.P50.Round(time.Millisecond), seedClaim.P99.Round(time.Millisecond))},
	)

	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(os.Stdout, "\n== allocator throughput vs the seed designs (one run, same MariaDB, median of %d; %s) ==\n", o.repeat, loadAverage())
	fmt.Fprintln(tw, "measurement\tdesign\trequests/s\tdetail\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t\n", r.name, r.design, r.perSec, r.detail)
	}
	tw.Flush()
	fmt.Printf("drains' messages carry %d requests each (one hot activity; -drain-batch), as ingest's group commit stores a burst\n", o.drainBatch)
	fmt.Printf("ratio allot joins / seed join:   %.1fx\n", hotJoin/seedJoin.PerSecond)
	fmt.Printf("ratio allot claims / seed claim: %.1fx\n", hotClaim/seedClaim.PerSecond)

	if o.holds > 0 {
		if err := holds(ctx, o, log); err != nil {
			return err
		}
	}
	if o.reads.Waiters > 0 {
		if err := reads(ctx, o, log); err != nil {
			return err
		}
	}
	if o.skipE2E {
		return nil
	}
	if err := e2e(ctx, o); err != nil {
		return err
	}
	return openLoop(ctx, o)
}

// reads runs the reads benchmark: a drain of joins to an activity with a
// long line, without readers and with readers, in one run.
func reads(ctx context.Context, o opts, log *slog.Logger) error {
	if o.reads.Waiters < 1 || o.reads.Readers < 1 || o.reads.Joins < 1 {
		return fmt.Errorf("-reads, -reads-readers and -reads-joins must be at least 1")
	}
	cfg := o.reads
	cfg.Allocator = o.allocator()
	cfg.OldReads = 3
	cfg.Progress = func(f string, args ...any) { fmt.Fprintf(os.Stderr, "  reads: "+f+"\n", args...) }
	var res bench.ReadsResult
	err := withStackDSN(ctx, o, log, func(dsn string, db *sql.DB, nc *nats.Conn) error {
		readDB, err := store.Open(ctx, dsn, 16)
		if err != nil {
			return err
		}
		defer readDB.Close()
		// Ingest in a process of its own, as deployed: its HTTP, token and
		// MySQL work does not share the allocator's runtime.
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		if err := bus.EnsureStreams(ctx, js, config.Defaults[bus.Config]()); err != nil {
			return err
		}
		hp, err := freePort()
		if err != nil {
			return err
		}
		cfg.HS256Key = []byte("allot-bench-reads-hs256-key-0123456789")
		cfg.IngestURL = "http://127.0.0.1:" + strconv.Itoa(hp)
		ing, err := start(ctx, filepath.Join(o.bin, "ingest"), nil, []string{"ALLOT_MYSQL_DSN=" + dsn, "ALLOT_NATS_URL=" + nc.ConnectedUrl(),
			"ALLOT_LOG_LEVEL=warn", "ALLOT_HTTP_ADDR=127.0.0.1:" + strconv.Itoa(hp), "ALLOT_AUTH_HS256_KEY=" + string(cfg.HS256Key),
			"ALLOT_INGEST_READ_RATE=1000000"}, cfg.IngestURL+"/readyz")
		if err != nil {
			return err
		}
		defer ing.stop()
		res, err = bench.Reads(ctx, db, readDB, nc, log, cfg)
		return err
	})
	if err != nil {
		return fmt.Errorf("reads: %w", err)
	}
	fmt.Printf("\n== reads: %d waiters on one activity, joins drained, %d readers through HTTP (one run; seeded in %s) ==\n",
		res.Waiters, cfg.Readers, res.SeedElapsed.Round(time.Second))
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "measurement	joins/s	detail	")
	fmt.Fprintf(tw, "drain, no readers (alternating)	%.0f	%d in %s	\n", res.Quiet.PerSecond(), res.Quiet.Decisions, res.Quiet.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(tw, "drain, readers reading (alternating)	%.0f	%d in %s	\n", res.Loud.PerSecond(), res.Loud.Decisions, res.Loud.Elapsed.Round(time.Millisecond))
	tw.Flush()
	fmt.Printf("ratio drain with readers / without: %.2f\n", res.Loud.PerSecond()/res.Quiet.PerSecond())
	fmt.Printf("reads: %d (%d activity state, %d positions; %d not 200) at %.0f/s, p50 %s, p99 %s; the last reader at position %d\n",
		len(res.Reads), res.ActivityReads, res.SignupReads, res.ReadErrors, res.ReadsPerSecond(),
		bench.Percentile(res.Reads, 0.5).Round(10*time.Microsecond), bench.Percentile(res.Reads, 0.99).Round(10*time.Microsecond), res.LastPosition)
	fmt.Printf("one read at a time, straight from MySQL before the drain: activity state p50 %s, position p50 %s p99 %s\n",
		bench.Percentile(res.DirectActivity, 0.5).Round(time.Microsecond), bench.Percentile(res.DirectSignup, 0.5).Round(time.Microsecond),
		bench.Percentile(res.DirectSignup, 0.99).Round(time.Microsecond))
	if len(res.OldRead) > 0 {
		fmt.Printf("the same position read the old way (COUNT(*) over the line ahead, one at a time): p50 %s\n",
			bench.Percentile(res.OldRead, 0.5).Round(time.Millisecond))
	}
	return nil
}

// holds runs the holds benchmark: o.holds joins, one resize that holds a
// seat for each until the same instant, and their expiries, with a probe
// of the same partition meanwhile.
func holds(ctx context.Context, o opts, log *slog.Logger) error {
	if o.holds < 1 {
		return fmt.Errorf("-holds must be at least 1")
	}
	var res bench.HoldsResult
	err := withStack(ctx, o, log, func(db *sql.DB, nc *nats.Conn) error {
		var err error
		res, err = bench.Holds(ctx, db, nc, log, bench.HoldsConfig{Holds: o.holds, Hold: holdFor(o.holds),
			Allocator: o.allocator()})
		return err
	})
	if err != nil {
		return fmt.Errorf("holds: %w", err)
	}
	probes := slices.Clone(res.Probes)
	slices.Sort(probes)
	p50 := time.Duration(0)
	if len(probes) > 0 {
		p50 = probes[len(probes)/2]
	}
	fmt.Printf("\n== holds: %d holds on one activity, given by one resize and expiring at the same instant (one run) ==\n", res.Holds)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "measurement\trequests/s\tdetail\t")
	fmt.Fprintf(tw, "joins to the waitlist (drained)\t%.0f\t%d in %s\t\n", res.JoinsPerSecond(), res.Holds, res.JoinsElapsed.Round(time.Millisecond))
	fmt.Fprintf(tw, "expiries scheduled by the relay\t%.0f\t%d in %s\t\n", res.SchedulesPerSecond(), res.Holds, res.ScheduleElapsed.Round(time.Millisecond))
	fmt.Fprintf(tw, "expiries applied once due\t%.0f\t%d in %s after they fell due\t\n", res.ExpiriesPerSecond(), res.Holds, res.ExpiryElapsed.Round(time.Millisecond))
	tw.Flush()
	fmt.Printf("another activity of the partition meanwhile: %d joins, p50 %s, slowest %s\n", len(probes), p50.Round(time.Millisecond), res.ProbeMax().Round(time.Millisecond))
	fmt.Printf("ratio expiries / joins: %.2f\n", res.ExpiriesPerSecond()/res.JoinsPerSecond())
	return nil
}

// holdFor is a hold long enough for the relay to schedule n expiries
// before the first falls due.
func holdFor(n int) time.Duration { return max(2*time.Second, time.Duration(n)*400*time.Microsecond) }

func drain(ctx context.Context, o opts, log *slog.Logger, cfg bench.DrainConfig) (bench.DrainResult, error) {
	var res bench.DrainResult
	err := withStack(ctx, o, log, func(db *sql.DB, nc *nats.Conn) error {
		var err error
		res, err = bench.Drain(ctx, db, nc, log, cfg)
		return err
	})
	return res, err
}

// withStack runs f on a fresh database and a fresh embedded JetStream
// server that fsyncs every write, as make run and production configs do
// (unless -nats-sync says otherwise).
func withStack(ctx context.Context, o opts, log *slog.Logger, f func(*sql.DB, *nats.Conn) error) error {
	return withStackDSN(ctx, o, log, func(_ string, db *sql.DB, nc *nats.Conn) error { return f(db, nc) })
}

// withStackDSN is withStack that also gives f the fresh database's DSN.
func withStackDSN(ctx context.Context, o opts, log *slog.Logger, f func(string, *sql.DB, *nats.Conn) error) error {
	dsn, drop, err := freshDB(ctx, o.dsn, "allot_bench_")
	if err != nil {
		return err
	}
	defer drop()
	db, err := store.Open(ctx, dsn, 16)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := schema.Migrate(ctx, db); err != nil {
		return err
	}
	return withNATS(o, log, func(nc *nats.Conn) error { return f(dsn, db, nc) })
}

// withNATS runs f on a fresh embedded JetStream server that fsyncs every
// write (unless -nats-sync says otherwise).
func withNATS(o opts, log *slog.Logger, f func(*nats.Conn) error) error {
	dir, err := os.MkdirTemp("", "allot-bench-nats-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := bus.RunServer(bus.ServerConfig{Port: -1, StoreDir: dir, SyncInterval: o.natsSync})
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	nc, err := bus.Connect(srv.ClientURL(), "bench", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	return f(nc)
}

func seeds(ctx context.Context, o opts) (baseline.Stats, baseline.Stats, error) {
	dsn, drop, err := freshDB(ctx, o.dsn, "allot_bench_seed_")
	if err != nil {
		return baseline.Stats{}, baseline.Stats{}, err
	}
	defer drop()
	db, err := baseline.Open(ctx, dsn, o.conc)
	if err != nil {
		return baseline.Stats{}, baseline.Stats{}, err
	}
	defer db.Close()
	if err := baseline.Migrate(ctx, db); err != nil {
		return baseline.Stats{}, baseline.Stats{}, err
	}
	join, err := median(o.repeat, func() (baseline.Stats, error) {
		if _, err := baseline.ResetActivity(ctx, db, 1, 100); err != nil {
			return baseline.Stats{}, err
		}
		return baseline.Drive(ctx, func(ctx context.Context, u int64) (string, error) { return baseline.SeedJoin(ctx, db, 1, u) }, o.n, o.n, o.conc), nil
	}, func(s baseline.Stats) float64 { return s.PerSecond })
	if err != nil {
		return join, baseline.Stats{}, fmt.Errorf("seed join: %w", err)
	}
	fmt.Fprintf(os.Stderr, "  seed join: %.0f requests/s\n", join.PerSecond)
	claim, err := median(o.repeat, func() (baseline.Stats, error) {
		if _, err := baseline.ResetStock(ctx, db, 9001, 100); err != nil {
			return baseline.Stats{}, err
		}
		return baseline.Drive(ctx, func(ctx context.Context, u int64) (string, error) { return baseline.SeedClaim(ctx, db, 9001, u) }, o.n, o.n*9/10, o.conc), nil
	}, func(s baseline.Stats) float64 { return s.PerSecond })
	if err != nil {
		return join, claim, fmt.Errorf("seed claim: %w", err)
	}
	fmt.Fprintf(os.Stderr, "  seed claim: %.0f requests/s\n", claim.PerSecond)
	if join.Errors > 0 || claim.Errors > 0 {
		return join, claim, fmt.Errorf("seed designs failed: %s / %s", join.FirstError, claim.FirstError)
	}
	return join, claim, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// server is a system under test running as its own process.
type server struct {
	cmd *exec.Cmd
	// natsURL is the embedded JetStream server of a stack, "" for others.
	natsURL string
	// exited is closed once the process has exited.
	exited chan struct{}
}

// errExited is returned by start for a process that exited before it was
// ready (e.g. a port picked in advance was taken meanwhile).
var errExited = errors.New("exited before it was ready")

func start(ctx context.Context, bin string, args []string, env []string, ready string) (*server, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	logf, _ := os.CreateTemp("", "allot-bench-*.log")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w (run make build first)", bin, err)
	}
	s := &server{cmd: cmd, exited: make(chan struct{})}
	go func() { cmd.Wait(); close(s.exited) }() //nolint:errcheck // ProcessState says
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(ready)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode < 500 {
				return s, nil
			}
		}
		select {
		case <-s.exited:
			return nil, fmt.Errorf("%s %w; its log: %s", bin, errExited, logf.Name())
		default:
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill() //nolint:errcheck
			return nil, fmt.Errorf("%s not ready after 30s; its log: %s", bin, logf.Name())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cpu is the CPU time (user+system) the server used over its life; valid
// after stop.
func (s *server) cpu() time.Duration {
	if s.cmd.ProcessState == nil {
		return 0
	}
	return s.cmd.ProcessState.UserTime() + s.cmd.ProcessState.SystemTime()
}

func (s *server) stop() {
	s.cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		s.cmd.Process.Kill() //nolint:errcheck
		<-s.exited
	}
}

// startStack starts the whole stack as one process (embedded JetStream,
// fsync always) on a fresh database, with env added to its environment:
// the server, its base URL and what removes its database and store.
func startStack(ctx context.Context, o opts, env []string) (*server, string, func(), error) {
	dsn, drop, err := freshDB(ctx, o.dsn, "allot_bench_e2e_")
	if err != nil {
		return nil, "", nil, err
	}
	dir, err := os.MkdirTemp("", "allot-bench-e2e-")
	if err != nil {
		drop()
		return nil, "", nil, err
	}
	done := func() { os.RemoveAll(dir); drop() }
	hp, _ := freePort()
	np, _ := freePort()
	url := "http://127.0.0.1:" + strconv.Itoa(hp)
	s, err := start(ctx, filepath.Join(o.bin, "stack"), nil, append([]string{
		"ALLOT_MYSQL_DSN=" + dsn, "ALLOT_NATS_URL=", "ALLOT_HTTP_ADDR=127.0.0.1:" + strconv.Itoa(hp),
		"ALLOT_EMBEDDED_NATS_PORT=" + strconv.Itoa(np), "ALLOT_EMBEDDED_NATS_STORE=" + dir,
		// Any free port: nothing reads the allocator's metrics, and a port
		// picked in advance can be taken by then.
		"ALLOT_METRICS_ADDR=127.0.0.1:0", "ALLOT_LOG_LEVEL=warn",
	}, env...), url+"/readyz")
	if err != nil {
		done()
		return nil, "", nil, err
	}
	s.natsURL = "nats://127.0.0.1:" + strconv.Itoa(np)
	return s, url, done, nil
}

// burstConfig is the load generator's end-to-end burst against url.
func burstConfig(o opts, url string) loadgen.Config {
	c := config.Defaults[loadgen.Config]()
	c.BaseURL, c.Activity, c.Capacity, c.Requests, c.Users = url, 9001, 100, o.n, o.n*9/10
	c.Concurrency, c.Mix, c.Wait, c.Seed = o.httpConc, loadgen.Mix{Claim: 1}, 30*time.Second, 1
	return c
}
