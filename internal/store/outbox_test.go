package store

import (
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/wire"
)

// TestEventsRoundTripWithHolds: held_until travels as Unix microseconds
// after the user, and only on the events of a hold.
func TestEventsRoundTripWithHolds(t *testing.T) {
	until := time.Date(2026, 3, 1, 12, 0, 2, 345678000, time.UTC)
	ev := func(kind wire.EventKind, user int64) allocation.Event {
		return allocation.Event{Kind: kind, UserID: user}
	}
	evAt := func(kind wire.EventKind, user int64, until time.Time) allocation.Event {
		return allocation.Event{Kind: kind, UserID: user, HeldUntil: until}
	}
	events := []allocation.Event{
		evAt(wire.EventHeld, 1, until), ev(wire.EventSoldOut, 0), ev(wire.EventExpired, 1),
		evAt(wire.EventPromoted, 2, until), ev(wire.EventConfirmed, 2),
	}
	us := strconv.FormatInt(until.UnixMicro(), 10)
	want := "held:1:" + us + ";sold_out:0;expired:1;promoted:2:" + us + ";confirmed:2"
	if got := EncodeEvents(events); got != want {
		t.Fatalf("EncodeEvents = %q, want %q", got, want)
	}
	got, err := DecodeEvents(want)
	if err != nil || !reflect.DeepEqual(got, events) {
		t.Fatalf("DecodeEvents = %+v, %v; want %+v", got, err, events)
	}
	for _, bad := range []string{"held:1:", "held:1:0", "held:1:soon", "held::" + us} {
		if _, err := DecodeEvents(bad); err == nil {
			t.Errorf("DecodeEvents(%q) accepted", bad)
		}
	}
	if got := EncodeEvents(nil); got != "" {
		t.Fatalf("EncodeEvents(nil) = %q", got)
	}
	if got, err := DecodeEvents(""); got != nil || err != nil {
		t.Fatalf("DecodeEvents(\"\") = %v, %v", got, err)
	}
}

// TestPromotedColumn: both fields of a result are stored as one JSON list,
// and read back into the field the op names.
func TestPromotedColumn(t *testing.T) {
	one := int64(7)
	for _, r := range []wire.Result{
		{Op: wire.OpCancel, PromotedUserID: &one},
		{Op: wire.OpConfirm, PromotedUserID: &one},
		{Op: wire.OpExpire, PromotedUserID: &one},
		{Op: wire.OpOpen, PromotedUserIDs: []int64{7}},
		{Op: wire.OpOpen, PromotedUserIDs: []int64{7, 3, 9}},
		{Op: wire.OpCancel},
		{Op: wire.OpOpen},
	} {
		col := promotedColumn(r)
		back := wire.Result{Op: r.Op}
		if err := setPromoted(&back, col); err != nil || !reflect.DeepEqual(back, r) {
			t.Errorf("%s %v %v: column %q reads back as %v %v (%v)", r.Op, r.PromotedUserID, r.PromotedUserIDs, col,
				back.PromotedUserID, back.PromotedUserIDs, err)
		}
	}
}
