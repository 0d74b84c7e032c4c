package loadgen_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/baseline"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/loadgen"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/internal/wire"
)

// baselineServer serves design over a fresh database with a pool of conns.
func baselineServer(t testing.TB, design string, conns int) *httptest.Server {
	t.Helper()
	addr := os.Getenv("ALLOT_TEST_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	if design == baseline.DesignGated {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		r, err := baseline.DialRedis(ctx, addr, 1)
		cancel()
		if err != nil {
			testenv.Missing(t, fmt.Sprintf("Redis does not answer at %s (start redis-server, or set ALLOT_TEST_REDIS_ADDR): %v", addr, err))
		}
		r.Close()
	}
	d := dbtest.New(t)
	db, err := store.Open(context.Background(), d.DSN, conns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	h, err := baseline.Handler(design, db, addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		srv.Close()
		h.(*baseline.Server).Close()
	})
	return srv
}

// TestRunAgainstGatedBaseline is the seed flash sale's burst through HTTP: 2,000
// claims from 1,800 users for 100 items.
func TestRunAgainstGatedBaseline(t *testing.T) {
	srv := baselineServer(t, baseline.DesignGated, 32)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lcfg := config.Defaults[loadgen.Config]()
	lcfg.BaseURL = srv.URL
	lcfg.Activity = 9001
	lcfg.Capacity = 100
	lcfg.Requests = 2000
	lcfg.Users = 1800
	lcfg.Concurrency = 64
	rep, err := loadgen.Run(ctx, lcfg, loadgen.Deps{})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("gated baseline over HTTP: %.0f accepted/s, first→last %s, p50 %s p90 %s p99 %s max %s, outcomes %v",
		rep.AcceptedPerSec, rep.ToLastResult, rep.P50, rep.P90, rep.P99, rep.Max, rep.Outcomes)
	if err := rep.Verdict(); err != nil {
		if errors.Is(err, loadgen.ErrUndersold) && !errors.Is(err, loadgen.ErrOversold) &&
			!errors.Is(err, loadgen.ErrDoubleGrant) && !errors.Is(err, loadgen.ErrAccounting) && !errors.Is(err, loadgen.ErrIncomplete) {
			// The seed flash sale's gate can leave an item undersold; that is
			// the baseline's defect, which the verdict caught. Reported,
			// not hidden.
			t.Logf("the gated baseline ended UNDERSOLD, as its design can: %v", err)
		} else {
			t.Fatalf("verdict: %v", err)
		}
	}
	if rep.OpenOutcome != string(wire.OutcomeOpened) && rep.OpenOutcome != string(wire.OutcomeResized) {
		t.Errorf("open outcome %q, want OPENED or RESIZED", rep.OpenOutcome)
	}
	if rep.Accepted != 2000 || rep.Results != 2000 || rep.Errors != 0 || rep.Statuses[200] < 2000 {
		t.Errorf("accepted %d, results %d, errors %d, statuses %v; want 2000, 2000, 0, ≥2000×200 (samples %v)",
			rep.Accepted, rep.Results, rep.Errors, rep.Statuses, rep.ErrorSamples)
	}
	if rep.AcceptedPerSec <= 0 || rep.FiringWindow <= 0 || rep.ToLastResult < rep.FiringWindow {
		t.Errorf("accepted/s %.1f, firing window %s, first→last %s: want positive, last result after last accept",
			rep.AcceptedPerSec, rep.FiringWindow, rep.ToLastResult)
	}
	if !(0 < rep.P50 && rep.P50 <= rep.P90 && rep.P90 <= rep.P99 && rep.P99 <= rep.Max) {
		t.Errorf("percentiles p50 %s p90 %s p99 %s max %s: want 0 < p50 ≤ p90 ≤ p99 ≤ max", rep.P50, rep.P90, rep.P99, rep.Max)
	}
	sum := rep.Outcomes[string(wire.OutcomeGranted)] + rep.Outcomes[string(wire.OutcomeSoldOut)] + rep.Outcomes[string(wire.OutcomeAlreadyOwned)]
	if sum != 2000 || rep.Outcomes[string(wire.OutcomeGranted)] > 100 {
		t.Errorf("outcomes %v: want 2000 GRANTED/SOLD_OUT/ALREADY_OWNED, at most 100 GRANTED", rep.Outcomes)
	}
	if rep.After == nil || rep.After.Confirmed != int64(rep.Outcomes[string(wire.OutcomeGranted)]) || rep.After.Capacity != 100 {
		t.Errorf("after %+v: want capacity 100 and confirmed = GRANTED %d", rep.After, rep.Outcomes[string(wire.OutcomeGranted)])
	}
	if rep.UsersWithSeat != rep.Outcomes[string(wire.OutcomeGranted)] || rep.DoubleGrantUsers != 0 {
		t.Errorf("users with a seat %d, double grants %d", rep.UsersWithSeat, rep.DoubleGrantUsers)
	}
}

// TestRunAgainstJoinBaseline drives the seed waitlist with joins and
// cancels, which exercises promotions through HTTP.
func TestRunAgainstJoinBaseline(t *testing.T) {
	srv := baselineServer(t, baseline.DesignJoin, 16)
	lcfg := config.Defaults[loadgen.Config]()
	lcfg.BaseURL = srv.URL
	lcfg.Activity = 7
	lcfg.Capacity = 20
	lcfg.Requests = 400
	lcfg.Users = 100
	lcfg.Concurrency = 16
	lcfg.Mix = loadgen.Mix{Join: 3, Cancel: 1}
	rep, err := loadgen.Run(context.Background(), lcfg, loadgen.Deps{})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := rep.Verdict(); err != nil {
		t.Fatalf("verdict: %v\noutcomes %v after %+v", err, rep.Outcomes, rep.After)
	}
	if rep.Outcomes[string(wire.OutcomeWaiting)] == 0 || rep.Outcomes[string(wire.OutcomeCancelled)] == 0 {
		t.Errorf("outcomes %v: want waiters and cancels", rep.Outcomes)
	}
	t.Logf("join baseline: outcomes %v, promotions %d, after %+v", rep.Outcomes, rep.Promotions, *rep.After)
}

// BenchmarkGatedBaselineHTTP runs the flash-sale burst (b.N claims from
// 0.9·b.N users for 100 items) through HTTP against the gated baseline with
// the seed designs' 64 MySQL connections. Try -benchtime=20000x.
func BenchmarkGatedBaselineHTTP(b *testing.B) {
	if testing.Short() {
		b.Skip("skipping the HTTP burst benchmark in -short mode")
	}
	srv := baselineServer(b, baseline.DesignGated, baseline.DefaultMaxConns)
	b.ReportAllocs()
	b.ResetTimer()
	lcfg := config.Defaults[loadgen.Config]()
	lcfg.BaseURL = srv.URL
	lcfg.Activity = 9001
	lcfg.Capacity = 100
	lcfg.Requests = b.N
	lcfg.Users = max(b.N*9/10, 1)
	lcfg.Concurrency = 256
	rep, err := loadgen.Run(context.Background(), lcfg, loadgen.Deps{})
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	if err := rep.Verdict(); err != nil && (errors.Is(err, loadgen.ErrOversold) || errors.Is(err, loadgen.ErrDoubleGrant)) {
		b.Fatalf("verdict: %v", err)
	}
	b.ReportMetric(rep.AcceptedPerSec, "accepted/s")
	b.ReportMetric(float64(rep.P50.Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(rep.P99.Microseconds())/1000, "p99-ms")
}
