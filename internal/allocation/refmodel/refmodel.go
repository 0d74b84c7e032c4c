// Package refmodel is a naive second implementation of the allocation
// domain: the live signups of an activity in a slice ordered by queue_seq,
// every question answered by a linear scan. It shares only the data types
// with internal/allocation, none of its code, so agreeing with it means
// something. The fuzz test of internal/allocation checks Apply against it
// step by step, and the audit replays the request stream through both and
// reports any disagreement, so that a clean audit proves more than "MySQL
// matches the code the allocator runs".
package refmodel

import (
	"errors"
	"math"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/wire"
)

// ErrInvalid is returned by Apply for a request no valid stream can hold;
// allocation.Apply returns allocation.ErrInvalidRequest for the same ones.
var ErrInvalid = errors.New("refmodel: invalid request")

// Activity is the reference state of one activity.
type Activity struct {
	ID, Capacity, Confirmed int64
	NextSeq                 uint64
	// Live holds the CONFIRMED and WAITING signups in queue_seq order.
	Live []allocation.Signup
}

func (r *Activity) find(user int64) int {
	for i, s := range r.Live {
		if s.UserID == user {
			return i
		}
	}
	return -1
}

func (r *Activity) position(user int64) int64 {
	var n int64
	for _, s := range r.Live {
		if s.Status == wire.StatusWaiting {
			n++
			if s.UserID == user {
				return n
			}
		}
	}
	return 0
}

func (r *Activity) firstWaiter() int {
	for i, s := range r.Live {
		if s.Status == wire.StatusWaiting {
			return i
		}
	}
	return -1
}

func (r *Activity) promote(d *allocation.Decision) {
	i := r.firstWaiter()
	r.Live[i].Status = wire.StatusConfirmed
	r.Confirmed++
	d.PromotedUserIDs = append(d.PromotedUserIDs, r.Live[i].UserID)
	d.Events = append(d.Events, allocation.Event{Kind: wire.EventPromoted, UserID: r.Live[i].UserID})
	d.Changed = append(d.Changed, r.Live[i])
}

// Clone returns a deep copy of r (nil for nil).
func (r *Activity) Clone() *Activity {
	if r == nil {
		return nil
	}
	c := *r
	c.Live = append([]allocation.Signup(nil), r.Live...)
	return &c
}

// Apply decides req at stream sequence seq against r (nil when the
// activity was never opened) and mutates r in place, with the contract of
// allocation.Apply: it returns the activity after the request and the
// decision, or r unchanged and ErrInvalid.
func Apply(r *Activity, req allocation.Request, seq uint64) (*Activity, allocation.Decision, error) {
	valid := seq != 0 && seq != math.MaxUint64 && req.ActivityID > 0
	switch req.Op {
	case wire.OpOpen:
		valid = valid && req.UserID == 0 && req.Capacity >= 0 && req.Capacity <= wire.MaxCapacity
	case wire.OpJoin, wire.OpCancel, wire.OpClaim:
		valid = valid && req.UserID > 0
	default:
		valid = false
	}
	if r != nil {
		valid = valid && req.ActivityID == r.ID && seq >= r.NextSeq
	}
	if !valid {
		return r, allocation.Decision{}, ErrInvalid
	}
	if r == nil {
		if req.Op != wire.OpOpen {
			return nil, allocation.Decision{Outcome: wire.OutcomeNoSuchActivity}, nil
		}
		return &Activity{ID: req.ActivityID, Capacity: req.Capacity, NextSeq: seq + 1},
			allocation.Decision{Outcome: wire.OutcomeOpened, Events: []allocation.Event{{Kind: wire.EventOpened}}, Changes: true}, nil
	}
	r.NextSeq = seq + 1
	var d allocation.Decision
	u := req.UserID
	i := -1
	if req.Op != wire.OpOpen {
		i = r.find(u)
	}
	switch {
	case req.Op == wire.OpOpen && req.Capacity < r.Confirmed:
		d.Outcome = wire.OutcomeRejected
	case req.Op == wire.OpOpen && req.Capacity == r.Capacity:
		d.Outcome = wire.OutcomeResized
	case req.Op == wire.OpOpen:
		d = allocation.Decision{Outcome: wire.OutcomeResized, Changes: true, Events: []allocation.Event{{Kind: wire.EventResized}}}
		r.Capacity = req.Capacity
		n := 0
		for r.Confirmed < r.Capacity && r.firstWaiter() >= 0 {
			r.promote(&d)
			n++
		}
		if n > 0 && r.Confirmed == r.Capacity {
			d.Events = append(d.Events, allocation.Event{Kind: wire.EventSoldOut})
		}
	case i >= 0 && r.Live[i].Status == wire.StatusWaiting && req.Op != wire.OpCancel:
		d = allocation.Decision{Outcome: wire.OutcomeAlreadyWaiting, Status: wire.StatusWaiting, Position: r.position(u)}
	case i >= 0 && req.Op == wire.OpJoin:
		d = allocation.Decision{Outcome: wire.OutcomeAlreadyConfirmed, Status: wire.StatusConfirmed}
	case i >= 0 && req.Op == wire.OpClaim:
		d = allocation.Decision{Outcome: wire.OutcomeAlreadyOwned, Status: wire.StatusConfirmed}
	case i >= 0: // cancel
		s := r.Live[i]
		r.Live = append(r.Live[:i], r.Live[i+1:]...)
		wasConfirmed := s.Status == wire.StatusConfirmed
		s.Status = wire.StatusCancelled
		d = allocation.Decision{Outcome: wire.OutcomeCancelled, Status: wire.StatusCancelled, Changes: true,
			Events: []allocation.Event{{Kind: wire.EventCancelled, UserID: u}}, Changed: []allocation.Signup{s}}
		if wasConfirmed {
			r.Confirmed--
			if r.firstWaiter() >= 0 {
				r.promote(&d)
			}
		}
	case req.Op == wire.OpCancel:
		d.Outcome = wire.OutcomeNotSignedUp
	case r.Confirmed < r.Capacity: // join or claim takes a seat
		kind, outcome := wire.EventConfirmed, wire.OutcomeConfirmed
		if req.Op == wire.OpClaim {
			kind, outcome = wire.EventGranted, wire.OutcomeGranted
		}
		s := allocation.Signup{UserID: u, Status: wire.StatusConfirmed, QueueSeq: seq}
		r.Live = append(r.Live, s)
		r.Confirmed++
		d = allocation.Decision{Outcome: outcome, Status: wire.StatusConfirmed, Changes: true,
			Events: []allocation.Event{{Kind: kind, UserID: u}}, Changed: []allocation.Signup{s}}
		if r.Confirmed == r.Capacity {
			d.Events = append(d.Events, allocation.Event{Kind: wire.EventSoldOut})
		}
	case req.Op == wire.OpClaim:
		d.Outcome = wire.OutcomeSoldOut
	default: // join waits
		s := allocation.Signup{UserID: u, Status: wire.StatusWaiting, QueueSeq: seq}
		r.Live = append(r.Live, s)
		d = allocation.Decision{Outcome: wire.OutcomeWaiting, Status: wire.StatusWaiting, Position: r.position(u),
			Changes: true, Events: []allocation.Event{{Kind: wire.EventWaitlisted, UserID: u}}, Changed: []allocation.Signup{s}}
	}
	return r, d, nil
}
