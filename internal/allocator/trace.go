package allocator

import (
	"context"

	"github.com/allot-dev/allot/internal/allocator/spans"
	"github.com/allot-dev/allot/internal/wire"
)

// traceDecision records the decision on one traced request
// (spans.Decision), remembered for the relay when it has events.
func (a *Allocator) traceDecision(ctx context.Context, it item, res wire.Result, events int) {
	if sc := spans.Decision(ctx, it.msg, it.seq, res, events); sc.IsValid() && events > 0 {
		a.relay.NoteDecision(res.RequestID, sc)
	}
}
