package allocation_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/allocation/refmodel"
	"github.com/allot-dev/allot/internal/wire"
)

// checkInvariants verifies the contract's invariants on a, computed by brute
// force from its public accessors only.
func checkInvariants(a *allocation.Activity) error {
	if a == nil {
		return nil
	}
	live := a.Live()
	var confirmed, waiting int64
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
		switch s.Status {
		case wire.StatusConfirmed:
			confirmed++
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
	case wire.OutcomeConfirmed, wire.OutcomeWaiting, wire.OutcomeGranted:
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
	if d.Changes != (len(d.Events) > 0) {
		return fmt.Errorf("Changes %v with events %v", d.Changes, d.Events)
	}
	if d.Status == wire.StatusWaiting && d.Position != a.Position(req.UserID) {
		return fmt.Errorf("decision position %d, Position() %d", d.Position, a.Position(req.UserID))
	}
	return nil
}

// seedStep is one step of a hand-written seed, in the encoding decodeStep
// reads.
type seedStep [3]byte

// Helpers that encode a request on activity act (1..3) for user u (1..10)
// or with capacity c (0..4).
func sOpen(act, c int) seedStep   { return seedStep{byte(8 * (act - 1)), byte(c), 0} }
func sJoin(act, u int) seedStep   { return seedStep{byte(8*(act-1) + 1), byte(u - 1), 0} }
func sCancel(act, u int) seedStep { return seedStep{byte(8*(act-1) + 4), byte(u - 1), 0} }
func sClaim(act, u int) seedStep  { return seedStep{byte(8*(act-1) + 6), byte(u - 1), 0} }

func seedSteps(steps ...seedStep) []byte {
	var b []byte
	for _, s := range steps {
		b = append(b, s[:]...)
	}
	return b
}

// fuzzOps weighs the ops: opens are rarer, since a resize that promotes
// everyone would keep waitlists too short to reach compaction.
var fuzzOps = [8]wire.Op{
	wire.OpOpen, wire.OpJoin, wire.OpJoin, wire.OpJoin, wire.OpCancel, wire.OpCancel, wire.OpClaim, wire.OpOpen,
}

// decodeStep turns three fuzz bytes into a request and a seq, given the
// last global seq and the activities' fences. About one step in sixteen is
// malformed on purpose.
func decodeStep(b0, b1, b2 byte, last uint64, fence func(int64) uint64) (allocation.Request, uint64) {
	req := allocation.Request{Op: fuzzOps[b0%8], ActivityID: int64(b0/8%3) + 1}
	if req.Op == wire.OpOpen {
		req.Capacity = int64(b1 % 5)
	} else {
		req.UserID = int64(b1%10) + 1
	}
	seq := last + 1 + uint64(b2%3)
	if b2 >= 0xF0 {
		switch b2 % 5 {
		case 0:
			seq = fence(req.ActivityID) - 1 // a replay: 0 or the last applied seq
		case 1:
			req.UserID = -req.UserID
		case 2:
			req.Capacity = -1
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
	f.Add([]byte{})
	// The seed story: open cap 1, A, B, C join, duplicates, cancel A, cancel
	// B, A re-joins.
	f.Add(seedSteps(
		sOpen(1, 1), sJoin(1, 1), sJoin(1, 2), sJoin(1, 3), sJoin(1, 1), sJoin(1, 3),
		sCancel(1, 1), sCancel(1, 1), sCancel(1, 2), sJoin(1, 1), sJoin(1, 1), sCancel(1, 2),
	))
	// Resize up and down around a waitlist.
	f.Add(seedSteps(
		sOpen(1, 1), sJoin(1, 1), sJoin(1, 2), sJoin(1, 3), sJoin(1, 4), sOpen(1, 3),
		sOpen(1, 0), sOpen(1, 4), sCancel(1, 2), sOpen(1, 2),
	))
	// Claims into a small capacity, then a waiter's claim.
	f.Add(seedSteps(
		sOpen(2, 2), sClaim(2, 1), sClaim(2, 2), sClaim(2, 3), sClaim(2, 1), sJoin(2, 4),
		sClaim(2, 4), sCancel(2, 1), sClaim(2, 4),
	))
	// Several activities, malformed steps mixed in.
	f.Add(append(seedSteps(sOpen(1, 1), sOpen(3, 2), sJoin(2, 1), sJoin(1, 5), sJoin(3, 5)),
		1, 1, 0xF0, 1, 2, 0xF1, 0, 1, 0xF2, 1, 3, 0xF3, 2, 4, 0xF4, 8, 0, 0))
	// A waitlist that grows long and loses waiters from the head and the
	// middle, which compacts it.
	long := []seedStep{sOpen(1, 1)}
	for u := range 10 {
		long = append(long, sJoin(1, u+1))
	}
	for range 3 {
		for _, u := range []int{3, 5, 7, 1, 2, 9} {
			long = append(long, sCancel(1, u), sJoin(1, u))
		}
	}
	f.Add(seedSteps(long...))
	f.Add([]byte("long run of mixed bytes to exercise waitlists and compaction: join cancel claim open!!"))
	// Long pseudo-random runs, so that the seed corpus alone reaches deep
	// waitlists, compaction and resizes on every plain go test.
	for seed := range uint64(4) {
		r := rand.New(rand.NewPCG(seed, 99))
		data := make([]byte, 1200)
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		f.Add(data)
	}

	f.Fuzz(func(t *testing.T, data []byte) {
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
		for step := 0; step+2 < len(data) && step/3 < maxSteps; step += 3 {
			req, seq := decodeStep(data[step], data[step+1], data[step+2], last, fence)
			id := req.ActivityID
			a, r := acts[id], refs[id]
			prev := a.Live()
			before := a.Clone()

			// Now and then the twin is thrown away and restored from the
			// rows a store would hold, to check Restore round trips.
			if a != nil && (twins[id] == nil || data[step+1]&0x40 != 0) {
				tw, err := allocation.Restore(a.ID, a.Capacity, a.Confirmed, a.NextSeq, a.Hold, a.Live())
				if err != nil {
					t.Fatalf("step %d: Restore of a reachable state: %v", step/3, err)
				}
				twins[id] = tw
			}

			got, d, err := allocation.Apply(a, req, seq)
			rgot, rd, rerr := refmodel.Apply(r, req, seq)
			tgot, td, terr := allocation.Apply(twins[id], req, seq)

			if (err != nil) != (rerr != nil) || (err != nil && !errors.Is(err, allocation.ErrInvalidRequest)) {
				t.Fatalf("step %d %+v seq %d: err %v, reference %v", step/3, req, seq, err, rerr)
			}
			if (err != nil) != (terr != nil) {
				t.Fatalf("step %d %+v seq %d: err %v, restored twin %v", step/3, req, seq, err, terr)
			}
			if err != nil {
				if got != a || !reflect.DeepEqual(a, before) {
					t.Fatalf("step %d: refused request changed state", step/3)
				}
				continue
			}
			last = seq
			if !reflect.DeepEqual(d, rd) {
				t.Fatalf("step %d %+v seq %d: decision differs from reference:\n got  %+v\n want %+v", step/3, req, seq, d, rd)
			}
			if !reflect.DeepEqual(d, td) {
				t.Fatalf("step %d %+v seq %d: decision differs from restored twin:\n got  %+v\n twin %+v", step/3, req, seq, d, td)
			}
			if (got == nil) != (rgot == nil) {
				t.Fatalf("step %d: activity %v, reference %v", step/3, got, rgot)
			}
			if got != nil {
				if !reflect.DeepEqual(got.Live(), rgot.Live) && len(rgot.Live)+len(got.Live()) > 0 {
					t.Fatalf("step %d: Live %+v, reference %+v", step/3, got.Live(), rgot.Live)
				}
				if got.Capacity != rgot.Capacity || got.Confirmed != rgot.Confirmed || got.NextSeq != rgot.NextSeq {
					t.Fatalf("step %d: counters %d/%d/%d, reference %d/%d/%d", step/3,
						got.Capacity, got.Confirmed, got.NextSeq, rgot.Capacity, rgot.Confirmed, rgot.NextSeq)
				}
			}
			if err := checkInvariants(got); err != nil {
				t.Fatalf("step %d %+v seq %d: %v", step/3, req, seq, err)
			}
			if err := checkDecision(prev, got, req, seq, d); err != nil {
				t.Fatalf("step %d %+v seq %d: %v", step/3, req, seq, err)
			}
			acts[id], refs[id], twins[id] = got, rgot, tgot
		}
	})
}
