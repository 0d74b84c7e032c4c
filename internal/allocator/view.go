package allocator

import (
	"context"
	"encoding/json"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/wire"
)

// publishViews hands the views of the activities a commit changed to the
// view publisher (package viewpub): a viewed one's current view, and a
// cleared view (Complete=false, the sequence it covers) for one that may
// have a sheddable view stored and no longer is viewed. It never waits for
// the bucket: the publisher writes from its own goroutine. The same views
// go to ingest at once on the result subject, ahead of these results.
//
// Views are an optimisation, never the proof: ingest sheds a claim only
// after seeing, in the request stream itself, that nothing that could
// change the answer was stored between the view's place and the claim's.
// A view missing, late or stale costs a trip through the allocator, never
// a wrong answer; a view must be true at its place, as every view here is
// (taken from the committed state, or from one MySQL snapshot).
func (a *Allocator) publishViews(_ context.Context, changed []*allocation.Activity) {
	if a.pub == nil || len(changed) == 0 {
		return
	}
	notify := a.pub.Offer(changed)
	if len(notify) > 0 {
		// Before the results: ingest applies these first.
		if b, err := json.Marshal(wire.ResultBatch{Views: notify}); err == nil {
			a.deps.NATS.Publish(wire.ResultSubject, b) //nolint:errcheck // the bucket is the durable copy
		}
	}
}
