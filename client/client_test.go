package client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// script is a fake server that answers each request with the next step.
type script struct {
	mu    sync.Mutex
	steps []func(w http.ResponseWriter, r *http.Request)
	seen  []*http.Request
}

func (s *script) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.seen = append(s.seen, r)
	if len(s.steps) == 0 {
		s.mu.Unlock()
		http.Error(w, `{"error":"unexpected request"}`, http.StatusTeapot)
		return
	}
	step := s.steps[0]
	s.steps = s.steps[1:]
	s.mu.Unlock()
	step(w, r)
}

func answer(status int, body string, header ...string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write([]byte(body)) //nolint:errcheck
	}
}

const (
	id      = "0190f5e2-7c4a-7b3e-8f00-3c1d2e4f5a6b"
	pending = `{"request_id":"` + id + `","state":"pending"}`
	done    = `{"request_id":"` + id + `","state":"done","op":"join","activity_id":1,"user_id":2,"outcome":"WAITING","status":"WAITING","position":1,"promoted_user_id":null,"seq":9,"index":4,"applied_at":"2026-01-01T00:00:00Z"}`
)

func fake(t *testing.T, steps ...func(http.ResponseWriter, *http.Request)) (*script, *Client) {
	t.Helper()
	s := &script{steps: steps}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	c, err := New(srv.URL, WithWait(2*time.Second), WithRetries(5, time.Millisecond, 20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

// sleeps records the delays a client asks to wait (Retry-After and
// backoffs) instead of waiting them.
type sleeps struct {
	mu sync.Mutex
	d  []time.Duration
}

func recordSleeps(c *Client) *sleeps {
	s := &sleeps{}
	c.sleep = func(ctx context.Context, d time.Duration) error {
		s.mu.Lock()
		s.d = append(s.d, d)
		s.mu.Unlock()
		return ctx.Err()
	}
	return s
}

func (s *sleeps) all() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}

// inBackoff reports whether d is a backoff of the client's policy for a
// full wait of full: jittered over full's upper half, [full/2, full).
func inBackoff(d, full time.Duration) bool { return d >= full/2 && d < full }

// TestJoinRetriesWithOneKeyAndHonoursRetryAfter: a 503 with Retry-After,
// a 429 without one (retried after a backoff), a 202, a pending poll, then
// the result; every attempt of the write carries the same key, and the
// client waited exactly the Retry-After, then the policy's backoffs.
func TestJoinRetriesWithOneKeyAndHonoursRetryAfter(t *testing.T) {
	s, c := fake(t,
		answer(503, `{"error":"overloaded"}`, "Retry-After", "1"),
		answer(429, `{"error":"slow down"}`),
		answer(202, pending, "Location", "/v1/requests/"+id),
		answer(200, pending),
		answer(200, done),
	)
	slept := recordSleeps(c)
	res, err := c.Join(context.Background(), 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != Waiting || *res.Position != 1 || *res.Status != StatusWaiting || res.Seq != 9 || res.Index != 4 {
		t.Errorf("result %+v, want WAITING at position 1, at 9#4", res)
	}
	// The 503's Retry-After: 1 exactly; the 429 (the write's attempt 1)
	// a backoff of 2 x 1ms; the early pending poll (attempt 0) one of 1ms.
	if d := slept.all(); len(d) != 3 || d[0] != time.Second || !inBackoff(d[1], 2*time.Millisecond) || !inBackoff(d[2], time.Millisecond) {
		t.Errorf("the client waited %v, want [1s, [1ms,2ms), [0.5ms,1ms)]", d)
	}
	var keys []string
	for _, r := range s.seen[:3] {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/activities/1/signups/2" || r.URL.Query().Get("wait") != "2s" {
			t.Errorf("write sent as %s %s", r.Method, r.URL)
		}
		keys = append(keys, r.Header.Get("Idempotency-Key"))
	}
	if keys[0] == "" || keys[0] != keys[1] || keys[1] != keys[2] {
		t.Errorf("the attempts carried keys %q, want one key", keys)
	}
	for _, r := range s.seen[3:] {
		if r.URL.Path != "/v1/requests/"+id || r.URL.Query().Get("wait") != "2s" {
			t.Errorf("poll sent as %s %s", r.Method, r.URL)
		}
	}

	// A second logical attempt gets a key of its own.
	s2, c2 := fake(t, answer(200, done))
	if _, err := c2.Join(context.Background(), 1, 2); err != nil {
		t.Fatal(err)
	}
	if k := s2.seen[0].Header.Get("Idempotency-Key"); k == keys[0] {
		t.Error("two logical attempts shared a key")
	}
}

// TestClientErrorsAreNotRetried: a 4xx is the caller's mistake: one
// attempt, an APIError with the server's sentence; 404 matches ErrNotFound.
func TestClientErrorsAreNotRetried(t *testing.T) {
	s, c := fake(t, answer(422, `{"error":"The key is bound to another request."}`))
	_, err := c.Claim(context.Background(), 1, 2)
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 422 || !strings.Contains(ae.Message, "bound") {
		t.Fatalf("err = %v, want an APIError 422 with the server's sentence", err)
	}
	if len(s.seen) != 1 {
		t.Errorf("%d attempts, want 1", len(s.seen))
	}
	_, c = fake(t, answer(404, `{"error":"Activity 1 was never opened."}`))
	if _, err := c.Activity(context.Background(), 1); !errors.Is(err, ErrNotFound) {
		t.Errorf("err = %v, want ErrNotFound", err)
	}
}

// TestRetriesAreBounded: a server that keeps answering 503 costs the
// configured attempts, then its error.
func TestRetriesAreBounded(t *testing.T) {
	var steps []func(http.ResponseWriter, *http.Request)
	for range 10 {
		steps = append(steps, answer(503, `{"error":"down"}`))
	}
	s, c := fake(t, steps...)
	var seen []Exchange
	c.observe = func(x Exchange) { seen = append(seen, x) }
	_, err := c.Open(context.Background(), 1, 5)
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 503 {
		t.Fatalf("err = %v, want the last 503", err)
	}
	if len(s.seen) != 6 || len(seen) != 6 || seen[5].Retry || !seen[4].Retry {
		t.Errorf("%d attempts (%d observed), want 1 + 5 retries, the last not retried", len(s.seen), len(seen))
	}
	if body := s.seen[0]; body.Method != http.MethodPut || body.URL.Path != "/v1/activities/1" {
		t.Errorf("open sent as %s %s", body.Method, body.URL)
	}
}

// TestWaitBacksOffWhenTheServerDoesNotHold: pending answered at once is
// followed after a growing backoff, not in a busy loop.
func TestWaitBacksOffWhenTheServerDoesNotHold(t *testing.T) {
	s, c := fake(t, answer(200, pending), answer(200, pending), answer(200, pending), answer(200, done))
	c.minBackoff, c.maxBackoff = 40*time.Millisecond, time.Second
	slept := recordSleeps(c)
	res, err := c.Wait(context.Background(), id)
	if err != nil || !res.Done() {
		t.Fatalf("Wait = %+v, %v", res, err)
	}
	// 3 backoffs doubling from 40ms, each jittered over its upper half:
	// [20,40), [40,80) and [80,160)ms, so each longer than the one before.
	d := slept.all()
	if len(d) != 3 {
		t.Fatalf("the client waited %v between 4 polls, want 3 backoffs", d)
	}
	for i, full := range []time.Duration{40 * time.Millisecond, 80 * time.Millisecond, 160 * time.Millisecond} {
		if !inBackoff(d[i], full) {
			t.Errorf("backoff %d was %v, want [%v,%v)", i, d[i], full/2, full)
		}
	}
	if len(s.seen) != 4 {
		t.Errorf("%d polls, want 4", len(s.seen))
	}
}

func TestDecodeEvent(t *testing.T) {
	tests := []struct {
		name, data string
		ok         bool
	}{
		{"an event", `{"event_id":"e1","kind":"promoted","activity_id":1,"user_id":2,"request_id":"r","seq":3,"at":"2026-01-01T00:00:00Z"}`, true},
		{"not JSON", `nope`, false},
		{"no event_id", `{"kind":"promoted"}`, false},
		{"an event_id with a space", `{"event_id":"a b"}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev, err := DecodeEvent([]byte(tt.data))
			if tt.ok != (err == nil) || (!tt.ok && !errors.Is(err, ErrMalformedEvent)) {
				t.Fatalf("DecodeEvent = %v, want ok=%v (else ErrMalformedEvent)", err, tt.ok)
			}
			if tt.ok && (ev.Kind != EventPromoted || ev.UserID != 2) {
				t.Errorf("decoded %+v", ev)
			}
		})
	}
}

func TestNewRefusesABadURL(t *testing.T) {
	for _, u := range []string{"", "localhost:8080", "ftp://x", "http://"} {
		if _, err := New(u); err == nil {
			t.Errorf("New(%q) accepted it", u)
		}
	}
}

func TestWithoutKeys(t *testing.T) {
	s, c := fake(t, answer(200, done), answer(200, done))
	WithoutKeys()(c)
	if _, err := c.Join(context.Background(), 1, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do(context.Background(), Write{Op: OpJoin, Activity: 1, User: 2, Key: "mine"}); err != nil {
		t.Fatal(err)
	}
	if k := s.seen[0].Header.Get("Idempotency-Key"); k != "" {
		t.Errorf("WithoutKeys sent key %q", k)
	}
	if k := s.seen[1].Header.Get("Idempotency-Key"); k != "mine" {
		t.Errorf("an explicit key was sent as %q", k)
	}
}

// TestHoldRoutes: OpenWithHold sends the hold as a Go duration beside the
// capacity (and no hold field without one); Confirm posts to the signup's
// confirm route; a HELD result decodes with its held_until.
func TestHoldRoutes(t *testing.T) {
	var bodies []string
	body := func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodies = append(bodies, string(b))
		answer(200, `{"request_id":"`+id+`","state":"done","op":"open","activity_id":1,"user_id":0,"outcome":"OPENED","status":null,"position":null,"promoted_user_id":null,"capacity":3,"seq":1,"applied_at":"2026-01-01T00:00:00Z"}`)(w, r)
	}
	held := `{"request_id":"` + id + `","state":"done","op":"join","activity_id":1,"user_id":2,"outcome":"HELD","status":"HELD","position":null,"promoted_user_id":null,"held_until":"2026-01-01T00:10:00.000001Z","seq":2,"applied_at":"2026-01-01T00:00:00Z"}`
	confirmed := `{"request_id":"` + id + `","state":"done","op":"confirm","activity_id":1,"user_id":2,"outcome":"CONFIRMED","status":"CONFIRMED","position":null,"promoted_user_id":null,"seq":3,"applied_at":"2026-01-01T00:01:00Z"}`
	s, c := fake(t, body, body, answer(200, held), answer(200, confirmed))
	ctx := context.Background()
	if _, err := c.OpenWithHold(ctx, 1, 3, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Open(ctx, 1, 3); err != nil {
		t.Fatal(err)
	}
	if bodies[0] != `{"capacity":3,"hold":"10m0s"}` || bodies[1] != `{"capacity":3}` {
		t.Errorf("open bodies %q, want the hold only on the first", bodies)
	}
	res, err := c.Join(ctx, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != Held || *res.Status != StatusHeld || res.HeldUntil == nil ||
		!res.HeldUntil.Equal(time.Date(2026, 1, 1, 0, 10, 0, 1000, time.UTC)) {
		t.Errorf("held join: %+v", res)
	}
	res, err = c.Confirm(ctx, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != Confirmed || res.Op != OpConfirm || res.HeldUntil != nil {
		t.Errorf("confirm: %+v", res)
	}
	if r := s.seen[3]; r.Method != http.MethodPost || r.URL.Path != "/v1/activities/1/signups/2/confirm" || r.Header.Get("Idempotency-Key") == "" {
		t.Errorf("confirm sent as %s %s (key %q)", r.Method, r.URL, r.Header.Get("Idempotency-Key"))
	}
}
