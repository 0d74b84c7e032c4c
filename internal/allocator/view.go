package allocator

import (
	"context"
	"encoding/json"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/store"
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
	return wire.View{ActivityID: act.ID, Capacity: act.Capacity, Confirmed: act.Confirmed, Seq: act.NextSeq - 1}
}

// publishViews hands the views of the activities a commit changed to the
// view publisher (viewpub.go): a viewed one's current view, and a cleared
// view (Complete=false, the sequence it covers) for one that may have a
// sheddable view stored and no longer is viewed. It never waits for the
// bucket: the publisher writes them from its own goroutine. The same views
// go to ingest at once on the result subject, ahead of these results.
//
// Views are an optimisation, never the proof: ingest answers a claim early
// only after seeing, in the request stream itself, that nothing that could
// change the answer was stored between the view's sequence and the claim's.
// So a view that is missing, late or stale costs a trip through the
// allocator, never a wrong answer; what a view must be is true at its
// sequence, which every view here is (taken from the committed state, or
// from one MySQL snapshot by a rebuild).
func (a *Allocator) publishViews(_ context.Context, changed []*allocation.Activity) {
	if a.pub == nil || len(changed) == 0 {
		return
	}
	notify := a.pub.offer(changed)
	if len(notify) > 0 {
		// Before the results: ingest applies these first.
		if b, err := json.Marshal(wire.ResultBatch{Views: notify}); err == nil {
			a.nc.Publish(wire.ResultSubject, b) //nolint:errcheck // the bucket is the durable copy
		}
	}
}

func toSignups(live []store.SignupRow) []allocation.Signup {
	out := make([]allocation.Signup, len(live))
	for i, s := range live {
		out[i] = allocation.Signup{UserID: s.UserID, Status: s.Status, QueueSeq: s.QueueSeq, HeldUntil: s.HeldUntil, HoldSeq: s.HoldSeq}
	}
	return out
}
