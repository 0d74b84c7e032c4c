// Package second is the audit's second opinion on allocation.Apply: the
// reference model (internal/allocation/refmodel), a second implementation
// of the domain sharing no code with allocation.Apply, decides each
// request the replay applies, and Check says when the two disagree. MySQL
// can match the replay and still be wrong when Apply itself is wrong, since
// the allocator runs the same code; this is what catches it. The audit
// (internal/audit) reports a disagreement as a divergence of kind
// reference.
package second

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/allocation/refmodel"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// Opinion is the reference model's state per activity. The zero value is
// ready: every activity starts unopened.
type Opinion struct {
	ref map[int64]*refmodel.Activity
}

// Disagreement is a request the reference model decides otherwise than
// allocation.Apply.
type Disagreement struct {
	// Expected is the reference's decision, Actual Apply's, each on one
	// line.
	Expected, Actual string
	// Why says what differs.
	Why string
}

// Seed makes the reference model's state of act's activity act's own (a
// checkpoint's): it judges every decision after it on its own.
func (o *Opinion) Seed(act *allocation.Activity) {
	if o.ref == nil {
		o.ref = make(map[int64]*refmodel.Activity)
	}
	o.ref[act.ID] = refOf(act)
}

// Check asks the reference model for its decision on req at place (its
// stream sequence and index in its batch, wire.Place: the same number
// allocation.Apply was given), which allocation.Apply, from act, answered
// with after, d and err. It returns
// nil when they agree, and the reference then moves on to its own state
// after the request. When they disagree the reference takes Apply's state
// for that activity, so one fault reads as one disagreement.
func (o *Opinion) Check(act *allocation.Activity, req allocation.Request, place uint64, after *allocation.Activity, d allocation.Decision, err error) *Disagreement {
	if o.ref == nil {
		o.ref = make(map[int64]*refmodel.Activity)
	}
	id := req.ActivityID
	rafter, rd, rerr := refmodel.Apply(o.ref[id], req, place)
	var why string
	switch {
	case (err != nil) != (rerr != nil):
		why = fmt.Sprintf("allocation.Apply error %v, reference error %v", err, rerr)
	case err != nil:
		return nil // both refuse the request
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
		o.ref[id] = rafter
		return nil
	}
	dis := &Disagreement{Expected: describeDecision(rd, rerr), Actual: describeDecision(d, err), Why: why}
	// Start again from Apply's state, so later requests are judged alone.
	o.ref[id] = nil
	if err == nil && after != nil {
		o.ref[id] = refOf(after)
	} else if act != nil {
		o.ref[id] = refOf(act)
	}
	return dis
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
		// As the audit prints an instant it expects.
		b.WriteString(" held_until " + d.HeldUntil.UTC().Format(time.RFC3339Nano))
	}
	if len(d.PromotedUserIDs) > 0 {
		fmt.Fprintf(&b, " promoted %v", d.PromotedUserIDs)
	}
	if len(d.Events) > 0 {
		b.WriteString(" events " + store.EncodeEvents(d.Events))
	}
	return b.String()
}
