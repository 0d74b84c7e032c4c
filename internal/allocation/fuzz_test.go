package allocation_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/allocation/refmodel"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// checkInvariants verifies the invariants (docs/architecture.md) on a, computed by brute
// force from its public accessors only.
func checkInvariants(a *allocation.Activity) error {
	if a == nil {
		return nil
	}
	live := a.Live()
	var confirmed, waiting, held int64
	users := map[int64]bool{}
	var prevSeq uint64
	for _, s := range live {
		if s.QueueSeq <= prevSeq {
			return fmt.Errorf("queue_seqs not strictly increasing: %d after %d", s.QueueSeq, prevSeq)
		}
		prevSeq = s.QueueSeq
		if s.QueueSeq >= a.NextSeq {
			return fmt.Errorf("queue_seq %d not below next seq %d", s.QueueSeq, a.NextSeq)
		}
		if users[s.UserID] {
			return fmt.Errorf("user %d has two live signups", s.UserID)
		}
		users[s.UserID] = true
		if got, ok := a.Lookup(s.UserID); !ok || got != s {
			return fmt.Errorf("Lookup(%d) = %+v, %v; Live has %+v", s.UserID, got, ok, s)
		}
		if (s.Status == wire.StatusHeld) != (s.HoldSeq != 0) || (s.Status == wire.StatusHeld) == s.HeldUntil.IsZero() {
			return fmt.Errorf("signup %+v: a hold exactly on HELD rows", s)
		}
		switch s.Status {
		case wire.StatusConfirmed, wire.StatusHeld:
			confirmed++
			if s.Status == wire.StatusHeld {
				held++
				if s.HoldSeq < s.QueueSeq || s.HoldSeq >= a.NextSeq {
					return fmt.Errorf("signup %+v: hold seq outside queue_seq..next seq %d", s, a.NextSeq)
				}
				if s.HeldUntil.Nanosecond()%1000 != 0 {
					return fmt.Errorf("signup %+v: held_until not in whole microseconds", s)
				}
			}
			if waiting > 0 {
				return fmt.Errorf("confirmed user %d queued after a waiter", s.UserID)
			}
			if p := a.Position(s.UserID); p != 0 {
				return fmt.Errorf("Position of confirmed user %d = %d", s.UserID, p)
			}
		case wire.StatusWaiting:
			waiting++
			if p := a.Position(s.UserID); p != waiting {
				return fmt.Errorf("Position(%d) = %d, want %d", s.UserID, p, waiting)
			}
		default:
			return fmt.Errorf("live signup with status %q", s.Status)
		}
	}
	if held != a.Held {
		return fmt.Errorf("Held = %d, counted %d", a.Held, held)
	}
	if confirmed != a.Confirmed {
		return fmt.Errorf("Confirmed = %d, counted %d", a.Confirmed, confirmed)
	}
	if a.Confirmed > a.Capacity {
		return fmt.Errorf("Confirmed %d > Capacity %d", a.Confirmed, a.Capacity)
	}
	if waiting != a.Waiting() {
		return fmt.Errorf("Waiting() = %d, counted %d", a.Waiting(), waiting)
	}
	if waiting > 0 && a.Confirmed < a.Capacity {
		return fmt.Errorf("%d waiting while %d of %d seats are taken", waiting, a.Confirmed, a.Capacity)
	}
	return a.Check()
}

// checkDecision verifies properties of one decision against the live
// signups before (prev) and the activity after.
func checkDecision(prev []allocation.Signup, a *allocation.Activity, req allocation.Request, seq uint64, d allocation.Decision) error {
	if a == nil {
		return nil
	}
	if a.NextSeq != seq+1 {
		return fmt.Errorf("NextSeq = %d, want %d", a.NextSeq, seq+1)
	}
	// Promotions take the first waiters of the state before, in order.
	var waiters []int64
	for _, s := range prev {
		if s.Status == wire.StatusWaiting && s.UserID != req.UserID {
			waiters = append(waiters, s.UserID)
		}
	}
	if n := len(d.PromotedUserIDs); n > len(waiters) || (n > 0 && !reflect.DeepEqual(d.PromotedUserIDs, waiters[:n])) {
		return fmt.Errorf("promoted %v, waiters were %v", d.PromotedUserIDs, waiters)
	}
	// A new signup goes to the tail: its queue_seq is the request's and
	// above every other live queue_seq.
	switch d.Outcome {
	case wire.OutcomeConfirmed, wire.OutcomeWaiting, wire.OutcomeGranted, wire.OutcomeHeld:
		if req.Op == wire.OpConfirm {
			break
		}
		s, ok := a.Lookup(req.UserID)
		if !ok || s.QueueSeq != seq {
			return fmt.Errorf("new signup %+v, %v; want queue_seq %d", s, ok, seq)
		}
		for _, o := range a.Live() {
			if o.UserID != req.UserID && o.QueueSeq >= s.QueueSeq {
				return fmt.Errorf("new signup %+v not at the tail: %+v", s, o)
			}
		}
	}
	// Every changed row is reported with its state after, and each signup
	// change has exactly one event.
	userEvents := 0
	for _, e := range d.Events {
		if e.UserID != 0 {
			userEvents++
		}
	}
	if userEvents != len(d.Changed) {
		return fmt.Errorf("%d user events for %d changed rows", userEvents, len(d.Changed))
	}
	for _, c := range d.Changed {
		got, ok := a.Lookup(c.UserID)
		if c.Status == wire.StatusCancelled {
			if ok {
				return fmt.Errorf("cancelled user %d still live: %+v", c.UserID, got)
			}
			continue
		}
		if !ok || got != c {
			return fmt.Errorf("changed row %+v, Lookup %+v, %v", c, got, ok)
		}
	}
	// A hold the request created starts at its seq and ends at the
	// decision's held_until, which its event carries too.
	for i, c := range d.Changed {
		if c.Status == wire.StatusHeld && (c.HoldSeq != seq || !c.HeldUntil.Equal(d.HeldUntil)) {
			return fmt.Errorf("held row %+v created at seq %d, decision held until %v", c, seq, d.HeldUntil)
		}
		var ev []allocation.Event
		for _, e := range d.Events {
			if e.UserID != 0 {
				ev = append(ev, e)
			}
		}
		if !ev[i].HeldUntil.Equal(c.HeldUntil) || ev[i].UserID != c.UserID {
			return fmt.Errorf("event %+v for changed row %+v", ev[i], c)
		}
	}
	if d.Status == wire.StatusHeld {
		if s, _ := a.Lookup(req.UserID); !s.HeldUntil.Equal(d.HeldUntil) {
			return fmt.Errorf("decision held until %v, the user's hold %+v", d.HeldUntil, s)
		}
	}
	if d.Changes != (len(d.Events) > 0) {
		return fmt.Errorf("Changes %v with events %v", d.Changes, d.Events)
	}
	if d.Status == wire.StatusWaiting && d.Position != a.Position(req.UserID) {
		return fmt.Errorf("decision position %d, Position() %d", d.Position, a.Position(req.UserID))
	}
	return nil
}

// seedStep is one step of a hand-written seed, in the encoding decodeStep
// reads: op and activity, user or capacity and hold, seq, clock.
type seedStep [4]byte

// Helpers that encode a request on activity act (1..3) for user u (1..10)
// or with capacity c (0..4) and hold fuzzHolds[h]; at picks the clock
// (fuzzTicks) and, for confirm and expire, the instant relative to the
// user's hold and the hold seq (see decodeStep).
func sOpen(act, c int) seedStep        { return sOpenHold(act, c, 0) }
func sOpenHold(act, c, h int) seedStep { return seedStep{byte(16 * (act - 1)), byte(c + 5*h), 0, 0} }
func sJoin(act, u int) seedStep        { return seedStep{byte(16*(act-1) + 1), byte(u - 1), 0, 0} }
func sCancel(act, u int) seedStep      { return seedStep{byte(16*(act-1) + 4), byte(u - 1), 0, 0} }
func sClaim(act, u int) seedStep       { return seedStep{byte(16*(act-1) + 6), byte(u - 1), 0, 0} }
func sConfirm(act, u int, at byte) seedStep {
	return seedStep{byte(16*(act-1) + 8), byte(u - 1), 0, at}
}
func sExpire(act, u int, at byte) seedStep {
	return seedStep{byte(16*(act-1) + 10), byte(u - 1), 0, at}
}

// tick advances the clock by fuzzTicks[i] before the step.
func tick(s seedStep, i byte) seedStep { s[3] = s[3]&^7 | i&7; return s }

// Instants of a confirm or expire relative to the user's held_until
// (bits 3-5 of the fourth byte); atClock and below use the clock.
const (
	atClock      = 0 << 3
	atMicroEarly = 3 << 3 // held_until - 1µs
	atNanoEarly  = 4 << 3 // held_until - 1ns
	atEnd        = 5 << 3 // held_until exactly
	atNanoLate   = 6 << 3 // held_until + 1ns
	atDue        = 7 << 3 // held_until + wire.HoldGrace, when the expire falls due
)

// Hold seqs of an expire (bits 6-7 of the fourth byte).
const (
	holdCurrent = 0 << 6 // the user's hold now, else the user's last one
	holdStale   = 2 << 6 // some older hold of the activity
	holdAny     = 3 << 6 // a seq taken from the user byte
)

func seedSteps(steps ...seedStep) []byte {
	var b []byte
	for _, s := range steps {
		b = append(b, s[:]...)
	}
	return b
}

// fuzzOps weighs the ops: opens are rarer, since a resize that promotes
// everyone would keep waitlists too short to reach compaction.
var fuzzOps = [16]wire.Op{
	wire.OpOpen, wire.OpJoin, wire.OpJoin, wire.OpJoin, wire.OpCancel, wire.OpCancel, wire.OpClaim, wire.OpOpen,
	wire.OpConfirm, wire.OpConfirm, wire.OpExpire, wire.OpExpire, wire.OpJoin, wire.OpClaim, wire.OpConfirm, wire.OpCancel,
}

// fuzzHolds are the holds an open may set: none, sub-microsecond ones that
// make held_until's truncation matter, and longer ones that outlive many
// steps.
var fuzzHolds = [8]time.Duration{0, 1500 * time.Nanosecond, time.Millisecond, time.Second, 0, 10 * time.Second, time.Minute, 333*time.Millisecond + 7}

// fuzzTicks is how far the clock moves before a step: not at all, by odd
// amounts, and now and then backwards (ingest instances' clocks differ).
var fuzzTicks = [8]time.Duration{0, 1, 999, 1001 * time.Microsecond, 400 * time.Millisecond, time.Second, 7 * time.Second, -time.Second}

// clock is the fuzz run's sense of time and of the holds it has seen.
type clock struct {
	now time.Time
	// holds are the hold seqs seen per activity, oldest first, and last
	// the last one per activity and user.
	holds map[int64][]uint64
	last  map[[2]int64]uint64
}

func newClock() *clock {
	return &clock{
		now:   time.Date(2026, 12, 1, 3, 0, 0, 123456789, time.UTC),
		holds: map[int64][]uint64{}, last: map[[2]int64]uint64{},
	}
}

// saw records the holds a decision created.
func (c *clock) saw(activity int64, d allocation.Decision) {
	for _, s := range d.Changed {
		if s.Status == wire.StatusHeld {
			c.holds[activity] = append(c.holds[activity], s.HoldSeq)
			c.last[[2]int64{activity, s.UserID}] = s.HoldSeq
		}
	}
}

// decodeStep turns four fuzz bytes into a request and a seq, given the
// last global seq, the activities' fences and their state. About one step
// in sixteen is malformed on purpose.
func decodeStep(b [4]byte, last uint64, fence func(int64) uint64, lookup func(id, user int64) (allocation.Signup, bool), c *clock) (allocation.Request, uint64) {
	req := allocation.Request{Op: fuzzOps[b[0]%16], ActivityID: int64(b[0]/16%3) + 1}
	if req.Op == wire.OpOpen {
		req.Capacity = int64(b[1] % 5)
		req.Hold = fuzzHolds[b[1]/5%8]
	} else {
		req.UserID = int64(b[1]%10) + 1
	}
	seq := last + 1 + uint64(b[2]%3)
	c.now = c.now.Add(fuzzTicks[b[3]&7])
	req.ReceivedAt = c.now
	if req.Op == wire.OpConfirm || req.Op == wire.OpExpire {
		s, held := lookup(req.ActivityID, req.UserID)
		held = held && s.Status == wire.StatusHeld
		if held {
			switch b[3] & (7 << 3) {
			case atMicroEarly:
				req.ReceivedAt = s.HeldUntil.Add(-time.Microsecond)
			case atNanoEarly:
				req.ReceivedAt = s.HeldUntil.Add(-1)
			case atEnd:
				req.ReceivedAt = s.HeldUntil
			case atNanoLate:
				req.ReceivedAt = s.HeldUntil.Add(1)
			case atDue:
				req.ReceivedAt = wire.HoldDue(s.HeldUntil)
			}
		}
		if req.Op == wire.OpExpire {
			switch b[3] & (3 << 6) {
			case holdStale:
				if hs := c.holds[req.ActivityID]; len(hs) > 0 {
					req.HoldSeq = hs[int(b[1])%len(hs)]
				}
			case holdAny:
				req.HoldSeq = uint64(b[1]) % seq
			default:
				req.HoldSeq = c.last[[2]int64{req.ActivityID, req.UserID}]
				if held {
					req.HoldSeq = s.HoldSeq
				}
			}
			if req.HoldSeq == 0 && b[2] < 0xF0 {
				req.HoldSeq = max(seq/2, 1) // a hold that never was, mostly
			}
		}
	}
	if b[2] >= 0xF0 {
		switch b[2] % 5 {
		case 0:
			seq = fence(req.ActivityID) - 1 // a replay: 0 or the last applied seq
		case 1:
			req.UserID = -req.UserID
		case 2:
			req.Capacity = -1
			if req.Op == wire.OpExpire {
				req.HoldSeq = seq // a hold from the future
			}
		case 3:
			req.Op = "bogus"
		case 4:
			req.ActivityID = 0
		}
	}
	return req, seq
}

// FuzzApply applies a fuzz-chosen sequence of requests over a few small
// activities and, after every step, compares the decision with the naive
// reference model, checks the invariants by brute force, and checks that a
// copy restored from the stored rows keeps deciding the same.
func FuzzApply(f *testing.F) {
	for _, data := range fuzzSeeds() {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		runSteps(t, data, nil)
	})
}

// fuzzSeeds are FuzzApply's seed corpus.
func fuzzSeeds() [][]byte {
	var seeds [][]byte
	add := func(b []byte) { seeds = append(seeds, b) }
	add([]byte{})
	// The seed story: open cap 1, A, B, C join, duplicates, cancel A, cancel
	// B, A re-joins.
	add(seedSteps(
		sOpen(1, 1), sJoin(1, 1), sJoin(1, 2), sJoin(1, 3), sJoin(1, 1), sJoin(1, 3),
		sCancel(1, 1), sCancel(1, 1), sCancel(1, 2), sJoin(1, 1), sJoin(1, 1), sCancel(1, 2),
	))
	// Resize up and down around a waitlist.
	add(seedSteps(
		sOpen(1, 1), sJoin(1, 1), sJoin(1, 2), sJoin(1, 3), sJoin(1, 4), sOpen(1, 3),
		sOpen(1, 0), sOpen(1, 4), sCancel(1, 2), sOpen(1, 2),
	))
	// Claims into a small capacity, then a waiter's claim.
	add(seedSteps(
		sOpen(2, 2), sClaim(2, 1), sClaim(2, 2), sClaim(2, 3), sClaim(2, 1), sJoin(2, 4),
		sClaim(2, 4), sCancel(2, 1), sClaim(2, 4),
	))
	// Several activities, malformed steps mixed in.
	add(append(seedSteps(sOpen(1, 1), sOpen(3, 2), sJoin(2, 1), sJoin(1, 5), sJoin(3, 5)),
		1, 1, 0xF0, 0, 2, 2, 0xF1, 0, 0, 1, 0xF2, 0, 1, 3, 0xF3, 0, 2, 4, 0xF4, 0, 16, 0, 0, 0))
	// The waitlist story with a 1 s hold: A holds, B and C wait; A never
	// confirms and expires, B is held and confirms in time; C confirms
	// while waiting; a stale expire of A's hold and B's lapsed expire
	// change nothing.
	add(seedSteps(
		sOpenHold(1, 1, 3), sJoin(1, 1), sJoin(1, 2), sJoin(1, 3), sConfirm(1, 3, atClock),
		sExpire(1, 1, atNanoEarly), sExpire(1, 1, atDue), sConfirm(1, 2, atEnd), sExpire(1, 1, atDue|holdStale),
		sExpire(1, 2, atDue), sConfirm(1, 2, atClock), sJoin(1, 2), sClaim(1, 2),
	))
	// Confirms just after the end (HOLD_EXPIRED promotes the next, held),
	// holds by claims, a resize that changes the hold only, and one that
	// promotes under the new hold.
	add(seedSteps(
		sOpenHold(2, 2, 5), sClaim(2, 1), sClaim(2, 2), sJoin(2, 3), sJoin(2, 4), sJoin(2, 5),
		sConfirm(2, 1, atNanoLate), sConfirm(2, 2, atMicroEarly), sOpenHold(2, 2, 1), sOpenHold(2, 4, 6),
		sJoin(2, 3), sClaim(2, 4), sCancel(2, 3), sExpire(2, 4, atEnd), sExpire(2, 5, atDue|holdAny),
		tick(sConfirm(2, 5, atClock), 6), sOpenHold(2, 4, 0), sConfirm(2, 5, atClock),
	))
	// A waitlist that grows long and loses waiters from the head and the
	// middle, which compacts it; then the same under a short hold, so
	// expiries walk the queue.
	for _, h := range []int{0, 2} {
		long := []seedStep{sOpenHold(1, 1, h)}
		for u := range 10 {
			long = append(long, sJoin(1, u+1))
		}
		for range 3 {
			for _, u := range []int{3, 5, 7, 1, 2, 9} {
				long = append(long, sCancel(1, u), sJoin(1, u), tick(sExpire(1, u, atDue), 4), sConfirm(1, u, atEnd))
			}
		}
		add(seedSteps(long...))
	}
	add([]byte("long run of mixed bytes to exercise waitlists and compaction: join cancel claim open confirm expire!!"))
	// Long pseudo-random runs, so that the seed corpus alone reaches deep
	// waitlists, compaction, resizes and every hold outcome on every plain
	// go test.
	for seed := range uint64(8) {
		r := rand.New(rand.NewPCG(seed, 99))
		data := make([]byte, 1600)
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		add(data)
	}
	return seeds
}

// runSteps is one fuzz run over data; outcomes, when not nil, counts the
// outcomes decided.
func runSteps(t *testing.T, data []byte, outcomes map[wire.Outcome]int) {
	const maxSteps = 400
	acts := map[int64]*allocation.Activity{}
	twins := map[int64]*allocation.Activity{}
	refs := map[int64]*refmodel.Activity{}
	var last uint64
	fence := func(id int64) uint64 {
		if a := acts[id]; a != nil {
			return a.NextSeq
		}
		return 1
	}
	lookup := func(id, user int64) (allocation.Signup, bool) { return acts[id].Lookup(user) }
	clk := newClock()
	for step := 0; step+3 < len(data) && step/4 < maxSteps; step += 4 {
		n := step / 4
		req, seq := decodeStep([4]byte(data[step:step+4]), last, fence, lookup, clk)
		id := req.ActivityID
		a, r := acts[id], refs[id]
		prev := a.Live()
		before := a.Clone()

		// Now and then the twin is thrown away and restored from the
		// rows a store would hold, to check Restore round trips.
		if a != nil && (twins[id] == nil || data[step+1]&0x40 != 0) {
			tw, err := allocation.Restore(a.ID, a.Capacity, a.Confirmed, a.NextSeq, a.Hold, a.Live())
			if err != nil {
				t.Fatalf("step %d: Restore of a reachable state: %v", n, err)
			}
			if !reflect.DeepEqual(tw.Live(), a.Live()) || tw.Held != a.Held || tw.Hold != a.Hold {
				t.Fatalf("step %d: restored %+v (held %d, hold %s), want %+v (held %d, hold %s)",
					n, tw.Live(), tw.Held, tw.Hold, a.Live(), a.Held, a.Hold)
			}
			twins[id] = tw
		}

		got, d, err := allocation.Apply(a, req, seq)
		rgot, rd, rerr := refmodel.Apply(r, req, seq)
		tgot, td, terr := allocation.Apply(twins[id], req, seq)

		if (err != nil) != (rerr != nil) || (err != nil && !errors.Is(err, allocation.ErrInvalidRequest)) {
			t.Fatalf("step %d %+v seq %d: err %v, reference %v", n, req, seq, err, rerr)
		}
		if (err != nil) != (terr != nil) {
			t.Fatalf("step %d %+v seq %d: err %v, restored twin %v", n, req, seq, err, terr)
		}
		if err != nil {
			if got != a || !reflect.DeepEqual(a, before) {
				t.Fatalf("step %d: refused request changed state", n)
			}
			continue
		}
		last = seq
		if outcomes != nil {
			outcomes[d.Outcome]++
		}
		if !reflect.DeepEqual(d, rd) {
			t.Fatalf("step %d %+v seq %d: decision differs from reference:\n got  %+v\n want %+v", n, req, seq, d, rd)
		}
		if !reflect.DeepEqual(d, td) {
			t.Fatalf("step %d %+v seq %d: decision differs from restored twin:\n got  %+v\n twin %+v", n, req, seq, d, td)
		}
		if ev, err := store.DecodeEvents(store.EncodeEvents(d.Events)); err != nil || !reflect.DeepEqual(ev, d.Events) {
			t.Fatalf("step %d: events %+v do not round trip: %+v, %v", n, d.Events, ev, err)
		}
		if (got == nil) != (rgot == nil) {
			t.Fatalf("step %d: activity %v, reference %v", n, got, rgot)
		}
		if got != nil {
			if !reflect.DeepEqual(got.Live(), rgot.Live) && len(rgot.Live)+len(got.Live()) > 0 {
				t.Fatalf("step %d: Live %+v, reference %+v", n, got.Live(), rgot.Live)
			}
			if got.Capacity != rgot.Capacity || got.Confirmed != rgot.Confirmed || got.NextSeq != rgot.NextSeq ||
				got.Held != rgot.Held || got.Hold != rgot.Hold {
				t.Fatalf("step %d: counters %d/%d/%d/%d/%s, reference %d/%d/%d/%d/%s", n,
					got.Capacity, got.Confirmed, got.NextSeq, got.Held, got.Hold,
					rgot.Capacity, rgot.Confirmed, rgot.NextSeq, rgot.Held, rgot.Hold)
			}
		}
		if err := checkInvariants(got); err != nil {
			t.Fatalf("step %d %+v seq %d: %v", n, req, seq, err)
		}
		if err := checkDecision(prev, got, req, seq, d); err != nil {
			t.Fatalf("step %d %+v seq %d: %v", n, req, seq, err)
		}
		clk.saw(id, d)
		acts[id], refs[id], twins[id] = got, rgot, tgot
	}
}

// TestFuzzSeedsReachEveryOutcome: the seed corpus alone, which every
// plain go test runs, decides every outcome a request can have, the hold
// ones included, so the comparison with the reference covers them all.
func TestFuzzSeedsReachEveryOutcome(t *testing.T) {
	outcomes := map[wire.Outcome]int{}
	for _, data := range fuzzSeeds() {
		runSteps(t, data, outcomes)
	}
	for _, o := range []wire.Outcome{
		wire.OutcomeOpened, wire.OutcomeResized, wire.OutcomeRejected, wire.OutcomeConfirmed, wire.OutcomeWaiting,
		wire.OutcomeAlreadyConfirmed, wire.OutcomeAlreadyWaiting, wire.OutcomeCancelled, wire.OutcomeNotSignedUp,
		wire.OutcomeGranted, wire.OutcomeSoldOut, wire.OutcomeAlreadyOwned, wire.OutcomeNoSuchActivity,
		wire.OutcomeHeld, wire.OutcomeNotHeld, wire.OutcomeHoldExpired, wire.OutcomeExpired,
	} {
		if outcomes[o] == 0 {
			t.Errorf("the seeds never decide %s", o)
		}
	}
	t.Logf("outcomes over the seeds: %v", outcomes)
}
