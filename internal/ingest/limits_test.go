package ingest

import (
	"net/http"
	"testing"

	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/wire"
)

// TestPerUserRateLimit: one user over the limit gets 429 with Retry-After,
// others are served, nothing of the refused writes is published.
func TestPerUserRateLimit(t *testing.T) {
	t.Parallel()
	// A token every 1000s: none refills during the test however slow the
	// machine, so the count of refusals does not depend on the clock.
	h := newHarness(t, func(c *Config, d *Deps) { c.UserRate = 0.001; d.Test.UserBurst = 2 })
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
