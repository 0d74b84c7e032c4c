package viewpub

import (
	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/wire"
)

// viewed reports whether act gets a view: when a claim on it is decided
// by allocation.ClaimOnFull from the view alone (full, nobody waiting).
func viewed(act *allocation.Activity) bool { return allocation.Viewed(act) }

// viewOf is the view of a viewed activity: what a claim on it is answered
// from (allocation.ViewSeats).
func viewOf(act *allocation.Activity) wire.View { return allocation.ViewOf(act) }

// clearedView is the view that replaces a full activity's once it is not.
func clearedView(act *allocation.Activity) wire.View {
	return at(wire.View{ActivityID: act.ID, Capacity: act.Capacity, Confirmed: act.Confirmed}, act.NextSeq-1)
}

// The publisher orders views by the place (wire.Place) of the last request
// applied to their activity; a view carries it as Seq and Index.

// placeOf is the place v is at.
func placeOf(v wire.View) uint64 { return wire.Place(v.Seq, v.Index) }

// at is v at place.
func at(v wire.View, place uint64) wire.View {
	v.Seq, v.Index = wire.SeqOf(place), wire.IndexOf(place)
	return v
}
