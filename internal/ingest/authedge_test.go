package ingest

import (
	"context"
	"net/http"
	"testing"

	"github.com/allot-dev/allot/internal/auth"
	"github.com/allot-dev/allot/internal/ingest/access"
)

// TestAuthSubjectMustBeCanonical: a sub is a user id only in its canonical
// decimal form; "+7", "007" and the like are refused with 401 instead of
// acting as user 7 (with an idempotency scope and a rate budget of their
// own), with or without a scope.
func TestAuthSubjectMustBeCanonical(t *testing.T) {
	t.Parallel()
	h := newAuthHarness(t, func(c *Config, d *Deps) { c.BadAuthRate = -1 })
	resp, body := h.do(req{method: http.MethodPost, path: "/v1/activities/1/claims/7", header: bearer(tokenFor(t, "7"))})
	accepted(t, "sub 7", resp, body)
	for _, sub := range []string{"+7", "007", " 7", "7 ", "7.0", "0", "-7", "0x7", "1_0", "9223372036854775808"} {
		for _, scopes := range [][]string{nil, {auth.ScopeAdmin}} {
			before := h.streamMsgs()
			resp, body := h.do(req{method: http.MethodPost, path: "/v1/activities/1/claims/7", header: bearer(tokenFor(t, sub, scopes...))})
			what := "sub " + `"` + sub + `"`
			if scopes != nil {
				what += " with allot:admin"
			}
			wantStatus(t, what, resp, body, http.StatusUnauthorized)
			errorSentence(t, what, resp, body)
			if resp.Header.Get("WWW-Authenticate") != "Bearer" {
				t.Errorf("%s: WWW-Authenticate = %q, want Bearer", what, resp.Header.Get("WWW-Authenticate"))
			}
			if got := h.streamMsgs(); got != before {
				t.Errorf("%s: the request stream holds %d messages, want %d", what, got, before)
			}
		}
	}
	// A service name with a scope stays a service token.
	resp, body = h.do(req{method: http.MethodPost, path: "/v1/activities/1/claims/7", header: bearer(tokenFor(t, "loadgen", auth.ScopeAdmin))})
	accepted(t, "service sub with allot:admin", resp, body)
}

// TestAuthValidTokenNeverLimitedByOthersBadOnes: one client behind the
// same address flooding bad tokens gets 429s, while a token that verifies,
// from that same address, is served.
func TestAuthValidTokenNeverLimitedByOthersBadOnes(t *testing.T) {
	t.Parallel()
	h := newAuthHarness(t, func(c *Config, d *Deps) { c.BadAuthRate = 0.01 })
	for range access.DefaultBadAuthBurst + 5 {
		h.do(req{method: http.MethodPost, path: "/v1/activities/7/claims/1", header: bearer("bad.token.here")})
	}
	resp, body := h.do(req{method: http.MethodPost, path: "/v1/activities/7/claims/1", header: bearer("bad.token.here")})
	wantStatus(t, "a bad token after the flood", resp, body, http.StatusTooManyRequests)
	if resp.Header.Get("Retry-After") == "" {
		t.Fatalf("429 without Retry-After: %s", body)
	}
	for u := range 3 {
		tok := tokenFor(t, jsonInt(int64(u+2)))
		resp, body := h.do(req{method: http.MethodPost, path: "/v1/activities/7/claims/" + jsonInt(int64(u+2)), header: bearer(tok)})
		accepted(t, "a valid token from the flooded address", resp, body)
	}
}

// TestAuthTrustedProxyKeysByForwardedAddress: behind a trusted proxy the
// bad-token limiter counts the client address the proxy forwards (the
// rightmost untrusted hop of X-Forwarded-For), so one bad client does not
// lock out the others behind the proxy; without a trusted proxy the header
// is ignored (a client could forge it).
func TestAuthTrustedProxyKeysByForwardedAddress(t *testing.T) {
	t.Parallel()
	flood := func(h *harness, xff string) {
		for range access.DefaultBadAuthBurst + 1 {
			h.do(req{method: http.MethodPost, path: "/v1/activities/7/claims/1",
				header: map[string]string{"Authorization": "Bearer bad.token.here", "X-Forwarded-For": xff}})
		}
	}
	badFrom := func(h *harness, xff string) int {
		resp, _ := h.do(req{method: http.MethodPost, path: "/v1/activities/7/claims/1",
			header: map[string]string{"Authorization": "Bearer bad.token.here", "X-Forwarded-For": xff}})
		return resp.StatusCode
	}
	t.Run("trusted", func(t *testing.T) {
		t.Parallel()
		h := newAuthHarness(t, func(c *Config, d *Deps) { c.BadAuthRate = 0.01; c.TrustedProxies = "127.0.0.0/8" })
		// The bad client is 203.0.113.5; the forged leftmost hop is ignored.
		flood(h, "198.51.100.1, 203.0.113.5")
		if got := badFrom(h, "198.51.100.2, 203.0.113.5"); got != http.StatusTooManyRequests {
			t.Fatalf("the flooding client (forwarded 203.0.113.5) answered %d, want 429", got)
		}
		if got := badFrom(h, "203.0.113.6"); got != http.StatusUnauthorized {
			t.Fatalf("another client behind the proxy (203.0.113.6) answered %d, want 401", got)
		}
		// A trusted hop to the right is skipped: the client is 203.0.113.7.
		if got := badFrom(h, "203.0.113.7, 127.0.0.9"); got != http.StatusUnauthorized {
			t.Fatalf("a client forwarded through two trusted proxies answered %d, want 401", got)
		}
	})
	t.Run("untrusted", func(t *testing.T) {
		t.Parallel()
		h := newAuthHarness(t, func(c *Config, d *Deps) { c.BadAuthRate = 0.01 })
		flood(h, "203.0.113.5")
		if got := badFrom(h, "203.0.113.6"); got != http.StatusTooManyRequests {
			t.Fatalf("a forged X-Forwarded-For from an untrusted peer answered %d, want 429 (the peer address counts)", got)
		}
	})
}

// TestAuthReadLimitBySubject: activity and signup reads spend the token
// subject's read budget (one budget for both, whatever the path names):
// beyond it 429 with Retry-After and one sentence, while another subject
// and an admin are served.
func TestAuthReadLimitBySubject(t *testing.T) {
	t.Parallel()
	h := newAuthHarness(t, func(c *Config, d *Deps) { c.ReadRate = 0.01; d.Test.ReadBurst = 3; c.BadAuthRate = -1 })
	ctx := context.Background()
	if _, err := h.db.ExecContext(ctx, "INSERT INTO activity (id, capacity, confirmed_count) VALUES (1, 2, 1)"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.db.ExecContext(ctx, "INSERT INTO activity_signup (activity_id, user_id, status, queue_seq) VALUES (1, 5, 'CONFIRMED', 1)"); err != nil {
		t.Fatal(err)
	}
	user5 := bearer(tokenFor(t, "5"))
	for i, path := range []string{"/v1/activities/1", "/v1/activities/1/signups/5", "/v1/activities/2"} {
		resp, body := h.do(req{method: http.MethodGet, path: path, header: user5})
		if resp.StatusCode == http.StatusTooManyRequests {
			t.Fatalf("read %d (%s) within the burst: 429 %s", i+1, path, body)
		}
	}
	for _, path := range []string{"/v1/activities/1", "/v1/activities/1/signups/5", "/v1/activities/99"} {
		resp, body := h.do(req{method: http.MethodGet, path: path, header: user5})
		wantStatus(t, "user 5 over its read budget: "+path, resp, body, http.StatusTooManyRequests)
		errorSentence(t, path, resp, body)
		if resp.Header.Get("Retry-After") == "" {
			t.Fatalf("429 without Retry-After: %s", body)
		}
	}
	resp, body := h.do(req{method: http.MethodGet, path: "/v1/activities/1", header: bearer(tokenFor(t, "6"))})
	wantStatus(t, "another subject", resp, body, http.StatusOK)
	admin := bearer(tokenFor(t, "99", auth.ScopeAdmin))
	for range 10 {
		resp, body := h.do(req{method: http.MethodGet, path: "/v1/activities/1/signups/5", header: admin})
		wantStatus(t, "an admin's read", resp, body, http.StatusOK)
	}
}

// TestReadLimitWithoutAuth: without authentication a signup read spends
// the path user's budget (as writes do); activity reads, with no caller to
// count, are not limited.
func TestReadLimitWithoutAuth(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config, d *Deps) { c.ReadRate = 0.01; d.Test.ReadBurst = 2 })
	ctx := context.Background()
	if _, err := h.db.ExecContext(ctx, "INSERT INTO activity (id, capacity, confirmed_count) VALUES (1, 2, 0)"); err != nil {
		t.Fatal(err)
	}
	codes := func(path string, n int) map[int]int {
		out := map[int]int{}
		for range n {
			resp, _ := h.do(req{method: http.MethodGet, path: path})
			out[resp.StatusCode]++
		}
		return out
	}
	if got := codes("/v1/activities/1/signups/5", 3); got[http.StatusNotFound] != 2 || got[http.StatusTooManyRequests] != 1 {
		t.Fatalf("user 5's signup reads: %v, want 2×404 then 429", got)
	}
	if got := codes("/v1/activities/1/signups/6", 1); got[http.StatusNotFound] != 1 {
		t.Fatalf("user 6's signup read: %v, want 404", got)
	}
	if got := codes("/v1/activities/1", 5); got[http.StatusOK] != 5 {
		t.Fatalf("activity reads without authentication: %v, want 5×200", got)
	}
}
