package baseline

import (
	"context"
	"testing"
)

// benchConc is the number of concurrent callers of the baseline benchmarks:
// a burst far wider than the 64-connection pool, as on launch night.
const benchConc = 256

// benchBurst drives b.N calls of fn from 0.9·b.N users (repeat taps) and
// reports the throughput and latency. Use -benchtime=20000x for the seed
// flash sale's burst of 20,000 taps.
func benchBurst(b *testing.B, fn func(ctx context.Context, user int64) (string, error)) {
	b.Helper()
	b.ReportAllocs()
	b.ResetTimer()
	st := Drive(context.Background(), fn, b.N, max(b.N*9/10, 1), benchConc)
	b.StopTimer()
	if st.Errors > 0 {
		b.Fatalf("%d errors, first: %s", st.Errors, st.FirstError)
	}
	b.ReportMetric(st.PerSecond, "req/s")
	b.ReportMetric(float64(st.P50.Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(st.P99.Microseconds())/1000, "p99-ms")
	b.Logf("%s", st)
}

func BenchmarkSeedClaim(b *testing.B) {
	if testing.Short() {
		b.Skip("skipping the MySQL burst benchmark in -short mode")
	}
	_, db := newDB(b, DefaultMaxConns)
	if _, err := ResetStock(context.Background(), db, 1, 100); err != nil {
		b.Fatal(err)
	}
	benchBurst(b, func(ctx context.Context, user int64) (string, error) { return SeedClaim(ctx, db, 1, user) })
}

func BenchmarkGatedClaim(b *testing.B) {
	if testing.Short() {
		b.Skip("skipping the MySQL burst benchmark in -short mode")
	}
	r := newRedis(b)
	_, db := newDB(b, DefaultMaxConns)
	g := NewGate(r, "")
	b.Cleanup(func() { g.Close(context.Background()) })
	ctx := context.Background()
	if _, err := ResetStock(ctx, db, 1, 100); err != nil {
		b.Fatal(err)
	}
	if err := g.Set(ctx, 1, 100); err != nil {
		b.Fatal(err)
	}
	benchBurst(b, func(ctx context.Context, user int64) (string, error) { return GatedClaim(ctx, db, g, 1, user) })
}

// BenchmarkSeedJoin is the seed waitlist's join under a burst: every request
// queues on the activity row's lock; capacity 100, the rest wait.
func BenchmarkSeedJoin(b *testing.B) {
	if testing.Short() {
		b.Skip("skipping the MySQL burst benchmark in -short mode")
	}
	_, db := newDB(b, DefaultMaxConns)
	if _, err := ResetActivity(context.Background(), db, 1, 100); err != nil {
		b.Fatal(err)
	}
	benchBurst(b, func(ctx context.Context, user int64) (string, error) { return SeedJoin(ctx, db, 1, user) })
}
