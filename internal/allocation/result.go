package allocation

import (
	"slices"
	"strconv"
	"time"

	"github.com/allot-dev/allot/internal/wire"
)

// RequestOf is what the domain needs of a request message.
func RequestOf(req wire.Request) Request {
	r := Request{
		Op: req.Op, ActivityID: req.ActivityID, UserID: req.UserID,
		Hold: time.Duration(req.Hold), HoldSeq: req.HoldPlace(), ReceivedAt: req.ReceivedAt,
	}
	if req.Capacity != nil {
		r.Capacity = *req.Capacity
	}
	return r
}

// ResultOf turns the decision d on req (at place, wire.Place, leaving the
// activity as after, applied at the instant at) into the result: the one
// value the allocator publishes on the result subject and records, a read
// of the record gives back, the audit expects (its applied_at apart) and
// ingest answers a shed claim with. It is complete: applied_at is
// wire.Instant(at), the reason is cut as its column keeps it, and the
// promoted users are in the field the op names (wire.SinglePromotion).
// The caller owns the clock: the domain reads none.
func ResultOf(req wire.Request, place uint64, d Decision, after *Activity, at time.Time) wire.Result {
	r := wire.Result{
		RequestID: req.RequestID, State: wire.StateDone, Op: req.Op,
		ActivityID: req.ActivityID, UserID: req.UserID, Outcome: d.Outcome,
		Seq: wire.SeqOf(place), Index: wire.IndexOf(place),
		AppliedAt: wire.Instant(at),
	}
	if d.Status != "" {
		s := d.Status
		r.Status = &s
	}
	if d.Position > 0 {
		p := d.Position
		r.Position = &p
	}
	if !d.HeldUntil.IsZero() {
		t := wire.Instant(d.HeldUntil)
		r.HeldUntil = &t
	}
	switch {
	case wire.SinglePromotion(req.Op):
		// A seat released by one user goes to one waiter at most.
		if len(d.PromotedUserIDs) > 0 {
			id := d.PromotedUserIDs[0]
			r.PromotedUserID = &id
		}
	case req.Op == wire.OpOpen:
		r.PromotedUserIDs = slices.Clone(d.PromotedUserIDs)
		if after != nil {
			c := after.Capacity
			r.Capacity = &c
			if d.Outcome == wire.OutcomeRejected && req.Capacity != nil {
				r.Reason = wire.CutReason("capacity " + strconv.FormatInt(*req.Capacity, 10) + " is below the " +
					strconv.FormatInt(after.Confirmed, 10) + " seats already taken")
			}
		}
	}
	return r
}

// VoidResult is the result a void (wire.OpVoid) records for a request id
// that had none before it in its partition's order: REJECTED, reason
// wire.ReasonNeverStored, changing nothing, applied at the instant at. A
// void of an id that has a result is a repeat and records nothing.
func VoidResult(req wire.Request, seq uint64, at time.Time) wire.Result {
	return wire.Result{
		RequestID: req.RequestID, State: wire.StateDone, Op: wire.OpVoid,
		ActivityID: 0, UserID: req.UserID, Outcome: wire.OutcomeRejected, Seq: seq,
		AppliedAt: wire.Instant(at), Reason: wire.CutReason(wire.ReasonNeverStored),
	}
}
