package bench

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/baseline"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/wire"
)

// TestOpenLoopSmall keeps the open-loop runner honest in the ordinary test
// run: against the seed's claim design (real MariaDB) a tiny attack sells
// out exactly and passes, and one too small to sell out fails the check.
func TestOpenLoopSmall(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	h, err := baseline.Handler(baseline.DesignClaim, db.DB, "")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	res, err := OpenLoop(ctx, OpenLoopConfig{BaseURL: srv.URL, Items: 10, Rate: 200, Duration: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Check(); err != nil {
		t.Fatalf("a sell-out of 10 items to %d claims: %v", res.Sent, err)
	}
	if res.Planned != 50 || res.Sent <= 10 || res.Granted != 10 || res.Outcomes[string(wire.OutcomeSoldOut)] != res.Sent-10 {
		t.Fatalf("planned %d, sent %d, granted %d, outcomes %v; want 10 granted of about 50, the rest SOLD_OUT",
			res.Planned, res.Sent, res.Granted, res.Outcomes)
	}
	if res.P50 <= 0 || res.Max < res.P99 || res.Rate <= 0 {
		t.Fatalf("latencies p50 %s p99 %s max %s, rate %.0f", res.P50, res.P99, res.Max, res.Rate)
	}
	// The seed design sheds nothing: every claim is answered unshed, and
	// the slowest of them are told apart.
	if res.Unshed != res.Sent || res.UnshedP99 < res.UnshedP50 || res.Slow.N < 1 || res.Slow.Shed != 0 ||
		res.Slow.Granted > 10 || res.Slow.Last < res.Slow.First {
		t.Fatalf("unshed %d of %d (p50 %s, p99 %s), slowest %+v", res.Unshed, res.Sent, res.UnshedP50, res.UnshedP99, res.Slow)
	}

	// Four claims for ten items: undersold.
	res, err = OpenLoop(ctx, OpenLoopConfig{BaseURL: srv.URL, Items: 10, Rate: 40, Duration: 100 * time.Millisecond, FirstUser: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.SoldOut(); !errors.Is(err, ErrSellOut) {
		t.Fatalf("%d granted of 10 items: SoldOut %v, want ErrSellOut", res.Granted, err)
	}
}

// grantAll is a broken server: it grants every claim it does not refuse,
// refusing each claim after the first limit with 429 (limit 0: none).
type grantAll struct {
	mu      sync.Mutex
	granted int64
	limit   int
	seen    int // claims
	opens   int
}

func (g *grantAll) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	defer g.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch r.Method {
	case http.MethodPut:
		g.opens++
		json.NewEncoder(w).Encode(wire.Result{RequestID: "open", State: wire.StateDone, Op: wire.OpOpen, Outcome: wire.OutcomeOpened}) //nolint:errcheck
	case http.MethodGet:
		json.NewEncoder(w).Encode(map[string]int64{"capacity": 5, "confirmed": g.granted}) //nolint:errcheck
	default:
		g.seen++
		if g.limit > 0 && g.seen > g.limit {
			w.WriteHeader(http.StatusTooManyRequests)
			w.Write([]byte(`{"error":"slow down"}`)) //nolint:errcheck
			return
		}
		g.granted++
		u, _ := strconv.ParseInt(r.PathValue("u"), 10, 64)
		json.NewEncoder(w).Encode(wire.Result{RequestID: strconv.Itoa(g.seen), State: wire.StateDone, Op: wire.OpClaim, //nolint:errcheck
			UserID: u, Outcome: wire.OutcomeGranted})
	}
}

// TestOpenLoopCatchesBrokenServers: an oversold activity fails SoldOut; a
// server that refuses claims fails Check even when it sold out.
func TestOpenLoopCatchesBrokenServers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	serve := func(g *grantAll) string {
		mux := http.NewServeMux()
		mux.Handle("/v1/activities/{a}/claims/{u}", g)
		mux.Handle("/", g)
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		return srv.URL
	}

	res, err := OpenLoop(ctx, OpenLoopConfig{BaseURL: serve(&grantAll{}), Items: 5, Rate: 100, Duration: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.SoldOut(); !errors.Is(err, ErrSellOut) {
		t.Fatalf("%d granted of 5 items: SoldOut %v, want ErrSellOut", res.Granted, err)
	}

	res, err = OpenLoop(ctx, OpenLoopConfig{BaseURL: serve(&grantAll{limit: 5}), Items: 5, Rate: 100, Duration: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.SoldOut(); err != nil {
		t.Fatalf("5 granted, then refusals: SoldOut %v, want nil", err)
	}
	if err := res.Check(); err == nil || res.Failed != res.Sent-5 || res.Codes[http.StatusTooManyRequests] != res.Failed {
		t.Fatalf("%d of %d claims refused (codes %v): Check %v, want an error for each refusal", res.Failed, res.Sent, res.Codes, err)
	}
}

// TestOpenLoopWindowMarksTheAttack: Window is called twice, true after the
// open and before the first claim, false once every claim has its answer.
func TestOpenLoopWindowMarksTheAttack(t *testing.T) {
	t.Parallel()
	g := &grantAll{}
	mux := http.NewServeMux()
	mux.Handle("/v1/activities/{a}/claims/{u}", g)
	mux.Handle("/", g)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	type mark struct {
		start         bool
		opens, claims int
	}
	var marks []mark
	window := func(start bool) {
		g.mu.Lock()
		defer g.mu.Unlock()
		marks = append(marks, mark{start, g.opens, g.seen})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := OpenLoop(ctx, OpenLoopConfig{BaseURL: srv.URL, Items: 5, Rate: 100, Duration: 200 * time.Millisecond, Window: window})
	if err != nil {
		t.Fatal(err)
	}
	want := []mark{{true, 1, 0}, {false, 1, res.Sent}}
	if res.Sent == 0 || len(marks) != 2 || marks[0] != want[0] || marks[1] != want[1] {
		t.Fatalf("marks %+v, want %+v (opened, no claim yet; then every claim answered)", marks, want)
	}
}
