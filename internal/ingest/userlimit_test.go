package ingest

import (
	"net/http"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/wire"
)

func TestUserLimiterBucket(t *testing.T) {
	l := newUserLimiter(10, 3)
	now := time.Unix(1000, 0)
	for i := range 3 {
		if ok, _ := l.allow(7, now); !ok {
			t.Fatalf("write %d within the burst refused", i+1)
		}
	}
	ok, wait := l.allow(7, now)
	if ok || wait <= 0 || wait > 100*time.Millisecond {
		t.Fatalf("4th write at once: allowed %v, wait %s; want refused with a wait up to 100ms", ok, wait)
	}
	if ok, _ := l.allow(8, now); !ok {
		t.Fatal("another user was refused")
	}
	if ok, _ := l.allow(7, now.Add(100*time.Millisecond)); !ok {
		t.Fatal("a token due after 100ms was refused")
	}
}

func TestUserLimiterMemoryIsBounded(t *testing.T) {
	l := newUserLimiter(1, 1)
	l.max = 100 // per shard
	now := time.Unix(1000, 0)
	for u := int64(0); u < 100_000; u++ {
		l.allow(u, now)
	}
	total := 0
	for i := range l.shards {
		total += len(l.shards[i].m)
	}
	if total > 64*100 {
		t.Fatalf("%d buckets kept, want at most %d", total, 64*100)
	}
}

// TestPerUserRateLimit: one user over the limit gets 429 with Retry-After,
// others are served, nothing of the refused writes is published.
func TestPerUserRateLimit(t *testing.T) {
	t.Parallel()
	// A token every 1000s: none refills during the test however slow the
	// machine, so the count of refusals does not depend on the clock.
	h := newHarness(t, Options{UserRate: 0.001, UserBurst: 2})
	codes := map[int]int{}
	for range 5 {
		resp, _ := h.do(req{method: "POST", path: "/v1/activities/1/claims/42"})
		codes[resp.StatusCode]++
		if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
			t.Fatal("429 without Retry-After")
		}
	}
	if codes[http.StatusAccepted] != 2 || codes[http.StatusTooManyRequests] != 3 {
		t.Fatalf("answers %v, want 2 accepted and 3 refused", codes)
	}
	// A confirm spends the same user's budget.
	if resp, _ := h.do(req{method: "POST", path: "/v1/activities/1/signups/42/confirm"}); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("confirm by the same user: %d, want 429", resp.StatusCode)
	}
	if resp, _ := h.do(req{method: "POST", path: "/v1/activities/1/claims/43"}); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("another user: %d, want 202", resp.StatusCode)
	}
	if n := natstest.StreamMsgs(t, h.js, wire.RequestStream); n != 3 {
		t.Fatalf("stream holds %d requests, want 3", n)
	}
}
