// Package e2e drives the whole system through its HTTP surface: a real
// ingest, a real allocator, a real JetStream server and a real MariaDB
// database per test.
package e2e

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/ingest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/stacktest"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// stack is one test's running system.
type stack struct {
	t   *testing.T
	db  *dbtest.DB
	ns  *natstest.Server
	js  jetstream.JetStream
	url string
	cl  *http.Client
}

func newStack(t *testing.T, acfg allocator.Config) *stack {
	return newStackOpts(t, acfg, stacktest.IngestConfig(), ingest.Deps{})
}

func newStackOpts(t *testing.T, acfg allocator.Config, icfg ingest.Config, ideps ingest.Deps) *stack {
	t.Helper()
	st := stacktest.Start(t, acfg, icfg, ideps)
	return &stack{t: t, db: st.DB, ns: st.NS, js: st.JS, url: st.URL,
		cl: &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 512, MaxConnsPerHost: 512}}}
}

// call sends one request and decodes the JSON answer into a map.
func (s *stack) call(method, path, body string, header ...string) (int, map[string]any) {
	s.t.Helper()
	code, m, err := s.try(method, path, body, header...)
	if err != nil {
		s.t.Fatal(err)
	}
	return code, m
}

func (s *stack) try(method, path, body string, header ...string) (int, map[string]any, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, s.url+path, rd)
	if err != nil {
		return 0, nil, err
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := s.cl.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var m map[string]any
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &m); err != nil {
		return resp.StatusCode, nil, fmt.Errorf("%s %s: answer %d is not JSON: %q", method, path, resp.StatusCode, b)
	}
	return resp.StatusCode, m, nil
}

// done sends a write with ?wait and requires its final result.
func (s *stack) done(method, path, body string) map[string]any {
	s.t.Helper()
	code, m := s.call(method, path+"?wait=10s", body)
	if code != http.StatusOK || m["state"] != wire.StateDone {
		s.t.Fatalf("%s %s: %d %v, want 200 done", method, path, code, m)
	}
	return m
}

// tryDone is done for other goroutines than the test's: it returns what
// went wrong instead of failing the test, and stores the answer in *into
// when into is not nil.
func (s *stack) tryDone(method, path string, into *map[string]any) error {
	code, m, err := s.try(method, path, "")
	if err != nil {
		return err
	}
	if code != http.StatusOK || m["state"] != wire.StateDone {
		return fmt.Errorf("%s %s: %d %v, want 200 done", method, path, code, m)
	}
	if into != nil {
		*into = m
	}
	return nil
}

func (s *stack) open(activity, capacity int) {
	s.t.Helper()
	m := s.done("PUT", fmt.Sprintf("/v1/activities/%d", activity), fmt.Sprintf(`{"capacity": %d}`, capacity))
	if o := m["outcome"]; o != string(wire.OutcomeOpened) && o != string(wire.OutcomeResized) {
		s.t.Fatalf("open %d: %v", activity, m)
	}
}

func (s *stack) join(a, u int) map[string]any {
	return s.done("POST", fmt.Sprintf("/v1/activities/%d/signups/%d", a, u), "")
}

func (s *stack) cancel(a, u int) map[string]any {
	return s.done("DELETE", fmt.Sprintf("/v1/activities/%d/signups/%d", a, u), "")
}

func (s *stack) signup(a, u int) map[string]any {
	s.t.Helper()
	code, m := s.call("GET", fmt.Sprintf("/v1/activities/%d/signups/%d", a, u), "")
	if code != http.StatusOK {
		s.t.Fatalf("signup %d/%d: %d %v", a, u, code, m)
	}
	return m
}

func want(t *testing.T, what string, m map[string]any, fields ...any) {
	t.Helper()
	if len(fields)%2 != 0 {
		t.Fatalf("%s: want takes key, value pairs; got %d arguments", what, len(fields))
	}
	for i := 0; i+1 < len(fields); i += 2 {
		k := fields[i].(string)
		got := m[k]
		w := fields[i+1]
		if n, ok := w.(int); ok {
			w = float64(n)
		}
		// A typed word (wire.Op, wire.Outcome, …) compares as the JSON
		// string it is sent as.
		if v := reflect.ValueOf(w); v.IsValid() && v.Kind() == reflect.String {
			w = v.String()
		}
		if got != w {
			t.Fatalf("%s: %s = %v, want %v (answer %v)", what, k, got, w, m)
		}
	}
}

// outboxEvents is the number of events the results of activity recorded.
func (s *stack) outboxEvents(activity int) int {
	s.t.Helper()
	rows, err := s.db.Query("SELECT events FROM processed_request WHERE activity_id = ? AND events IS NOT NULL", activity)
	if err != nil {
		s.t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var enc string
		if err := rows.Scan(&enc); err != nil {
			s.t.Fatal(err)
		}
		evs, err := store.DecodeEvents(enc)
		if err != nil {
			s.t.Fatal(err)
		}
		n += len(evs)
	}
	if err := rows.Err(); err != nil {
		s.t.Fatal(err)
	}
	return n
}

// eventsFor reads the events of one activity from ALLOT_EVENTS.
func (s *stack) eventsFor(activity int, atLeast int) []wire.Event {
	s.t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var out []wire.Event
		c, err := s.js.OrderedConsumer(ctx, wire.EventStream, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{fmt.Sprintf("alloc.evt.%d.>", activity)},
		})
		if err != nil {
			s.t.Fatal(err)
		}
		batch, err := c.FetchNoWait(10000)
		if err != nil {
			s.t.Fatal(err)
		}
		for m := range batch.Messages() {
			var ev wire.Event
			if err := json.Unmarshal(m.Data(), &ev); err != nil {
				s.t.Fatal(err)
			}
			out = append(out, ev)
		}
		if len(out) >= atLeast {
			return out
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("activity %d: %d events, want at least %d", activity, len(out), atLeast)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSeedWaitlistStory is the seed waitlist's story, through HTTP.
func TestSeedWaitlistStory(t *testing.T) {
	t.Parallel()
	s := newStack(t, config.Defaults[allocator.Config]())
	const act, A, B, C = 9001, 1, 2, 3
	s.open(act, 1)
	want(t, "A joins", s.join(act, A), "outcome", string(wire.OutcomeConfirmed), "status", string(wire.StatusConfirmed))
	want(t, "B joins", s.join(act, B), "outcome", string(wire.OutcomeWaiting), "position", 1)
	want(t, "C joins", s.join(act, C), "outcome", string(wire.OutcomeWaiting), "position", 2)

	want(t, "cancel A", s.cancel(act, A), "outcome", string(wire.OutcomeCancelled), "promoted_user_id", B)
	want(t, "B after", s.signup(act, B), "status", string(wire.StatusConfirmed))
	want(t, "C after", s.signup(act, C), "status", string(wire.StatusWaiting), "position", 1)

	want(t, "cancel B", s.cancel(act, B), "outcome", string(wire.OutcomeCancelled), "promoted_user_id", C)
	want(t, "C promoted", s.signup(act, C), "status", string(wire.StatusConfirmed))

	want(t, "A re-joins", s.join(act, A), "outcome", string(wire.OutcomeWaiting), "position", 1)
	want(t, "D joins", s.join(act, 4), "outcome", string(wire.OutcomeWaiting), "position", 2)

	// Duplicates change nothing.
	want(t, "C joins again", s.join(act, C), "outcome", string(wire.OutcomeAlreadyConfirmed))
	want(t, "A joins again", s.join(act, A), "outcome", string(wire.OutcomeAlreadyWaiting), "position", 1)
	want(t, "B cancels again", s.cancel(act, B), "outcome", string(wire.OutcomeNotSignedUp), "promoted_user_id", nil)
	code, st := s.call("GET", fmt.Sprintf("/v1/activities/%d", act), "")
	if code != 200 {
		t.Fatalf("state: %d", code)
	}
	want(t, "state", st, "capacity", 1, "confirmed", 1, "waiting", 2, "remaining", 0)

	// Wait for every event the results recorded (the outbox), not for a
	// guess: the relay publishes after the commit.
	evs := s.eventsFor(act, s.outboxEvents(act))
	var promoted []int64
	count := map[wire.EventKind]int{}
	for _, e := range evs {
		count[e.Kind]++
		if e.Kind == wire.EventPromoted {
			promoted = append(promoted, e.UserID)
		}
	}
	if fmt.Sprint(promoted) != fmt.Sprint([]int64{B, C}) {
		t.Fatalf("promoted events for %v, want [B C] = [%d %d]", promoted, B, C)
	}
	wantCount := map[string]int{"opened": 1, "confirmed": 1, "sold_out": 1, "waitlisted": 4, "cancelled": 2, "promoted": 2}
	if fmt.Sprint(count) != fmt.Sprint(wantCount) {
		t.Fatalf("events %v, want %v", count, wantCount)
	}
	s.db.CheckInvariants(t)
}

// TestCancelVersusJoinRace: while a confirmed user cancels, concurrent joins
// from new users never take the seat ahead of the first waiter.
func TestCancelVersusJoinRace(t *testing.T) {
	t.Parallel()
	s := newStack(t, config.Defaults[allocator.Config]())
	const rounds, joiners = 25, 12
	for r := 1; r <= rounds; r++ {
		act := 100 + r
		s.open(act, 1)
		s.join(act, 1)                                                // confirmed
		want(t, "first waiter", s.join(act, 2), "outcome", "WAITING") // first waiter
		// The goroutines only record what they got: t.Fatal belongs to the
		// test's own goroutine.
		var wg sync.WaitGroup
		results := make([]map[string]any, joiners)
		errs := make([]error, joiners+1)
		wg.Add(joiners + 1)
		go func() {
			defer wg.Done()
			errs[joiners] = s.tryDone("DELETE", fmt.Sprintf("/v1/activities/%d/signups/1?wait=10s", act), nil)
		}()
		for j := range joiners {
			go func() {
				defer wg.Done()
				errs[j] = s.tryDone("POST", fmt.Sprintf("/v1/activities/%d/signups/%d?wait=10s", act, 1000+j), &results[j])
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatalf("round %d: %v", r, err)
			}
		}
		for j, m := range results {
			if m["outcome"] != string(wire.OutcomeWaiting) {
				t.Fatalf("round %d: new joiner %d got %v ahead of the first waiter", r, 1000+j, m["outcome"])
			}
		}
		want(t, fmt.Sprintf("round %d first waiter", r), s.signup(act, 2), "status", string(wire.StatusConfirmed))
	}
	s.db.CheckInvariants(t)
}

// TestFlashSaleBurst: 2,000 concurrent claims from 1,800 players for 100
// items, several rounds: exactly 100 granted, nobody twice, every request
// has a final result, invariants hold after each round.
func TestFlashSaleBurst(t *testing.T) {
	t.Parallel()
	for _, shed := range []bool{true, false} {
		t.Run(fmt.Sprintf("shed=%v", shed), func(t *testing.T) {
			t.Parallel()
			icfg := stacktest.IngestConfig()
			icfg.Shed = shed
			flashSale(t, newStackOpts(t, config.Defaults[allocator.Config](), icfg, ingest.Deps{}), shed)
		})
	}
}

func flashSale(t *testing.T, s *stack, shed bool) {
	const claims, players, items, rounds = 2000, 1800, 100, 3
	totalShed := 0
	for r := 1; r <= rounds; r++ {
		act := 9000 + r
		s.open(act, items)
		outcomes := make([]string, claims)
		shedAnswers := make([]bool, claims)
		answers := make([]map[string]any, claims)
		users := make([]int, claims)
		var wg sync.WaitGroup
		sem := make(chan struct{}, 256)
		errs := make(chan error, claims)
		for i := range claims {
			users[i] = (i*7919)%players + 1 // every player once, 200 of them twice
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				code, m, err := s.try("POST", fmt.Sprintf("/v1/activities/%d/claims/%d?wait=20s", act, users[i]), "")
				if err != nil || code != http.StatusOK {
					errs <- fmt.Errorf("claim %d: %d %v %v", i, code, m, err)
					return
				}
				outcomes[i], _ = m["outcome"].(string)
				shedAnswers[i] = m["shed"] == true
				answers[i] = m
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		count := map[string]int{}
		owners := map[int]int{}
		nshed := 0
		for i, o := range outcomes {
			count[o]++
			if shedAnswers[i] {
				nshed++
				if o == string(wire.OutcomeGranted) {
					t.Fatalf("round %d: a shed answer granted a seat", r)
				}
			}
			if o == string(wire.OutcomeGranted) {
				owners[users[i]]++
			}
		}
		if count[string(wire.OutcomeGranted)] != items {
			t.Fatalf("round %d: %d GRANTED, want exactly %d (%v)", r, count[string(wire.OutcomeGranted)], items, count)
		}
		if count[string(wire.OutcomeGranted)]+count[string(wire.OutcomeSoldOut)]+count[string(wire.OutcomeAlreadyOwned)] != claims {
			t.Fatalf("round %d: outcomes %v do not cover all %d claims", r, count, claims)
		}
		for u, n := range owners {
			if n > 1 {
				t.Fatalf("round %d: player %d owns %d", r, u, n)
			}
		}
		if n := s.db.Count(t, "SELECT COUNT(*) FROM activity_signup WHERE activity_id = ? AND status = 'CONFIRMED'", act); n != items {
			t.Fatalf("round %d: %d CONFIRMED rows, want %d", r, n, items)
		}
		if !shed && nshed > 0 {
			t.Fatalf("round %d: %d answers shed with shedding off", r, nshed)
		}
		// A shed answer is exact: ALREADY_OWNED only to a player MySQL
		// says owns an item, SOLD_OUT only to one who owns none.
		for i, o := range outcomes {
			if !shedAnswers[i] {
				continue
			}
			owns := s.db.Count(t, "SELECT COUNT(*) FROM activity_signup WHERE activity_id = ? AND user_id = ? AND status = 'CONFIRMED'", act, users[i]) > 0
			switch {
			case o == string(wire.OutcomeAlreadyOwned) && !owns:
				t.Fatalf("round %d: player %d was answered ALREADY_OWNED from the view and owns nothing", r, users[i])
			case o == string(wire.OutcomeSoldOut) && owns:
				t.Fatalf("round %d: player %d was answered SOLD_OUT from the view and owns an item", r, users[i])
			case o != string(wire.OutcomeAlreadyOwned) && o != string(wire.OutcomeSoldOut):
				t.Fatalf("round %d: a shed answer with outcome %s", r, o)
			}
		}
		totalShed += nshed
		// Every claim is stored and applied, those shed too, and
		// every answer a client got is the allocator's recorded decision.
		s.waitStored(act, claims)
		for i, m := range answers {
			s.sameAsRecorded(fmt.Sprintf("round %d claim %d", r, i), m)
		}
		t.Logf("round %d: %d claims, %d answered from the view", r, claims, nshed)
		s.db.CheckInvariants(t)
	}
	// With shedding on, 1,900 of each round's claims come after the sell
	// out: the limit must have bitten.
	if shed && totalShed == 0 {
		t.Fatalf("shedding on, yet none of %d claims was answered from the view (\"shed\": true)", rounds*claims)
	}
}

// waitStored waits until activity has n recorded results.
func (s *stack) waitStored(activity, n int) {
	s.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := s.db.Count(s.t, "SELECT COUNT(*) FROM processed_request WHERE activity_id = ? AND op <> 'open'", activity)
		if got == int64(n) {
			return
		}
		if got > int64(n) || time.Now().After(deadline) {
			s.t.Fatalf("activity %d: %d recorded results, want %d", activity, got, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sameAsRecorded requires that answer m, as a client received it (shed or
// not), is the result the allocator recorded for its request id.
func (s *stack) sameAsRecorded(what string, m map[string]any) {
	s.t.Helper()
	id, _ := m["request_id"].(string)
	var outcome, op string
	var status sql.NullString
	var seq, index float64
	var activity, user int64
	var until sql.NullTime
	err := s.db.QueryRow("SELECT outcome, status, seq, batch_index, op, activity_id, user_id, held_until FROM processed_request WHERE request_id = ?", id).
		Scan(&outcome, &status, &seq, &index, &op, &activity, &user, &until)
	if err != nil {
		s.t.Fatalf("%s: recorded result of %s: %v (answer %v)", what, id, err, m)
	}
	var wantStatus any
	if status.Valid {
		wantStatus = status.String
	}
	if m["outcome"] != outcome || m["status"] != wantStatus || m["seq"] != seq || m["index"] != index || m["op"] != op ||
		m["activity_id"] != float64(activity) || m["user_id"] != float64(user) {
		s.t.Fatalf("%s: answer %v, but the allocator recorded %s %v at %v#%v for %s/%d/%d", what, m, outcome, wantStatus, seq, index, op, activity, user)
	}
	got, has := m["held_until"]
	switch {
	case has != until.Valid:
		s.t.Fatalf("%s: answer %v, but the allocator recorded held_until %v", what, m, until)
	case has:
		at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(got))
		if err != nil || !at.Equal(until.Time) {
			s.t.Fatalf("%s: answer held_until %v, but the allocator recorded %v", what, got, until.Time)
		}
	}
}

// TestIdempotencyKeyEndToEnd: a repeat is one request with one effect.
func TestIdempotencyKeyEndToEnd(t *testing.T) {
	t.Parallel()
	s := newStack(t, config.Defaults[allocator.Config]())
	s.open(5, 10)
	_, first := s.call("POST", "/v1/activities/5/signups/8?wait=10s", "", "Idempotency-Key", "tap-1")
	_, again := s.call("POST", "/v1/activities/5/signups/8?wait=10s", "", "Idempotency-Key", "tap-1")
	if first["request_id"] == nil || first["request_id"] != again["request_id"] {
		t.Fatalf("repeat got request_id %v, first %v", again["request_id"], first["request_id"])
	}
	want(t, "repeat", again, "outcome", string(wire.OutcomeConfirmed), "state", "done")
	code, m := s.call("DELETE", "/v1/activities/5/signups/8", "", "Idempotency-Key", "tap-1")
	if code != http.StatusUnprocessableEntity {
		t.Fatalf("key reused for another op: %d %v, want 422", code, m)
	}
	if n := s.db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE activity_id = 5 AND op = 'join'"); n != 1 {
		t.Fatalf("%d join results, want 1", n)
	}
	if n := s.db.Count(t, "SELECT confirmed_count FROM activity WHERE id = 5"); n != 1 {
		t.Fatalf("confirmed_count %d, want 1", n)
	}
}

// claimUntilShed claims until ingest answers from the view (the view follows
// the commit by a moment), and returns that answer. Claims answered through
// the stream first must carry the same outcome.
func (s *stack) claimUntilShed(a, u int, outcome string) map[string]any {
	s.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m := s.done("POST", fmt.Sprintf("/v1/activities/%d/claims/%d", a, u), "")
		if m["outcome"] != outcome {
			s.t.Fatalf("claim %d/%d: %v, want %s", a, u, m, outcome)
		}
		if m["shed"] == true {
			return m
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("claim %d/%d never answered from the view", a, u)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// claimStream claims and requires an answer from the stream (not shed).
func (s *stack) claimStream(a, u int, outcome string) map[string]any {
	s.t.Helper()
	m := s.done("POST", fmt.Sprintf("/v1/activities/%d/claims/%d", a, u), "")
	if m["outcome"] != outcome || m["shed"] == true {
		s.t.Fatalf("claim %d/%d: %v, want %s through the stream", a, u, m, outcome)
	}
	return m
}

// TestShedAnswersAreExact: claims answered at once for a full activity give
// holders ALREADY_OWNED and others SOLD_OUT, exactly as the allocator would;
// a waitlist or a freed seat ends the shedding, a promotion that leaves the
// activity full without waiters starts it again.
func TestShedAnswersAreExact(t *testing.T) {
	t.Parallel()
	s := newStack(t, config.Defaults[allocator.Config]())
	const act = 77
	s.open(act, 2)
	s.join(act, 1)
	s.join(act, 2)

	want(t, "holder", s.claimUntilShed(act, 1, string(wire.OutcomeAlreadyOwned)), "status", string(wire.StatusConfirmed))
	sold := s.claimUntilShed(act, 9, string(wire.OutcomeSoldOut))
	code, poll := s.call("GET", "/v1/requests/"+sold["request_id"].(string), "")
	if code != 200 {
		t.Fatalf("poll of a shed answer: %d %v", code, poll)
	}
	want(t, "poll of a shed answer", poll, "state", wire.StateDone, "outcome", string(wire.OutcomeSoldOut))

	// A waiter: the view goes with the result that made it, no shedding.
	s.join(act, 3)
	want(t, "waiter", s.claimStream(act, 3, string(wire.OutcomeAlreadyWaiting)), "position", 1)
	s.claimStream(act, 9, string(wire.OutcomeSoldOut))

	// A cancel promotes 3: full without waiters again, the view is back.
	s.cancel(act, 2)
	want(t, "promoted waiter", s.claimUntilShed(act, 3, string(wire.OutcomeAlreadyOwned)), "status", string(wire.StatusConfirmed))
	s.claimUntilShed(act, 2, string(wire.OutcomeSoldOut))

	// A cancel frees a seat: no more shedding, the claim is granted.
	s.cancel(act, 1)
	s.claimStream(act, 9, string(wire.OutcomeGranted))
	s.db.CheckInvariants(t)
}
