package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/internal/wire"
)

// waitExpire waits until the expire of the hold that the request answered
// by hold (at its place, seq and index) gave user is applied, and returns
// its result as a poll answers it. It reads MySQL: an expire's id was never
// issued by ingest, which answers 404 for it until it is applied.
func (s *stack) waitExpire(a, u int, hold map[string]any, within time.Duration) map[string]any {
	s.t.Helper()
	holdAt := placeOf(s.t, hold)
	id := wire.ExpireRequestID(int64(a), int64(u), holdAt)
	deadline := time.Now().Add(within)
	for {
		r, ok, err := store.GetResult(context.Background(), s.db, id)
		if err != nil {
			s.t.Fatal(err)
		}
		if ok {
			code, m := s.call("GET", "/v1/requests/"+id, "")
			if code != http.StatusOK || m["state"] != wire.StateDone || m["seq"] != float64(r.Seq) || m["index"] != float64(r.Index) {
				s.t.Fatalf("poll of the applied expire %s: %d %v, recorded %+v", id, code, m, r)
			}
			return m
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("expire of user %d's hold from %s not applied within %s", u, wire.FormatPlace(holdAt), within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitNoneHeld waits until activity a holds no seat (every hold given so
// far was confirmed or its expire applied) and returns that state.
func (s *stack) waitNoneHeld(a int, what string, within time.Duration) map[string]any {
	s.t.Helper()
	var st map[string]any
	testenv.WaitFor(s.t, within, what, func() bool {
		st = s.activity(a)
		return st["held"] == float64(0)
	})
	return st
}

// TestHoldWaitlistStory: a 2s hold. A holds, B and C wait; A never
// confirms: at the expiry A is released and B held, in one change; B
// confirms in time; C stays first in line from then on. The events are
// held, expired, promoted, confirmed, in that order, each once; B's own
// expire, later, finds B confirmed and changes nothing.
func TestHoldWaitlistStory(t *testing.T) {
	t.Parallel()
	s := newStack(t, config.Defaults[allocator.Config]())
	const act, A, B, C = 9101, 1, 2, 3
	s.openHold(act, 1, "2s")
	a := s.join(act, A)
	want(t, "A joins", a, "outcome", wire.OutcomeHeld, "status", wire.StatusHeld)
	untilA := heldUntil(t, "A joins", a)
	want(t, "B joins", s.join(act, B), "outcome", wire.OutcomeWaiting, "position", 1)
	want(t, "C joins", s.join(act, C), "outcome", wire.OutcomeWaiting, "position", 2)
	want(t, "A while held", s.signup(act, A), "status", wire.StatusHeld)
	want(t, "state while A holds", s.activity(act), "confirmed", 1, "held", 1, "waiting", 2, "remaining", 0)

	// A never confirms.
	expA := s.waitExpire(act, A, a, 10*time.Second)
	want(t, "A's expire", expA, "op", wire.OpExpire, "outcome", wire.OutcomeExpired, "user_id", A,
		"status", wire.StatusCancelled, "promoted_user_id", B)
	if got := heldUntil(t, "A's expire", expA); !got.After(untilA) {
		t.Fatalf("B held until %v, not after A's hold's end %v", got, untilA)
	}
	applied, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(expA["applied_at"]))
	if applied.Before(untilA) {
		t.Fatalf("A's hold (until %v) lapsed at %v", untilA, applied)
	}
	want(t, "A after", s.signup(act, A), "status", wire.StatusCancelled)
	want(t, "B after", s.signup(act, B), "status", wire.StatusHeld)
	want(t, "C after A's expiry", s.signup(act, C), "status", wire.StatusWaiting, "position", 1)

	want(t, "B confirms", s.confirm(act, B), "outcome", wire.OutcomeConfirmed, "status", wire.StatusConfirmed)
	want(t, "C after B confirms", s.signup(act, C), "status", wire.StatusWaiting, "position", 1)
	want(t, "B confirms again", s.confirm(act, B), "outcome", wire.OutcomeAlreadyConfirmed)
	want(t, "C confirms", s.confirm(act, C), "outcome", wire.OutcomeNotHeld, "status", wire.StatusWaiting, "position", 1)

	// B's expire falls due too, and finds nothing to do.
	want(t, "B's expire", s.waitExpire(act, B, expA, 10*time.Second), "outcome", wire.OutcomeNotHeld,
		"status", wire.StatusConfirmed)
	want(t, "C at the end", s.signup(act, C), "status", wire.StatusWaiting, "position", 1)

	evs := s.eventsFor(act, s.outboxEvents(act))
	var story []string
	for _, e := range evs {
		switch e.Kind {
		case wire.EventHeld, wire.EventExpired, wire.EventPromoted, wire.EventConfirmed:
			story = append(story, fmt.Sprintf("%s:%d", e.Kind, e.UserID))
			if (e.Kind == wire.EventHeld || e.Kind == wire.EventPromoted) && e.HeldUntil == nil {
				t.Errorf("%s event of user %d without held_until", e.Kind, e.UserID)
			}
		}
	}
	if got, w := fmt.Sprint(story), fmt.Sprint([]string{"held:1", "expired:1", "promoted:2", "confirmed:2"}); got != w {
		t.Fatalf("events %s, want %s", got, w)
	}
	s.db.CheckInvariants(t)
	requireCleanAudit(t, s)
}

// TestConfirmRacingItsExpiry: a confirm received by held_until (sent 800ms
// before, a margin for a loaded machine) confirms; one received just after
// does not (HOLD_EXPIRED, or NOT_HELD if the expire was stored first),
// whatever the clock says when it is applied; the audit replays both the
// same way. Which of the two a confirm is, is read from its recorded
// received_at, not from when it was sent.
func TestConfirmRacingItsExpiry(t *testing.T) {
	t.Parallel()
	s := newStack(t, config.Defaults[allocator.Config]())
	const act = 9102
	s.openHold(act, 2, "2s")
	before, after := s.claim(act, 1), s.claim(act, 2)
	want(t, "claim 1", before, "outcome", wire.OutcomeHeld)
	want(t, "claim 2", after, "outcome", wire.OutcomeHeld)
	s.join(act, 3)

	// Everything that can fail is read here, on the test's goroutine.
	until := []time.Time{heldUntil(t, "claim 1", before), heldUntil(t, "claim 2", after)}
	var wg sync.WaitGroup
	answers := make([]map[string]any, 2)
	errs := make([]error, 2)
	for i, c := range []struct {
		user   int
		offset time.Duration
	}{{1, -800 * time.Millisecond}, {2, 50 * time.Millisecond}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(until[i].Add(c.offset)))
			errs[i] = s.tryDone("POST", fmt.Sprintf("/v1/activities/%d/signups/%d/confirm?wait=10s", act, c.user), &answers[i])
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// A confirm received by held_until is CONFIRMED; one received after
	// it never is, whenever it is applied.
	late := make([]bool, 2)
	for i, m := range answers {
		received := s.receivedAt(m)
		late[i] = received.After(until[i])
		if !late[i] {
			want(t, fmt.Sprintf("user %d's confirm received at %v, by held_until %v", i+1, received, until[i]), m,
				"outcome", wire.OutcomeConfirmed, "status", wire.StatusConfirmed)
		} else if m["outcome"] == string(wire.OutcomeConfirmed) {
			t.Fatalf("user %d's confirm received at %v, after held_until %v, confirmed: %v", i+1, received, until[i], m)
		}
	}
	// The rest of the story needs one confirm of each kind.
	if late[0] || !late[1] {
		t.Fatalf("precondition: user 1's confirm late %v (want false), user 2's late %v (want true): %v", late[0], late[1], answers)
	}
	// User 2's expire finds nothing to do after a HOLD_EXPIRED confirm;
	// stored first, it released the seat itself and the confirm found
	// NOT_HELD.
	var expire2 wire.Outcome
	switch o := answers[1]["outcome"]; o {
	case string(wire.OutcomeHoldExpired):
		want(t, "confirm after held_until", answers[1], "status", wire.StatusCancelled, "promoted_user_id", 3)
		expire2 = wire.OutcomeNotHeld
	case string(wire.OutcomeNotHeld):
		expire2 = wire.OutcomeExpired
	default:
		t.Fatalf("confirm after held_until: %v", answers[1])
	}
	want(t, "user 2 at the end", s.signup(act, 2), "status", wire.StatusCancelled)
	want(t, "user 3 at the end", s.signup(act, 3), "status", wire.StatusHeld)
	want(t, "user 1's expire, after the confirm in time", s.waitExpire(act, 1, before, 10*time.Second),
		"outcome", wire.OutcomeNotHeld, "status", wire.StatusConfirmed)
	want(t, "user 2's expire", s.waitExpire(act, 2, after, 10*time.Second), "outcome", expire2)
	s.db.CheckInvariants(t)
	requireCleanAudit(t, s)
}

// TestFlashSaleWithHolds: 100 items held for 3s, claims in four waves,
// each once the holds of the one before have lapsed (none is held), 30% of
// the holders never confirm. Each item a no-show
// leaves returns to stock when the hold lapses and is held by a claim of a
// later wave; at the end every item is confirmed or free, nobody owns two,
// the invariants hold and the audit is clean.
func TestFlashSaleWithHolds(t *testing.T) {
	t.Parallel()
	s := newStack(t, config.Defaults[allocator.Config]())
	const act, items, waves, perWave = 9103, 100, 4, 120
	// Long enough that a buyer's confirm, sent on the claim's answer, is
	// in time on a loaded machine.
	s.openHold(act, items, "3s")
	var (
		mu        sync.Mutex
		held      = map[int]bool{}
		confirmed = map[int]bool{}
		noShow    = map[int]bool{}
	)
	user := 0
	var st map[string]any
	for w := range waves {
		var wg sync.WaitGroup
		errs := make(chan error, perWave)
		for range perWave {
			user++
			u := user
			wg.Add(1)
			go func() {
				defer wg.Done()
				var m map[string]any
				if err := s.tryDone("POST", fmt.Sprintf("/v1/activities/%d/claims/%d?wait=10s", act, u), &m); err != nil {
					errs <- err
					return
				}
				if m["outcome"] != string(wire.OutcomeHeld) {
					return
				}
				mu.Lock()
				held[u] = true
				mu.Unlock()
				if u%10 < 3 { // 30% never confirm
					mu.Lock()
					noShow[u] = true
					mu.Unlock()
					return
				}
				var c map[string]any
				if err := s.tryDone("POST", fmt.Sprintf("/v1/activities/%d/signups/%d/confirm?wait=10s", act, u), &c); err != nil {
					errs <- err
					return
				}
				if c["outcome"] != string(wire.OutcomeConfirmed) {
					errs <- fmt.Errorf("user %d confirmed in time: %v", u, c)
					return
				}
				mu.Lock()
				confirmed[u] = true
				mu.Unlock()
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		// The wave's no-shows' holds lapse before the next wave, and the
		// last wave's before the checks.
		st = s.waitNoneHeld(act, fmt.Sprintf("wave %d's no-shows' holds lapse", w), 20*time.Second)
	}
	if len(held) <= items {
		t.Fatalf("%d claims held an item: no item a no-show left was held again", len(held))
	}
	want(t, "state at the end", st, "confirmed", len(confirmed), "held", 0, "remaining", items-len(confirmed))
	for u := range noShow {
		want(t, fmt.Sprintf("no-show %d", u), s.signup(act, u), "status", wire.StatusCancelled)
	}
	for u := range confirmed {
		want(t, fmt.Sprintf("buyer %d", u), s.signup(act, u), "status", wire.StatusConfirmed)
	}
	if n := s.db.Count(t, "SELECT COUNT(*) FROM activity_signup WHERE activity_id = ? AND status = 'CONFIRMED'", act); n != int64(len(confirmed)) {
		t.Fatalf("%d CONFIRMED rows, %d buyers confirmed", n, len(confirmed))
	}
	t.Logf("%d claims, %d held an item, %d confirmed, %d no-shows", user, len(held), len(confirmed), len(noShow))
	s.db.CheckInvariants(t)
	requireCleanAudit(t, s)
}
