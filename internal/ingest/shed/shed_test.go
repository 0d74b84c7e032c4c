package shed

import (
	"context"
	"log/slog"
	"testing"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/wire"
)

// TestLateViewNeverOverridesANewerClear: the bucket's writes can reach an
// ingest out of order (a delayed put, a frozen allocator waking up). A view
// of an older state that arrives after a newer clear is ignored.
func TestLateViewNeverOverridesANewerClear(t *testing.T) {
	cache, _ := lru.New[int64, viewEntry](8)
	vs := views{m: cache}
	full := wire.View{ActivityID: 7, Capacity: 1, Confirmed: 1, Seq: 100, Complete: true, Holders: []int64{1}}
	vs.put(full)
	if vs.get(7) == nil {
		t.Fatal("a full view was not installed")
	}
	vs.put(wire.View{ActivityID: 7, Capacity: 2, Confirmed: 1, Seq: 150}) // a resize cleared it
	if vs.get(7) != nil {
		t.Fatal("a clear did not remove the view")
	}
	vs.put(full) // the late put of the older view
	if sv := vs.get(7); sv != nil {
		t.Fatalf("a late view of seq 100 overrode the clear at seq 150: %+v", sv.v)
	}
	newer := full
	newer.Seq = 160
	vs.put(newer)
	if sv := vs.get(7); sv == nil || sv.v.Seq != 160 {
		t.Fatal("a newer full view was not installed after the clear")
	}
}

// TestTailSettles: the tail proves a claim's answer from a view only when
// it has passed the claim and seen nothing but claims on the activity
// between the view and the claim.
func TestTailSettles(t *testing.T) {
	tl := newTail(4)
	tl.from, tl.pos = 10, 9
	claim, join := wire.OpsOf(wire.OpClaim), wire.OpsOf(wire.OpJoin)
	p := func(seq uint64) uint64 { return wire.Place(seq, 0) }
	tl.see(10, "alloc.req.7", claim, "")
	tl.see(11, "alloc.req.8", join, "") // another activity
	tl.see(12, "alloc.req.7", claim, "")
	if !tl.settled(7, p(10), p(12)) {
		t.Fatal("only claims after the view, yet not settled")
	}
	if tl.settled(7, p(10), p(13)) {
		t.Fatal("settled for a claim the tail has not passed")
	}
	if tl.settled(7, p(8), p(12)) {
		t.Fatal("settled from a view older than what the tail has seen")
	}
	tl.see(13, "alloc.req.7", join, "")
	tl.see(14, "alloc.req.0.7", claim, "") // a partitioned subject
	if tl.settled(7, p(12), p(14)) {
		t.Fatal("a join stored between the view and the claim went unnoticed")
	}
	if !tl.settled(7, p(13), p(14)) {
		t.Fatal("a view newer than the join does not settle")
	}
	tl.see(15, "alloc.req.9", "", "") // no Allot-Ops: counts as a change
	if tl.settled(9, p(14), p(15)) {
		t.Fatal("a message without Allot-Ops counted as a claim")
	}
	// Evicting an activity's entry raises the floor: never a false proof.
	small := newTail(2)
	small.from, small.pos = 5, 4
	small.see(5, "alloc.req.1", join, "3") // a batch: changed at 5#2
	small.see(6, "alloc.req.2", join, "")
	small.see(7, "alloc.req.3", join, "") // evicts activity 1
	if small.settled(1, wire.Place(5, 1), p(7)) {
		t.Fatal("an evicted activity's change was forgotten")
	}
	if !small.settled(1, p(6), p(7)) {
		t.Fatal("a view newer than every evicted change does not settle")
	}
}

// TestTailReadsBatches: from headers alone, a batch of claims (and a void)
// moves no activity's change; a batch with a join moves it to the batch's
// last place, so that no claim of that batch, before the join or after it,
// is settled by a view before the batch; a message without Allot-Ops
// moves it the same way; waitPast waits for a message's sequence.
func TestTailReadsBatches(t *testing.T) {
	tl := newTail(8)
	tl.from, tl.pos = 10, 9
	view := wire.Place(10, 3)
	tl.see(10, "alloc.req.7", wire.OpsOf(wire.OpJoin), "4") // the view covers all of it
	tl.see(11, "alloc.req.7", wire.OpsOf(wire.OpClaim, wire.OpClaim), "50")
	tl.see(12, "alloc.req.7", wire.OpsOf(wire.OpVoid), "")
	if last, _ := tl.changed.Peek(7); last != wire.Place(10, 3) {
		t.Fatalf("last change %s, want 10#3 (the join's batch)", wire.FormatPlace(last))
	}
	for _, i := range []int{0, 17, 49} {
		if !tl.settled(7, view, wire.Place(11, i)) {
			t.Fatalf("claim at 11#%d after a claims-only batch is not settled", i)
		}
	}
	tl.see(13, "alloc.req.7", wire.OpsOf(wire.OpClaim, wire.OpJoin), "20")
	if last, _ := tl.changed.Peek(7); last != wire.Place(13, 19) {
		t.Fatalf("a batch with a join: last change %s, want 13#19", wire.FormatPlace(last))
	}
	for _, i := range []int{0, 19} {
		if tl.settled(7, view, wire.Place(13, i)) {
			t.Fatalf("claim at 13#%d in a batch with a join settled by a view before it", i)
		}
	}
	tl.see(14, "alloc.req.7", wire.OpsOf(wire.OpClaim), "")
	if !tl.settled(7, wire.Place(13, 19), wire.Place(14, 0)) {
		t.Fatal("a view covering the whole batch does not settle a later claim")
	}
	tl.see(15, "alloc.req.7", "", "3") // an older publisher's batch
	if last, _ := tl.changed.Peek(7); last != wire.Place(15, 2) {
		t.Fatalf("a batch without Allot-Ops: last change %s, want 15#2", wire.FormatPlace(last))
	}
	tl.see(16, "alloc.req.7", "", "") // a hold's expiry
	if last, _ := tl.changed.Peek(7); last != wire.Place(16, 0) {
		t.Fatalf("a message without Allot-Ops: last change %s, want 16", wire.FormatPlace(last))
	}
	if tl.settled(7, wire.Place(15, 2), wire.Place(16, 0)) {
		t.Fatal("a claim right behind an expiry settled by a view before it")
	}
	if !tl.waitPast(context.Background(), 16, 0) || tl.waitPast(context.Background(), 17, time.Millisecond) {
		t.Fatal("waitPast does not wait for the message's sequence")
	}
}

// TestHeldHoldersAreListedApart: in a view of an activity with holds, a
// CONFIRMED holder maps to no hold and a HELD one to the end of its hold,
// which a shed ALREADY_OWNED carries; a view that lists no end for a
// HELD seat never decides a claim.
func TestHeldHoldersAreListedApart(t *testing.T) {
	cache, _ := lru.New[int64, viewEntry](8)
	vs := views{m: cache}
	until := time.Date(2026, 12, 1, 10, 20, 30, 123456000, time.UTC)
	v := wire.View{ActivityID: 7, Capacity: 2, Confirmed: 2, Seq: 100, HoldsListed: true,
		Holders: []int64{1}, Held: []wire.HeldSeat{{UserID: 2, HeldUntil: until}}}
	if !allocation.ViewDecides(v) {
		t.Fatal("a full view listing its HELD seats apart is not sheddable")
	}
	vs.put(v)
	sv := vs.get(7)
	if sv == nil {
		t.Fatal("the view was not installed")
	}
	if got, ok := sv.holders[1]; !ok || got.Status != wire.StatusConfirmed || !got.HeldUntil.IsZero() {
		t.Fatalf("CONFIRMED holder: %v %v, want no hold", got, ok)
	}
	if got, ok := sv.holders[2]; !ok || got.Status != wire.StatusHeld || !got.HeldUntil.Equal(until) {
		t.Fatalf("HELD holder: %v %v, want held until %v", got, ok, until)
	}
	if _, ok := sv.holders[3]; ok {
		t.Fatal("a user without a seat is listed")
	}
	// An ingest that knows nothing of holds reads Complete only.
	if v.Complete {
		t.Fatal("a view with HELD seats is Complete: an ingest without holds would answer from it")
	}
	bad := v
	bad.Seq = 101
	bad.Held = []wire.HeldSeat{{UserID: 2}}
	vs.put(bad)
	if vs.get(7) != nil {
		t.Fatal("a view with a HELD seat without an end was installed")
	}
}

// TestViewsAreBounded: ingest keeps at most ActivityCache views.
func TestViewsAreBounded(t *testing.T) {
	t.Parallel()
	ans, err := New(Config{ActivityCache: 10, Results: 10}, slog.New(slog.DiscardHandler), Metrics{})
	if err != nil {
		t.Fatal(err)
	}
	for a := int64(1); a <= 100; a++ {
		ans.PutView(wire.View{ActivityID: a, Capacity: 1, Confirmed: 1, Seq: uint64(a), Complete: true, Holders: []int64{1}})
	}
	if n := ans.views.m.Len(); n != 10 {
		t.Fatalf("%d views kept, bounded at 10", n)
	}
	if ans.Candidate(100) == nil || ans.Candidate(1) != nil {
		t.Fatal("the bound did not keep the most recent views")
	}
}

// TestAViewThatArrivesDuringThePublishAnswers: a claim published while its
// activity had no view is shed from a view that arrived meanwhile, once
// the tail proves it; with no view at all it is left to the allocator at
// once, without waiting on the tail.
func TestAViewThatArrivesDuringThePublishAnswers(t *testing.T) {
	m := Metrics{
		Claims:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "claims"}, []string{"outcome"}),
		Missed:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "missed"}, []string{"reason"}),
		TailWait: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tail_wait"}),
	}
	a, err := New(Config{ActivityCache: 8, Wait: time.Minute, Results: 8}, slog.New(slog.DiscardHandler), m)
	if err != nil {
		t.Fatal(err)
	}
	claim := wire.OpsOf(wire.OpClaim)
	a.tail.from, a.tail.pos = 10, 9
	a.tail.see(10, "alloc.req.7", claim, "")
	a.tail.see(11, "alloc.req.7", claim, "")

	// No view, and a tail that has not reached the claim: no answer, and
	// no wait on the tail (a canceled context would count as tail_behind).
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, ok := a.Answer(ctx, "r12", 7, 42, wire.Place(12, 0), nil); ok {
		t.Fatal("answered a claim on an activity without a view")
	}
	if n := testutil.ToFloat64(m.Missed.WithLabelValues("tail_behind")); n != 0 {
		t.Fatalf("a claim without a view waited on the tail (tail_behind %v)", n)
	}

	// The view arrives while the claim at 11 is published: it answers it.
	a.PutView(wire.View{ActivityID: 7, Capacity: 1, Confirmed: 1, Seq: 10, Complete: true, Holders: []int64{1}})
	res, ok := a.Answer(context.Background(), "r11", 7, 42, wire.Place(11, 0), nil)
	if !ok || res.Outcome != wire.OutcomeSoldOut || !res.Shed || res.Seq != 11 {
		t.Fatalf("claim after a view that arrived during its publish: %+v, answered %v; want shed SOLD_OUT at seq 11", res, ok)
	}
	if got, ok := a.Recorded("r11"); !ok || got.Outcome != wire.OutcomeSoldOut {
		t.Fatalf("shed answer not kept for polls: %+v %v", got, ok)
	}
}
