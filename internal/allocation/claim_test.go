package allocation_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/allocation/refmodel"
	"github.com/allot-dev/allot/internal/wire"
)

// fullActivity applies reqs (activity 1, seqs from 1) and returns the result.
func fullActivity(t *testing.T, reqs []allocation.Request) *allocation.Activity {
	a, _ := fullActivityAndModel(t, reqs)
	return a
}

// fullActivityAndModel is fullActivity and the reference model's state
// after the same requests.
func fullActivityAndModel(t *testing.T, reqs []allocation.Request) (*allocation.Activity, *refmodel.Activity) {
	t.Helper()
	var (
		a   *allocation.Activity
		ref *refmodel.Activity
	)
	for i, r := range reqs {
		r.ActivityID = 1
		var err error
		if a, _, err = allocation.Apply(a, r, uint64(i+1)); err != nil {
			t.Fatalf("request %d %+v: %v", i, r, err)
		}
		if ref, _, err = refmodel.Apply(ref, r, uint64(i+1)); err != nil {
			t.Fatalf("reference, request %d %+v: %v", i, r, err)
		}
	}
	return a, ref
}

// TestClaimOnFullIsTheDecision: on every kind of full activity, for every
// claimant, allocation.ClaimOnFull answers exactly what Apply decides for
// the claim (and what the reference model, which does not use it,
// decides), and so does ingest's way to it (the activity's view, as it
// travels in JSON, through ViewSeats, into ResultOf), whenever the view
// decides; the view decides exactly when it lists every holder.
func TestClaimOnFullIsTheDecision(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)
	open := func(c int64, hold time.Duration) allocation.Request {
		return allocation.Request{Op: wire.OpOpen, Capacity: c, Hold: hold, ReceivedAt: t0}
	}
	do := func(op wire.Op, users ...int64) []allocation.Request {
		var out []allocation.Request
		for _, u := range users {
			out = append(out, allocation.Request{Op: op, UserID: u, ReceivedAt: t0.Add(time.Duration(u) * time.Millisecond)})
		}
		return out
	}
	seq := func(parts ...[]allocation.Request) []allocation.Request {
		var out []allocation.Request
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	users := func(from, to int64) []int64 {
		var out []int64
		for u := from; u <= to; u++ {
			out = append(out, u)
		}
		return out
	}
	big := int64(wire.MaxViewHolders + 1)
	cases := []struct {
		name string
		reqs []allocation.Request
		// viewed: the activity gets a view; decides: that view decides
		// claims.
		viewed, decides bool
	}{
		{"confirmed holders: complete", seq([]allocation.Request{open(3, 0)}, do(wire.OpJoin, 1, 2, 3)), true, true},
		{"claimed seats: complete", seq([]allocation.Request{open(2, 0)}, do(wire.OpClaim, 1, 2)), true, true},
		{"no seats at all", []allocation.Request{open(0, 0)}, true, true},
		{"HELD and CONFIRMED holders: holds listed", seq([]allocation.Request{open(3, time.Minute)}, do(wire.OpJoin, 1, 2, 3),
			do(wire.OpConfirm, 2)), true, true},
		{"HELD holders only: holds listed", seq([]allocation.Request{open(2, time.Hour)}, do(wire.OpClaim, 1, 2)), true, true},
		{"holds given, then all confirmed: complete", seq([]allocation.Request{open(2, time.Hour)}, do(wire.OpJoin, 1, 2),
			do(wire.OpConfirm, 1, 2)), true, true},
		{"a HELD holder promoted from the waitlist", seq([]allocation.Request{open(2, time.Hour)}, do(wire.OpJoin, 1, 2, 3),
			do(wire.OpCancel, 1)), true, true},
		{"waiters: no view", seq([]allocation.Request{open(2, 0)}, do(wire.OpJoin, 1, 2, 3, 4)), false, false},
		{"waiters behind HELD seats: no view", seq([]allocation.Request{open(1, time.Hour)}, do(wire.OpJoin, 1, 2)), false, false},
		{"a seat free: no view", seq([]allocation.Request{open(3, 0)}, do(wire.OpJoin, 1)), false, false},
		{"over MaxViewHolders: a view that lists nobody", seq([]allocation.Request{open(big, 0)}, do(wire.OpJoin, users(1, big)...)), true, false},
	}
	at := t0.Add(time.Hour)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, ref := fullActivityAndModel(t, c.reqs)
			if got := allocation.Viewed(a); got != c.viewed {
				t.Fatalf("Viewed = %v, want %v", got, c.viewed)
			}
			var (
				seats   map[int64]allocation.Signup
				decides bool
				v       wire.View
			)
			if c.viewed {
				b, err := json.Marshal(allocation.ViewOf(a))
				if err != nil {
					t.Fatal(err)
				}
				if err := json.Unmarshal(b, &v); err != nil {
					t.Fatal(err)
				}
				seats, decides = allocation.ViewSeats(v)
				if decides != c.decides || allocation.ViewDecides(v) != decides {
					t.Fatalf("ViewSeats ok %v, ViewDecides %v, want %v (view %.200s)", decides, allocation.ViewDecides(v), c.decides, b)
				}
			}
			claimants := []int64{0, 1, 2, 3, 4, 99, big}
			for _, u := range claimants[1:] {
				seq := a.NextSeq
				req := wire.Request{RequestID: "r", Op: wire.OpClaim, ActivityID: 1, UserID: u}
				after, d, err := allocation.Apply(a.Clone(), allocation.RequestOf(req), seq)
				if err != nil {
					t.Fatal(err)
				}
				// The reference model decides the claim its own way.
				_, rd, err := refmodel.Apply(ref.Clone(), allocation.RequestOf(req), seq)
				if err != nil || !reflect.DeepEqual(d, rd) {
					t.Fatalf("user %d: Apply decides %+v, the reference model %+v (%v)", u, d, rd, err)
				}
				want := allocation.ResultOf(req, seq, d, after, at)

				seat, found := a.Lookup(u)
				full := a.Confirmed >= a.Capacity
				waits := found && seat.Status == wire.StatusWaiting
				got, decided := allocation.ClaimOnFull(a.Capacity, a.Confirmed, seat, found)
				if decided != (full && !waits) {
					t.Fatalf("user %d (%+v, found %v): ClaimOnFull decided %v on %d of %d seats taken", u, seat, found, decided, a.Confirmed, a.Capacity)
				}
				if decided && !reflect.DeepEqual(got, d) {
					t.Fatalf("user %d: ClaimOnFull %+v, Apply decides %+v", u, got, d)
				}
				if decided && d.Changes {
					t.Fatalf("user %d: a claim on a full activity changed it: %+v", u, d)
				}
				if !decides {
					continue
				}
				// Ingest's way: the seat as the view lists it.
				vseat, vfound := seats[u]
				vd, vdecided := allocation.ClaimOnFull(v.Capacity, v.Confirmed, vseat, vfound)
				if !vdecided {
					t.Fatalf("user %d: the view decides no claim of %+v", u, vseat)
				}
				shed := allocation.ResultOf(req, seq, vd, nil, at)
				if !reflect.DeepEqual(shed, want) {
					t.Fatalf("user %d: answer from the view\n %+v\nthe allocator's\n %+v", u, shed, want)
				}
				wb, _ := json.Marshal(want)
				sb, _ := json.Marshal(shed)
				if string(wb) != string(sb) {
					t.Fatalf("user %d: answer from the view %s, the allocator's %s", u, sb, wb)
				}
			}
		})
	}
}

// TestResultOfIsComplete: a result leaves the domain as MySQL keeps it:
// applied_at in whole microseconds in UTC, the reason within its column,
// the promoted users in the one field the op names.
func TestResultOfIsComplete(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.FixedZone("x", 3600))
	r := allocation.VoidResult(wire.Request{RequestID: "v", UserID: 1}, 5, at)
	if want := time.Date(2026, 3, 1, 11, 0, 0, 123456000, time.UTC); r.AppliedAt != want {
		t.Fatalf("applied_at %v, want %v", r.AppliedAt, want)
	}
	a := fullActivity(t, []allocation.Request{{Op: wire.OpOpen, Capacity: 1}, {Op: wire.OpJoin, UserID: 1}, {Op: wire.OpJoin, UserID: 2}, {Op: wire.OpJoin, UserID: 3}})
	cancel := wire.Request{Op: wire.OpCancel, ActivityID: 1, UserID: 1}
	after, d, err := allocation.Apply(a.Clone(), allocation.RequestOf(cancel), a.NextSeq)
	if err != nil {
		t.Fatal(err)
	}
	r = allocation.ResultOf(cancel, a.NextSeq, d, after, at)
	if r.PromotedUserID == nil || *r.PromotedUserID != 2 || r.PromotedUserIDs != nil {
		t.Fatalf("cancel promoting user 2: %v %v", r.PromotedUserID, r.PromotedUserIDs)
	}
	grow := wire.Request{Op: wire.OpOpen, ActivityID: 1, Capacity: new(int64)}
	*grow.Capacity = 3
	after, d, err = allocation.Apply(a.Clone(), allocation.RequestOf(grow), a.NextSeq)
	if err != nil {
		t.Fatal(err)
	}
	r = allocation.ResultOf(grow, a.NextSeq, d, after, at)
	if r.PromotedUserID != nil || !reflect.DeepEqual(r.PromotedUserIDs, []int64{2, 3}) {
		t.Fatalf("resize promoting users 2 and 3: %v %v", r.PromotedUserID, r.PromotedUserIDs)
	}
	if got := wire.CutReason(string(make([]rune, 300))); len([]rune(got)) != wire.MaxReasonLen {
		t.Fatalf("a reason of 300 characters is cut to %d", len([]rune(got)))
	}
	if got := wire.CutReason("ok\xff"); got != "ok?" {
		t.Fatalf("CutReason(bad UTF-8) = %q", got)
	}
}
