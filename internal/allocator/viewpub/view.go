package viewpub

import (
	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/wire"
)

// viewed reports whether act gets a view: full, and nobody waiting.
func viewed(act *allocation.Activity) bool {
	return act.Confirmed >= act.Capacity && act.Waiting() == 0
}

// viewOf is the view of a viewed activity.
func viewOf(act *allocation.Activity) wire.View {
	v := wire.View{ActivityID: act.ID, Capacity: act.Capacity, Confirmed: act.Confirmed, Seq: act.NextSeq - 1}
	if act.Confirmed > wire.MaxViewHolders {
		return v
	}
	// A claim by a HELD user is answered ALREADY_OWNED with status HELD
	// and held_until, so the HELD users are listed apart, with their
	// holds' ends, in a view an ingest without holds does not shed from.
	v.Holders = make([]int64, 0, act.Confirmed-act.Held)
	for _, s := range act.Live() {
		if s.Status == wire.StatusHeld {
			v.Held = append(v.Held, wire.HeldSeat{UserID: s.UserID, HeldUntil: s.HeldUntil})
			continue
		}
		v.Holders = append(v.Holders, s.UserID)
	}
	if len(v.Held) > 0 {
		v.HoldsListed = true
	} else {
		v.Complete = true
	}
	return v
}

// clearedView is the view that replaces a full activity's once it is not.
func clearedView(act *allocation.Activity) wire.View {
	return wire.View{ActivityID: act.ID, Capacity: act.Capacity, Confirmed: act.Confirmed, Seq: act.NextSeq - 1}
}
