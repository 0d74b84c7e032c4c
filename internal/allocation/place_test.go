package allocation_test

import (
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/wire"
)

// TestPlacesThroughTheWire: the domain orders by places (wire.Place); a
// hold given inside a batch is named by its place, an expire from the wire
// (HoldSeq and HoldIndex) lapses exactly that hold, and results and views
// give the place back as (seq, index).
func TestPlacesThroughTheWire(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	cap1 := int64(1)
	apply := func(a *allocation.Activity, req wire.Request, place uint64) (*allocation.Activity, wire.Result) {
		t.Helper()
		after, d, err := allocation.Apply(a, allocation.RequestOf(req), place)
		if err != nil {
			t.Fatalf("%s at %s: %v", req.Op, wire.FormatPlace(place), err)
		}
		return after, allocation.ResultOf(req, place, d, after, at)
	}
	a, _ := apply(nil, wire.Request{Op: wire.OpOpen, ActivityID: 1, Capacity: &cap1, Hold: wire.Duration(time.Minute), ReceivedAt: at}, wire.Place(3, 0))
	join := wire.Request{Op: wire.OpJoin, ActivityID: 1, UserID: 7, ReceivedAt: at}
	held := wire.Place(4, 2)
	a, r := apply(a, join, held)
	if r.Outcome != wire.OutcomeHeld || r.Seq != 4 || r.Index != 2 || r.PlaceOf() != held {
		t.Fatalf("join in a batch: %+v, want HELD at 4#2", r)
	}
	if s, ok := a.Lookup(7); !ok || s.HoldSeq != held || s.QueueSeq != held {
		t.Fatalf("the signup %+v, want its hold and queue_seq at the join's place %d", s, held)
	}
	if v := allocation.ViewOf(a); v.Seq != 4 || v.Index != 2 {
		t.Fatalf("view at %d#%d, want 4#2", v.Seq, v.Index)
	}
	// An expire naming the batch's message, not the request, finds no hold.
	other := wire.ExpireRequest(1, 7, wire.Place(4, 0), *r.HeldUntil)
	a, r = apply(a, other, wire.Place(5, 0))
	if r.Outcome != wire.OutcomeNotHeld {
		t.Fatalf("an expire of the hold at 4#0: %s, want NOT_HELD", r.Outcome)
	}
	until, _ := a.Lookup(7)
	exp := wire.ExpireRequest(1, 7, held, until.HeldUntil)
	if exp.HoldSeq != 4 || exp.HoldIndex != 2 || exp.HoldPlace() != held {
		t.Fatalf("the expire names %d#%d, want 4#2", exp.HoldSeq, exp.HoldIndex)
	}
	_, r = apply(a, exp, wire.Place(6, 1))
	if r.Outcome != wire.OutcomeExpired || r.Seq != 6 || r.Index != 1 {
		t.Fatalf("the expire of the hold at 4#2: %+v, want EXPIRED at 6#1", r)
	}
}
