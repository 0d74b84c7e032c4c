package loadgen_test

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/ingest"
	"github.com/allot-dev/allot/internal/loadgen"
	"github.com/allot-dev/allot/internal/stacktest"
	"github.com/allot-dev/allot/internal/wire"
)

// TestRunAgainstTheRealStack fires one burst at the real system (ingest,
// the allocator, a JetStream server and a MariaDB database, in this
// process): loadgen's own verdict holds, every request reaches its final
// result, and what loadgen reports agrees with what MySQL recorded.
func TestRunAgainstTheRealStack(t *testing.T) {
	t.Parallel()
	st := stacktest.Start(t, config.Defaults[allocator.Config](), stacktest.IngestConfig(), ingest.Deps{})
	const act, capacity, requests = 4242, 40, 1500
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lcfg := config.Defaults[loadgen.Config]()
	lcfg.BaseURL = st.URL
	lcfg.Activity = act
	lcfg.Capacity = capacity
	lcfg.Requests = requests
	lcfg.Users = 1000
	lcfg.Concurrency = 32
	lcfg.Mix = loadgen.Mix{Join: 0.5, Cancel: 0.2, Claim: 0.3}
	lcfg.Wait = 10 * time.Second
	rep, err := loadgen.Run(ctx, lcfg, loadgen.Deps{})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := rep.Verdict(); err != nil {
		t.Fatalf("verdict: %v\n%+v", err, rep)
	}
	if rep.Results != requests || rep.Errors != 0 || rep.OpenOutcome != string(wire.OutcomeOpened) {
		t.Fatalf("results %d, errors %d (samples %v), open %s; want %d, 0, OPENED", rep.Results, rep.Errors, rep.ErrorSamples,
			rep.OpenOutcome, requests)
	}
	// Outcomes that change a signup are never answered from the shedding
	// view: each one loadgen saw is a result row in MySQL, and no more.
	for _, o := range []string{string(wire.OutcomeGranted), string(wire.OutcomeConfirmed), string(wire.OutcomeWaiting), string(wire.OutcomeCancelled)} {
		n := st.DB.Count(t, "SELECT COUNT(*) FROM processed_request WHERE activity_id = ? AND outcome = ?", act, o)
		if n != int64(rep.Outcomes[o]) {
			t.Errorf("%s: loadgen saw %d, MySQL holds %d", o, rep.Outcomes[o], n)
		}
	}
	if rep.After == nil {
		t.Fatal("no state of the activity after the burst")
	}
	if n := st.DB.Count(t, "SELECT confirmed_count FROM activity WHERE id = ?", act); n != rep.After.Confirmed {
		t.Errorf("confirmed after the burst: loadgen read %d, MySQL holds %d", rep.After.Confirmed, n)
	}
	st.DB.CheckInvariants(t)
	t.Logf("burst against the real stack: %d requests, %d accepted, last result after %s, outcomes %v",
		rep.Requests, rep.Accepted, rep.ToLastResult.Round(time.Millisecond), rep.Outcomes)
}

// TestRunHoldsAgainstTheRealStack fires a burst with holds and no-shows at
// the real system: loadgen's verdict holds (every hold confirmed or lapsed,
// held 0, confirmed = the CONFIRMED signups), and MySQL agrees.
func TestRunHoldsAgainstTheRealStack(t *testing.T) {
	t.Parallel()
	st := stacktest.Start(t, config.Defaults[allocator.Config](), stacktest.IngestConfig(), ingest.Deps{})
	const act, capacity, requests = 4343, 20, 600
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	lcfg := config.Defaults[loadgen.Config]()
	lcfg.BaseURL = st.URL
	lcfg.Activity = act
	lcfg.Capacity = capacity
	lcfg.Requests = requests
	lcfg.Users = 200
	lcfg.Concurrency = 16
	lcfg.Mix = loadgen.Mix{Claim: 1, Join: 2, Cancel: 0.2, Confirm: 0.5}
	lcfg.Hold = time.Second
	lcfg.NoShow = 0.3
	lcfg.Wait = 10 * time.Second
	rep, err := loadgen.Run(ctx, lcfg, loadgen.Deps{})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := rep.Verdict(); err != nil {
		t.Fatalf("verdict: %v\n%+v\n%+v", err, rep, rep.Holds)
	}
	h := rep.Holds
	if h == nil || h.NoShowsHeld == 0 || h.Confirms[string(wire.OutcomeConfirmed)] == 0 {
		t.Fatalf("holds %+v: want no-shows held and confirms", h)
	}
	if n := st.DB.Count(t, "SELECT held_count FROM activity WHERE id = ?", act); n != 0 {
		t.Errorf("held_count %d in MySQL, want 0", n)
	}
	confirmed := st.DB.Count(t, "SELECT COUNT(*) FROM activity_signup WHERE activity_id = ? AND status = 'CONFIRMED'", act)
	if n := st.DB.Count(t, "SELECT confirmed_count FROM activity WHERE id = ?", act); n != confirmed || n != int64(h.ConfirmedSignups) {
		t.Errorf("confirmed_count %d, CONFIRMED signups %d in MySQL, loadgen read %d", n, confirmed, h.ConfirmedSignups)
	}
	if n := st.DB.Count(t, "SELECT COUNT(*) FROM processed_request WHERE activity_id = ? AND outcome = 'EXPIRED'", act); n == 0 {
		t.Error("no hold expired, with 30% no-shows")
	}
	st.DB.CheckInvariants(t)
	t.Logf("holds against the real stack: outcomes %v; holds %+v", rep.Outcomes, *h)
}
