package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/wire"
)

// Holds (docs/architecture.md, "Holds") through HTTP: the hold option of an open, a
// seat taken under it (HELD until received_at plus the hold), confirm, and
// what the reads and shed answers say of held seats. Tests that need an
// expire request in the stream are not here: they need the allocator's
// expiry schedules.

// openHold opens or resizes activity with capacity seats and hold.
func (s *stack) openHold(activity, capacity int, hold string) map[string]any {
	s.t.Helper()
	m := s.done("PUT", fmt.Sprintf("/v1/activities/%d", activity), fmt.Sprintf(`{"capacity": %d, "hold": %q}`, capacity, hold))
	if o := m["outcome"]; o != string(wire.OutcomeOpened) && o != string(wire.OutcomeResized) {
		s.t.Fatalf("open %d with hold %s: %v", activity, hold, m)
	}
	return m
}

func (s *stack) confirm(a, u int) map[string]any {
	return s.done("POST", fmt.Sprintf("/v1/activities/%d/signups/%d/confirm", a, u), "")
}

func (s *stack) claim(a, u int) map[string]any {
	return s.done("POST", fmt.Sprintf("/v1/activities/%d/claims/%d", a, u), "")
}

func (s *stack) activity(a int) map[string]any {
	s.t.Helper()
	code, m := s.call("GET", fmt.Sprintf("/v1/activities/%d", a), "")
	if code != http.StatusOK {
		s.t.Fatalf("activity %d: %d %v", a, code, m)
	}
	return m
}

// receivedAt is the received_at of the request answer m answers, read from
// the stream at its place (seq, index), as the allocator read it.
func (s *stack) receivedAt(m map[string]any) time.Time {
	s.t.Helper()
	at := placeOf(s.t, m)
	st, err := s.js.Stream(context.Background(), wire.RequestStream)
	if err != nil {
		s.t.Fatal(err)
	}
	msg, err := st.GetMsg(context.Background(), wire.SeqOf(at))
	if err != nil {
		s.t.Fatalf("request at %s: %v", wire.FormatPlace(at), err)
	}
	// One request, or a batch: the request at the answer's index.
	reqs, err := wire.DecodeMessage(msg.Subject, msg.Header.Get(wire.BatchHeader), msg.Data)
	if err != nil || wire.IndexOf(at) >= len(reqs) || reqs[wire.IndexOf(at)].Err != nil {
		s.t.Fatalf("request at %s: %v (%d requests)", wire.FormatPlace(at), err, len(reqs))
	}
	return reqs[wire.IndexOf(at)].Request.ReceivedAt
}

// placeOf is the place (wire.Place) of the request answer m answers: its
// seq and index.
func placeOf(t testing.TB, m map[string]any) uint64 {
	t.Helper()
	seq, ok := m["seq"].(float64)
	index, iok := m["index"].(float64)
	if !ok || seq < 1 || !iok || index < 0 {
		t.Fatalf("answer %v has no place (seq %v, index %v)", m, m["seq"], m["index"])
	}
	return wire.Place(uint64(seq), int(index))
}

// heldUntil is m's held_until; the zero time when m has none.
func heldUntil(t *testing.T, what string, m map[string]any) time.Time {
	t.Helper()
	v, ok := m["held_until"]
	if !ok {
		return time.Time{}
	}
	at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(v))
	if err != nil {
		t.Fatalf("%s: held_until %v: %v", what, v, err)
	}
	return at
}

// wantHeldUntil requires m's held_until to be want (the zero time: none).
func wantHeldUntil(t *testing.T, what string, m map[string]any, want time.Time) {
	t.Helper()
	if got := heldUntil(t, what, m); !got.Equal(want) {
		t.Fatalf("%s: held_until %v, want %v (answer %v)", what, got, want, m)
	}
}

// holdEnd is when a hold of d created by the request answer m answers ends:
// its received_at plus d, in the whole microseconds MySQL keeps.
func (s *stack) holdEnd(m map[string]any, d time.Duration) time.Time {
	s.t.Helper()
	return s.receivedAt(m).Add(d).Truncate(time.Microsecond)
}

// TestHoldJoinAndConfirm: a join under a hold answers HELD with held_until
// = its received_at + the hold, in the write's answer, the poll and the
// signup; the activity counts the seat as taken and as held; a confirm in
// time makes it CONFIRMED; the repeats and the confirms of users without a
// hold change nothing.
func TestHoldJoinAndConfirm(t *testing.T) {
	t.Parallel()
	s := newStack(t, config.Defaults[allocator.Config]())
	const act = 1401
	want(t, "open", s.openHold(act, 2, "1h"), "outcome", wire.OutcomeOpened)
	want(t, "state after open", s.activity(act), "capacity", 2, "confirmed", 0, "held", 0, "waiting", 0, "remaining", 2, "hold", "1h0m0s")

	j := s.join(act, 1)
	want(t, "join under a hold", j, "outcome", wire.OutcomeHeld, "status", wire.StatusHeld, "position", nil)
	until := s.holdEnd(j, time.Hour)
	wantHeldUntil(t, "join under a hold", j, until)
	s.sameAsRecorded("join under a hold", j)
	code, poll := s.call("GET", "/v1/requests/"+j["request_id"].(string), "")
	if code != http.StatusOK {
		t.Fatalf("poll: %d %v", code, poll)
	}
	want(t, "poll of the join", poll, "state", wire.StateDone, "outcome", wire.OutcomeHeld, "status", wire.StatusHeld)
	wantHeldUntil(t, "poll of the join", poll, until)

	sg := s.signup(act, 1)
	want(t, "held signup", sg, "status", wire.StatusHeld, "position", nil)
	wantHeldUntil(t, "held signup", sg, until)
	want(t, "state with a held seat", s.activity(act), "confirmed", 1, "held", 1, "remaining", 1)

	// A held user's join and claim change nothing and say until when.
	again := s.join(act, 1)
	want(t, "join again while held", again, "outcome", wire.OutcomeAlreadyConfirmed, "status", wire.StatusHeld)
	wantHeldUntil(t, "join again while held", again, until)
	owned := s.claim(act, 1)
	want(t, "claim while held", owned, "outcome", wire.OutcomeAlreadyOwned, "status", wire.StatusHeld)
	wantHeldUntil(t, "claim while held", owned, until)
	s.sameAsRecorded("claim while held", owned)

	c := s.confirm(act, 1)
	want(t, "confirm in time", c, "outcome", wire.OutcomeConfirmed, "status", wire.StatusConfirmed, "op", wire.OpConfirm, "user_id", 1)
	wantHeldUntil(t, "confirm in time", c, time.Time{})
	s.sameAsRecorded("confirm in time", c)
	sg = s.signup(act, 1)
	want(t, "confirmed signup", sg, "status", wire.StatusConfirmed)
	wantHeldUntil(t, "confirmed signup", sg, time.Time{})
	want(t, "state after the confirm", s.activity(act), "confirmed", 1, "held", 0, "remaining", 1)

	want(t, "confirm again", s.confirm(act, 1), "outcome", wire.OutcomeAlreadyConfirmed, "status", wire.StatusConfirmed)
	want(t, "confirm without a signup", s.confirm(act, 3), "outcome", wire.OutcomeNotHeld, "status", nil)
	want(t, "confirm on an activity never opened", s.confirm(4242, 1), "outcome", wire.OutcomeNoSuchActivity)

	// A claim under a hold is held too; the last seat is sold out.
	g := s.claim(act, 2)
	want(t, "claim under a hold", g, "outcome", wire.OutcomeHeld, "status", wire.StatusHeld)
	until2 := s.holdEnd(g, time.Hour)
	wantHeldUntil(t, "claim under a hold", g, until2)
	want(t, "full", s.activity(act), "confirmed", 2, "held", 1, "remaining", 0)

	// Without ?wait: 202 with the poll URL, then the result.
	code, ack := s.call("POST", fmt.Sprintf("/v1/activities/%d/signups/2/confirm", act), "")
	if code != http.StatusAccepted || ack["state"] != wire.StatePending {
		t.Fatalf("confirm without wait: %d %v, want 202 pending", code, ack)
	}
	code, poll = s.call("GET", "/v1/requests/"+ack["request_id"].(string)+"?wait=10s", "")
	if code != http.StatusOK {
		t.Fatalf("poll of the confirm: %d %v", code, poll)
	}
	want(t, "confirm of the claim", poll, "state", wire.StateDone, "outcome", wire.OutcomeConfirmed, "status", wire.StatusConfirmed)
	want(t, "state at the end", s.activity(act), "confirmed", 2, "held", 0, "remaining", 0)

	// The events, each once, in order; held ones say until when.
	evs := s.eventsFor(act, s.outboxEvents(act))
	var kinds []string
	for _, e := range evs {
		kinds = append(kinds, fmt.Sprintf("%s:%d", e.Kind, e.UserID))
		if e.Kind == wire.EventHeld {
			w := until
			if e.UserID == 2 {
				w = until2
			}
			if e.HeldUntil == nil || !e.HeldUntil.Equal(w) {
				t.Errorf("held event %+v: held_until %v, want %v", e, e.HeldUntil, w)
			}
		}
	}
	if got, w := fmt.Sprint(kinds), "[opened:0 held:1 confirmed:1 held:2 sold_out:0 confirmed:2]"; got != w {
		t.Fatalf("events %s, want %s", got, w)
	}
	s.db.CheckInvariants(t)
}

// TestHoldPromotions: a seat freed in an activity with a hold goes to the
// head of the waitlist HELD, until the received_at of the request that
// freed it plus the hold; a resize may change the hold for seats given
// later, and a resize without a hold gives them confirmed.
func TestHoldPromotions(t *testing.T) {
	t.Parallel()
	s := newStack(t, config.Defaults[allocator.Config]())
	const act, A, B, C, D = 1402, 1, 2, 3, 4
	s.openHold(act, 1, "1h")
	want(t, "A joins", s.join(act, A), "outcome", wire.OutcomeHeld)
	want(t, "B joins", s.join(act, B), "outcome", wire.OutcomeWaiting, "position", 1)
	want(t, "C joins", s.join(act, C), "outcome", wire.OutcomeWaiting, "position", 2)
	want(t, "B's confirm while waiting", s.confirm(act, B), "outcome", wire.OutcomeNotHeld, "status", wire.StatusWaiting, "position", 1)

	c := s.cancel(act, A)
	want(t, "A cancels", c, "outcome", wire.OutcomeCancelled, "promoted_user_id", B)
	untilB := s.holdEnd(c, time.Hour)
	wantHeldUntil(t, "A cancels", c, untilB)
	s.sameAsRecorded("A cancels", c)
	sg := s.signup(act, B)
	want(t, "B promoted", sg, "status", wire.StatusHeld)
	wantHeldUntil(t, "B promoted", sg, untilB)
	want(t, "C after", s.signup(act, C), "status", wire.StatusWaiting, "position", 1)
	want(t, "B confirms", s.confirm(act, B), "outcome", wire.OutcomeConfirmed)

	r := s.openHold(act, 2, "30m")
	want(t, "resize up with a hold", r, "outcome", wire.OutcomeResized)
	if ids, _ := r["promoted_user_ids"].([]any); fmt.Sprint(ids) != fmt.Sprint([]any{float64(C)}) {
		t.Fatalf("resize up promoted %v, want [%d]", r["promoted_user_ids"], C)
	}
	untilC := s.holdEnd(r, 30*time.Minute)
	sg = s.signup(act, C)
	want(t, "C promoted by the resize", sg, "status", wire.StatusHeld)
	wantHeldUntil(t, "C promoted by the resize", sg, untilC)
	want(t, "state", s.activity(act), "capacity", 2, "confirmed", 2, "held", 1, "waiting", 0, "hold", "30m0s")

	// Without "hold" a resize switches holds off for seats given later;
	// the hold already given keeps its end.
	r = s.done("PUT", fmt.Sprintf("/v1/activities/%d", act), `{"capacity": 3}`)
	want(t, "resize without a hold", r, "outcome", wire.OutcomeResized)
	st := s.activity(act)
	if _, ok := st["hold"]; ok {
		t.Fatalf("state after a resize without a hold: %v, want no hold", st)
	}
	want(t, "D joins without a hold", s.join(act, D), "outcome", wire.OutcomeConfirmed, "status", wire.StatusConfirmed)
	wantHeldUntil(t, "C keeps its hold", s.signup(act, C), untilC)
	s.db.CheckInvariants(t)
}

// TestHoldConfirmTooLate: a confirm received after held_until is
// HOLD_EXPIRED whatever the clock says when it is applied: the seat is
// released and the head of the waitlist held, as an expire would. The hold
// is short and the confirm is sent just after it ends, before its expire
// falls due; should an expire still be applied first (a slow machine, with
// the expiry schedules in place), the confirm finds NOT_HELD.
func TestHoldConfirmTooLate(t *testing.T) {
	t.Parallel()
	s := newStack(t, config.Defaults[allocator.Config]())
	const act, A, B = 1403, 1, 2
	// Long enough for the steps before the confirm on a loaded machine.
	s.openHold(act, 1, "2s")
	j := s.join(act, A)
	want(t, "A joins", j, "outcome", wire.OutcomeHeld)
	untilA := heldUntil(t, "A joins", j)
	want(t, "B joins", s.join(act, B), "outcome", wire.OutcomeWaiting)
	// Seats given from now on are held for an hour; A's hold keeps its end.
	s.openHold(act, 1, "1h")
	wantHeldUntil(t, "A's hold after the resize", s.signup(act, A), untilA)

	time.Sleep(time.Until(untilA.Add(10 * time.Millisecond)))
	c := s.confirm(act, A)
	s.sameAsRecorded("late confirm", c)
	expired := s.db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE activity_id = ? AND op = 'expire' AND user_id = ? AND seq < ?",
		act, A, int64(c["seq"].(float64)))
	if expired > 0 {
		want(t, "confirm after the expire", c, "outcome", wire.OutcomeNotHeld)
	} else {
		if !s.receivedAt(c).After(untilA) {
			t.Fatalf("precondition: the confirm was received at %v, not after held_until %v", s.receivedAt(c), untilA)
		}
		want(t, "late confirm", c, "outcome", wire.OutcomeHoldExpired, "status", wire.StatusCancelled)
		wantHeldUntil(t, "late confirm", c, s.holdEnd(c, time.Hour))
	}
	want(t, "A after", s.signup(act, A), "status", wire.StatusCancelled)
	want(t, "B promoted", s.signup(act, B), "status", wire.StatusHeld)
	want(t, "B confirms", s.confirm(act, B), "outcome", wire.OutcomeConfirmed)
	want(t, "state", s.activity(act), "confirmed", 1, "held", 0, "waiting", 0)
	s.db.CheckInvariants(t)
}

// TestShedInAHoldActivity: in a full activity with holds, shed claims
// say exactly what the allocator records: SOLD_OUT for anyone without a
// seat, ALREADY_OWNED with status HELD and the hold's end for a held user,
// ALREADY_OWNED CONFIRMED for a confirmed one, also once the held one
// confirms.
func TestShedInAHoldActivity(t *testing.T) {
	t.Parallel()
	s := newStack(t, config.Defaults[allocator.Config]())
	const act = 1404
	s.openHold(act, 2, "1h")
	j := s.join(act, 1)
	want(t, "user 1", j, "outcome", wire.OutcomeHeld)
	until := heldUntil(t, "user 1", j)
	want(t, "user 2", s.join(act, 2), "outcome", wire.OutcomeHeld)
	want(t, "user 2 confirms", s.confirm(act, 2), "outcome", wire.OutcomeConfirmed)

	var answers []map[string]any
	sold := s.claimUntilShed(act, 99, string(wire.OutcomeSoldOut))
	wantHeldUntil(t, "shed SOLD_OUT", sold, time.Time{})
	held := s.claimUntilShed(act, 1, string(wire.OutcomeAlreadyOwned))
	want(t, "held user's shed answer", held, "status", wire.StatusHeld)
	wantHeldUntil(t, "held user's shed answer", held, until)
	confirmed := s.claimUntilShed(act, 2, string(wire.OutcomeAlreadyOwned))
	want(t, "confirmed user's shed answer", confirmed, "status", wire.StatusConfirmed)
	wantHeldUntil(t, "confirmed user's shed answer", confirmed, time.Time{})
	answers = append(answers, sold, held, confirmed)

	// A confirm is a change: claims stored behind a pending one wait for
	// it, and once it is applied the held user is CONFIRMED.
	m := s.claimBehindPending(act, "POST", fmt.Sprintf("/v1/activities/%d/signups/1/confirm", act), 1)
	want(t, "claim after a pending confirm", m, "outcome", wire.OutcomeAlreadyOwned, "status", wire.StatusConfirmed)
	wantHeldUntil(t, "claim after a pending confirm", m, time.Time{})
	answers = append(answers, m, s.claimUntilShed(act, 1, string(wire.OutcomeAlreadyOwned)))
	want(t, "shed answer after the confirm", answers[len(answers)-1], "status", wire.StatusConfirmed)

	waitApplied(t, s.db, answers[len(answers)-1]["seq"].(float64))
	for i, a := range answers {
		s.sameAsRecorded(fmt.Sprintf("answer %d", i), a)
	}
	s.db.CheckInvariants(t)
	requireCleanAudit(t, s)
}

// TestShedAnswersMatchTheStreamWithHolds: the randomized rounds of
// TestShedAnswersMatchTheStream in activities with holds, confirms in the
// mix: every answer, shed or not, is the allocator's recorded result,
// held_until included.
func TestShedAnswersMatchTheStreamWithHolds(t *testing.T) {
	t.Parallel()
	rounds := 6
	if testing.Short() {
		rounds = 2
	}
	shedAnswersMatchTheStream(t, 1500, rounds, "1h")
}
