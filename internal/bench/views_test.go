package bench

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/allocator/viewpub"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/wire"
)

// churnActivities is how many activities BenchmarkViewChurn fills and
// empties: ALLOT_BENCH_VIEW_ACTIVITIES, 200,000 by default.
func churnActivities() int {
	if n, err := strconv.Atoi(os.Getenv("ALLOT_BENCH_VIEW_ACTIVITIES")); err == nil && n > 0 {
		return n
	}
	return 200_000
}

// BenchmarkViewChurn fills and empties many activities, then reports the
// view bucket's size and what a takeover and an ingest start read.
func BenchmarkViewChurn(b *testing.B) {
	if testing.Short() {
		b.Skip("benchmark")
	}
	n := churnActivities()
	for i := 0; i < b.N; i++ {
		db := dbtest.New(b)
		ns := natstest.New(b)
		nc, _ := ns.Connect(b)
		res, err := ViewChurn(context.Background(), db.DB, nc, slog.New(slog.NewTextHandler(io.Discard, nil)), n,
			churnConfig(), churnSettle)
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("%d activities filled and emptied in %s: view bucket %d messages (%d bytes) after the drain, %d after %s; "+
			"reading the bucket %s; takeover to rebuilt views %s; %.0f views dropped",
			res.Activities, res.Drain.Round(time.Millisecond), res.BucketMsgs, res.BucketBytes, res.SettledMsgs, churnSettle,
			res.Read.Round(time.Microsecond), res.Takeover.Round(time.Microsecond), res.Dropped)
		b.ReportMetric(float64(res.SettledMsgs), "bucket-msgs")
		b.ReportMetric(float64(res.Takeover.Microseconds())/1000, "takeover-ms")
	}
}

// BenchmarkDrainFrozenViews drains the same joins (each one fills an
// activity, so every batch has views to publish) with a healthy view bucket
// and with one that never answers, in one run, and prints both rates.
func BenchmarkDrainFrozenViews(b *testing.B) {
	if testing.Short() {
		b.Skip("benchmark")
	}
	cfg := DrainConfig{Requests: 20000, Activities: 20000, Capacity: 1, Op: wire.OpJoin}
	for i := 0; i < b.N; i++ {
		healthy := drainThroughFreezer(b, cfg, false)
		b.Logf("healthy view bucket: %.0f decisions/s", healthy.PerSecond())
		frozen := drainThroughFreezer(b, cfg, true)
		b.Logf("drain of %d joins filling %d activities: healthy view bucket %.0f decisions/s (%s), frozen view bucket %.0f decisions/s (%s), ratio %.2f",
			cfg.Requests, cfg.Activities, healthy.PerSecond(), healthy.Elapsed.Round(time.Millisecond),
			frozen.PerSecond(), frozen.Elapsed.Round(time.Millisecond), frozen.PerSecond()/healthy.PerSecond())
		b.ReportMetric(healthy.PerSecond(), "healthy-decisions/s")
		b.ReportMetric(frozen.PerSecond(), "frozen-decisions/s")
	}
}

func drainThroughFreezer(b *testing.B, cfg DrainConfig, freeze bool) DrainResult {
	b.Helper()
	db := dbtest.New(b)
	ns := natstest.New(b)
	f, err := natstest.NewFreezer(ns.Addr().String(), wire.ViewBucket)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	nc, err := nats.Connect(f.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	cfg.AfterStart = func() { f.SetFrozen(freeze) }
	res, err := Drain(context.Background(), db.DB, nc, slog.New(slog.NewTextHandler(io.Discard, nil)), cfg)
	if err != nil {
		b.Fatal(err)
	}
	return res
}

// churnSettle is how long BenchmarkViewChurn waits for cleared views to
// leave the bucket: their TTL, the marker's, and a margin.
const churnSettle = viewpub.DefaultClearTTL + 5*time.Second

func churnConfig() allocator.Config { return config.Defaults[allocator.Config]() }
