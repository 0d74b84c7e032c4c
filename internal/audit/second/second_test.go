package second_test

import (
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/audit/second"
	"github.com/allot-dev/allot/internal/wire"
)

// TestCheck: the reference model agrees with allocation.Apply on a run of
// requests, objects to a decision Apply got wrong (naming both), and judges
// the requests after it from Apply's state, so one fault is one
// disagreement; a seeded activity is judged from the seed.
func TestCheck(t *testing.T) {
	var o second.Opinion
	var act *allocation.Activity
	apply := func(req allocation.Request, seq uint64, wrong bool) *second.Disagreement {
		t.Helper()
		req.ActivityID = 7
		req.ReceivedAt = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
		after, d, err := allocation.Apply(act, req, seq)
		if wrong {
			d.Outcome = wire.OutcomeAlreadyConfirmed
		}
		dis := o.Check(act, req, seq, after, d, err)
		if err == nil {
			act = after
		}
		return dis
	}
	if dis := apply(allocation.Request{Op: wire.OpOpen, Capacity: 1}, 1, false); dis != nil {
		t.Fatalf("open: %+v", dis)
	}
	if dis := apply(allocation.Request{Op: wire.OpJoin, UserID: 1}, 2, false); dis != nil {
		t.Fatalf("join 1: %+v", dis)
	}
	dis := apply(allocation.Request{Op: wire.OpJoin, UserID: 2}, 3, true)
	if dis == nil {
		t.Fatal("a wrong outcome passed")
	}
	if !strings.HasPrefix(dis.Expected, "WAITING status WAITING position 1") || !strings.HasPrefix(dis.Actual, "ALREADY_CONFIRMED status WAITING") || dis.Why != "the decisions differ" {
		t.Fatalf("disagreement %+v", dis)
	}
	if dis := apply(allocation.Request{Op: wire.OpCancel, UserID: 1}, 4, false); dis != nil {
		t.Fatalf("the request after the fault: %+v", dis)
	}

	// From a checkpoint's state: user 2 holds the seat; the reference
	// knows it only from the seed.
	seeded, err := allocation.Restore(8, 1, 1, 10, 0, []allocation.Signup{{UserID: 2, Status: wire.StatusConfirmed, QueueSeq: 3}})
	if err != nil {
		t.Fatal(err)
	}
	var fresh second.Opinion
	fresh.Seed(seeded)
	req := allocation.Request{Op: wire.OpJoin, ActivityID: 8, UserID: 2, ReceivedAt: time.Now()}
	after, d, err := allocation.Apply(seeded, req, 10)
	if dis := fresh.Check(seeded, req, 10, after, d, err); dis != nil {
		t.Fatalf("after a seed: %+v", dis)
	}
	var unseeded second.Opinion
	if dis := unseeded.Check(seeded, req, 10, after, d, err); dis == nil {
		t.Fatal("an activity the reference never saw opened passed")
	}
}

// TestCheckAtPlaces: the reference model judges requests at places, as
// allocation.Apply takes them: several requests of one batch share a
// stream sequence and differ by index, and an expire names its hold by
// the place of the join that created it.
func TestCheckAtPlaces(t *testing.T) {
	var o second.Opinion
	var act *allocation.Activity
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	apply := func(req allocation.Request, place uint64) allocation.Decision {
		t.Helper()
		req.ActivityID, req.ReceivedAt = 9, at
		after, d, err := allocation.Apply(act, req, place)
		if err != nil {
			t.Fatalf("%s at %s: %v", req.Op, wire.FormatPlace(place), err)
		}
		if dis := o.Check(act, req, place, after, d, err); dis != nil {
			t.Fatalf("%s at %s: %+v", req.Op, wire.FormatPlace(place), dis)
		}
		act = after
		return d
	}
	apply(allocation.Request{Op: wire.OpOpen, Capacity: 1, Hold: time.Minute}, wire.Place(3, 0))
	// One batch: user 1 holds the seat, user 2 waits behind.
	apply(allocation.Request{Op: wire.OpJoin, UserID: 1}, wire.Place(4, 0))
	apply(allocation.Request{Op: wire.OpJoin, UserID: 2}, wire.Place(4, 1))
	// User 1's hold lapses: the expire names it at 4#0, and user 2 is
	// promoted.
	at = at.Add(2 * time.Minute)
	d := apply(allocation.Request{Op: wire.OpExpire, UserID: 1, HoldSeq: wire.Place(4, 0)}, wire.Place(5, 0))
	if d.Outcome != wire.OutcomeExpired || len(d.PromotedUserIDs) != 1 || d.PromotedUserIDs[0] != 2 {
		t.Fatalf("the expire of 4#0: %+v", d)
	}
	// An expire naming the place of user 2's join, not its hold's (which
	// the promotion at 5 created), lapses nothing, by both models.
	at = at.Add(2 * time.Minute)
	if d := apply(allocation.Request{Op: wire.OpExpire, UserID: 2, HoldSeq: wire.Place(4, 1)}, wire.Place(6, 0)); d.Outcome == wire.OutcomeExpired {
		t.Fatalf("an expire naming another place lapsed the hold: %+v", d)
	}
	if act.NextSeq != wire.Place(6, 0)+1 {
		t.Fatalf("next_seq %d, want the place after 6", act.NextSeq)
	}
}
