package audit

import (
	"github.com/allot-dev/allot/internal/allocation"
)

// KindReference: the reference model (internal/allocation/refmodel), a
// second implementation of the domain sharing no code with
// allocation.Apply, decides a request otherwise than allocation.Apply does.
// MySQL can match the replay and still be wrong when Apply itself is wrong,
// since the allocator runs the same code; this kind is the audit's second
// opinion on Apply (internal/audit/second). Expected is the reference's
// decision, Actual Apply's.
const KindReference Kind = "reference"

// decide applies req at place (wire.Place) to act through
// allocation.Apply, exactly as the allocator does, and asks the second
// opinion for its decision on the same request at the same place. A
// disagreement is reported as KindReference (when place is in the window).
// The replay always follows Apply.
func (a *auditor) decide(act *allocation.Activity, req allocation.Request, place uint64, requestID string) (*allocation.Activity, allocation.Decision, error) {
	after, d, err := a.run.apply(act, req, place)
	if dis := a.ref.Check(act, req, place, after, d, err); dis != nil && a.inWindow(place) {
		a.diverge(at(place, Divergence{
			RequestID: requestID, Kind: KindReference, ActivityID: req.ActivityID, UserID: req.UserID,
			Expected: dis.Expected, Actual: dis.Actual,
			Detail: "the reference model and allocation.Apply disagree (" + dis.Why + "); the replay follows allocation.Apply",
		}))
	}
	return after, d, err
}
