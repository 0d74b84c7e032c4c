package audit

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/allocation/refmodel"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// KindReference: the reference model (internal/allocation/refmodel), a
// second implementation of the domain sharing no code with
// allocation.Apply, decides a request otherwise than allocation.Apply does.
// MySQL can match the replay and still be wrong when Apply itself is wrong,
// since the allocator runs the same code; this kind is the audit's second
// opinion on Apply. Expected is the reference's decision, Actual Apply's.
const KindReference Kind = "reference"

// domainApply is the code under audit. Tests of the second opinion replace
// it with a wrong Apply; nothing else does.
var domainApply = allocation.Apply

// decide applies req at seq to act through allocation.Apply, exactly as the
// allocator does, and asks the reference model for its decision on the same
// request. A disagreement is reported as KindReference (when seq is in the
// window) and the reference then takes Apply's state for that activity, so
// one fault reads as one divergence. The replay always follows Apply.
func (a *auditor) decide(act *allocation.Activity, req allocation.Request, seq uint64, requestID string) (*allocation.Activity, allocation.Decision, error) {
	after, d, err := domainApply(act, req, seq)
	if a.ref == nil {
		a.ref = make(map[int64]*refmodel.Activity)
	}
	id := req.ActivityID
	rafter, rd, rerr := refmodel.Apply(a.ref[id], req, seq)
	var why string
	switch {
	case (err != nil) != (rerr != nil):
		why = fmt.Sprintf("allocation.Apply error %v, reference error %v", err, rerr)
	case err != nil:
		return after, d, err // both refuse the request
	case (after == nil) != (rafter == nil):
		why = "one of them has no activity after the request"
	case !sameDecision(d, rd):
		why = "the decisions differ"
	case after != nil && (after.Capacity != rafter.Capacity || after.Confirmed != rafter.Confirmed || after.NextSeq != rafter.NextSeq ||
		after.Held != rafter.Held || after.Hold != rafter.Hold):
		// The counters only: comparing every live signup after every
		// request would cost a copy of the waitlist each time. A signup
		// that differs shows in a later decision (a position, a promotion,
		// a hold's end).
		why = fmt.Sprintf("the states after differ: capacity/confirmed/next_seq/held/hold %d/%d/%d/%d/%s and %d/%d/%d/%d/%s",
			rafter.Capacity, rafter.Confirmed, rafter.NextSeq, rafter.Held, rafter.Hold,
			after.Capacity, after.Confirmed, after.NextSeq, after.Held, after.Hold)
	}
	if why == "" {
		a.ref[id] = rafter
		return after, d, err
	}
	if a.inWindow(seq) {
		a.diverge(Divergence{
			Seq: seq, RequestID: requestID, Kind: KindReference, ActivityID: req.ActivityID, UserID: req.UserID,
			Expected: describeDecision(rd, rerr), Actual: describeDecision(d, err),
			Detail: "the reference model and allocation.Apply disagree (" + why + "); the replay follows allocation.Apply",
		})
	}
	// Start again from Apply's state, so later requests are judged alone.
	a.ref[id] = nil
	if err == nil && after != nil {
		a.ref[id] = refOf(after)
	} else if act != nil {
		a.ref[id] = refOf(act)
	}
	return after, d, err
}

// refOf is the reference model's copy of act's state.
func refOf(act *allocation.Activity) *refmodel.Activity {
	return &refmodel.Activity{ID: act.ID, Capacity: act.Capacity, Confirmed: act.Confirmed, Held: act.Held,
		Hold: act.Hold, NextSeq: act.NextSeq, Live: act.Live()}
}

// sameDecision compares two decisions, treating empty and nil lists alike.
func sameDecision(x, y allocation.Decision) bool {
	return x.Outcome == y.Outcome && x.Status == y.Status && x.Position == y.Position && x.Changes == y.Changes &&
		x.HeldUntil.Equal(y.HeldUntil) && slicesEqual(x.Events, y.Events) && slicesEqual(x.Changed, y.Changed) &&
		slicesEqual(x.PromotedUserIDs, y.PromotedUserIDs)
}

func slicesEqual[T any](x, y []T) bool {
	if len(x) == 0 && len(y) == 0 {
		return true
	}
	return reflect.DeepEqual(x, y)
}

// describeDecision is a decision on one line, for a divergence.
func describeDecision(d allocation.Decision, err error) string {
	if err != nil {
		if errors.Is(err, allocation.ErrInvalidRequest) || errors.Is(err, refmodel.ErrInvalid) {
			return "invalid request"
		}
		return "error: " + err.Error()
	}
	var b strings.Builder
	b.WriteString(string(d.Outcome))
	if d.Status != "" {
		b.WriteString(" status " + string(d.Status))
	}
	if d.Status == wire.StatusWaiting {
		fmt.Fprintf(&b, " position %d", d.Position)
	}
	if !d.HeldUntil.IsZero() {
		b.WriteString(" held_until " + timeOrNull(d.HeldUntil))
	}
	if len(d.PromotedUserIDs) > 0 {
		fmt.Fprintf(&b, " promoted %v", d.PromotedUserIDs)
	}
	if len(d.Events) > 0 {
		b.WriteString(" events " + store.EncodeEvents(d.Events))
	}
	return b.String()
}
