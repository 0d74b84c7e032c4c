package ingest

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/allot-dev/allot/internal/wire"
)

// TestWaitersAreCapped: beyond MaxWaiters handlers waiting for results, a
// poll or write with ?wait= is served at once as if it had none: the poll
// answers 200 pending (a poll always answers 200), the write is published
// and answered 202; neither waits.
func TestWaitersAreCapped(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config, d *Deps) { c.MaxWaiters = 2 })
	var ids []string
	for u := range 3 {
		resp, body := h.do(req{method: "POST", path: fmt.Sprintf("/v1/activities/1/signups/%d", u+1)})
		ids = append(ids, accepted(t, "join", resp, body))
	}
	// Two polls wait (nothing applies: there is no allocator).
	var wg sync.WaitGroup
	for _, id := range ids[:2] {
		wg.Go(func() {
			resp, body := h.do(req{method: "GET", path: "/v1/requests/" + id + "?wait=10s"})
			wantStatus(t, "waiting poll", resp, body, http.StatusOK)
		})
	}
	eventually(t, 5*time.Second, "two waiters", func() bool { return h.svc.results.Count() == 2 })
	resp, body := h.do(req{method: "GET", path: "/v1/requests/" + ids[2] + "?wait=10s"})
	wantStatus(t, "third waiting poll", resp, body, http.StatusOK)
	if !strings.Contains(string(body), `"state":"pending"`) {
		t.Fatalf("third waiting poll: %s, want pending", body)
	}
	before := h.subjectMsgs(wire.RequestSubject(1))
	resp, body = h.do(req{method: "POST", path: "/v1/activities/1/signups/9?wait=10s"})
	accepted(t, "write with ?wait= over the cap", resp, body)
	if after := h.subjectMsgs(wire.RequestSubject(1)); after != before+1 {
		t.Fatalf("a write over the waiters' cap: %d → %d messages, want it published", before, after)
	}
	// Neither waited: both were counted as refused waits, and only the
	// two first polls are waiting still.
	if n := testutil.ToFloat64(h.svc.metrics.results.Refused); n != 2 {
		t.Fatalf("waits refused: %v, want 2", n)
	}
	if n := h.svc.results.Count(); n != 2 {
		t.Fatalf("%d waiters, want the first two polls only", n)
	}
	h.svc.endWaits()
	wg.Wait()
}

// TestWaitingReadsAreCoalesced: many handlers waiting at once read MySQL
// in gathered queries, not one query each per recheck, so they cannot take
// the whole connection pool.
func TestWaitingReadsAreCoalesced(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config, d *Deps) { d.Test.RecheckInterval = 50 * time.Millisecond })
	const waiters = 1000
	ids := make([]string, waiters)
	for i := range ids {
		resp, body := h.do(req{method: "POST", path: fmt.Sprintf("/v1/activities/%d/signups/1", i+1)})
		ids[i] = accepted(t, "join", resp, body)
	}
	start := testutil.ToFloat64(h.svc.metrics.results.Queries)
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			resp, body := h.do(req{method: "GET", path: "/v1/requests/" + id + "?wait=1s"})
			wantStatus(t, "waiting poll", resp, body, http.StatusOK)
		})
	}
	wg.Wait()
	// Each poll reads once first, about 20 times while waiting and once at
	// its deadline: some 22,000 reads, one query each without coalescing.
	queries := testutil.ToFloat64(h.svc.metrics.results.Queries) - start
	if queries == 0 || queries > 2000 {
		t.Fatalf("%v queries for %d waiting polls: the reads were not gathered", queries, waiters)
	}
	t.Logf("%d waiting polls read MySQL in %v queries", waiters, queries)
}

// TestOpensAreRateLimited: opens and resizes beyond OpenRate answer 429
// with Retry-After, and are not published.
func TestOpensAreRateLimited(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config, d *Deps) { c.OpenRate = 0.001 }) // a burst of one, then one in 1,000 s
	resp, body := h.do(req{method: "PUT", path: "/v1/activities/1", body: `{"capacity": 0}`})
	accepted(t, "first open", resp, body)
	before := h.subjectMsgs(wire.RequestSubject(2))
	resp, body = h.do(req{method: "PUT", path: "/v1/activities/2", body: `{"capacity": 0}`})
	wantStatus(t, "second open", resp, body, http.StatusTooManyRequests)
	if resp.Header.Get("Retry-After") == "" {
		t.Fatal("second open: no Retry-After")
	}
	if h.subjectMsgs(wire.RequestSubject(2)) != before {
		t.Fatal("a rate-limited open was published")
	}
	// Joins are not opens.
	resp, body = h.do(req{method: "POST", path: "/v1/activities/1/signups/1"})
	accepted(t, "join", resp, body)
}
