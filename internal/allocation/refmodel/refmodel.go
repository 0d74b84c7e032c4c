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
	"time"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/wire"
)

// ErrInvalid is returned by Apply for a request no valid stream can hold;
// allocation.Apply returns allocation.ErrInvalidRequest for the same ones.
var ErrInvalid = errors.New("refmodel: invalid request")

// Activity is the reference state of one activity.
type Activity struct {
	ID, Capacity int64
	// Confirmed counts the seats taken (CONFIRMED and HELD), Held the HELD
	// ones.
	Confirmed, Held int64
	// Hold is how long a seat taken from now on is held (0: none).
	Hold    time.Duration
	NextSeq uint64
	// Live holds the CONFIRMED, HELD and WAITING signups in queue_seq order.
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

// heldUntil is the end of a hold created by a request received at: at
// plus the activity's hold, cut to whole microseconds (what MySQL keeps),
// and never the Unix epoch itself, which stands for "no hold".
func (r *Activity) heldUntil(at time.Time) time.Time {
	end := at.Add(r.Hold).Truncate(time.Microsecond)
	if end.Equal(time.Unix(0, 0)) {
		end = end.Add(time.Microsecond)
	}
	return time.Unix(end.Unix(), int64(end.Nanosecond())).UTC()
}

// seat makes s a taken seat: held from the request received at (stream
// sequence seq) when the activity has a hold, confirmed otherwise.
func (r *Activity) seat(s *allocation.Signup, at time.Time, seq uint64) {
	r.Confirmed++
	if r.Hold == 0 {
		s.Status, s.HeldUntil, s.HoldSeq = wire.StatusConfirmed, time.Time{}, 0
		return
	}
	r.Held++
	s.Status, s.HeldUntil, s.HoldSeq = wire.StatusHeld, r.heldUntil(at), seq
}

func (r *Activity) promote(d *allocation.Decision, req allocation.Request, seq uint64) {
	i := r.firstWaiter()
	r.seat(&r.Live[i], req.ReceivedAt, seq)
	s := r.Live[i]
	if s.Status == wire.StatusHeld {
		d.HeldUntil = s.HeldUntil
	}
	d.PromotedUserIDs = append(d.PromotedUserIDs, s.UserID)
	d.Events = append(d.Events, allocation.Event{Kind: wire.EventPromoted, UserID: s.UserID, HeldUntil: s.HeldUntil})
	d.Changed = append(d.Changed, s)
}

// remove ends the live signup at i for a request: the row becomes
// CANCELLED with an event of kind, and a seat it freed goes to the first
// waiter.
func (r *Activity) remove(d *allocation.Decision, i int, kind wire.EventKind, req allocation.Request, seq uint64) {
	s := r.Live[i]
	r.Live = append(r.Live[:i], r.Live[i+1:]...)
	d.Status = wire.StatusCancelled
	d.Changes = true
	d.Events = append(d.Events, allocation.Event{Kind: kind, UserID: s.UserID})
	d.Changed = append(d.Changed, allocation.Signup{UserID: s.UserID, Status: wire.StatusCancelled, QueueSeq: s.QueueSeq})
	if s.Status == wire.StatusWaiting {
		return
	}
	r.Confirmed--
	if s.Status == wire.StatusHeld {
		r.Held--
	}
	if r.firstWaiter() >= 0 {
		r.promote(d, req, seq)
	}
}

// as is a decision that changes nothing: outcome, and the user's signup as
// it stands (status, position, the end of a hold).
func (r *Activity) as(outcome wire.Outcome, i int) allocation.Decision {
	d := allocation.Decision{Outcome: outcome}
	if i < 0 {
		return d
	}
	s := r.Live[i]
	d.Status = s.Status
	switch s.Status {
	case wire.StatusWaiting:
		d.Position = r.position(s.UserID)
	case wire.StatusHeld:
		d.HeldUntil = s.HeldUntil
	}
	return d
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
		valid = valid && req.UserID == 0 && req.Capacity >= 0 && req.Capacity <= wire.MaxCapacity &&
			req.Hold >= 0 && req.Hold <= wire.MaxHold
	case wire.OpJoin, wire.OpCancel, wire.OpClaim, wire.OpConfirm:
		valid = valid && req.UserID > 0
	case wire.OpExpire:
		valid = valid && req.UserID > 0 && req.HoldSeq > 0 && req.HoldSeq < seq
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
		return &Activity{ID: req.ActivityID, Capacity: req.Capacity, Hold: req.Hold, NextSeq: seq + 1},
			allocation.Decision{Outcome: wire.OutcomeOpened, Events: []allocation.Event{{Kind: wire.EventOpened}}, Changes: true}, nil
	}
	r.NextSeq = seq + 1
	var d allocation.Decision
	u := req.UserID
	i := -1
	var st wire.Status
	if req.Op != wire.OpOpen {
		if i = r.find(u); i >= 0 {
			st = r.Live[i].Status
		}
	}
	switch {
	case req.Op == wire.OpOpen && req.Capacity < r.Confirmed:
		d.Outcome = wire.OutcomeRejected
	case req.Op == wire.OpOpen && req.Capacity == r.Capacity && req.Hold == r.Hold:
		d.Outcome = wire.OutcomeResized
	case req.Op == wire.OpOpen:
		d = allocation.Decision{Outcome: wire.OutcomeResized, Changes: true, Events: []allocation.Event{{Kind: wire.EventResized}}}
		r.Capacity, r.Hold = req.Capacity, req.Hold
		n := 0
		for r.Confirmed < r.Capacity && r.firstWaiter() >= 0 {
			r.promote(&d, req, seq)
			n++
		}
		if n > 0 && r.Confirmed == r.Capacity {
			d.Events = append(d.Events, allocation.Event{Kind: wire.EventSoldOut})
		}

	case req.Op == wire.OpConfirm && (st == "" || st == wire.StatusWaiting):
		d = r.as(wire.OutcomeNotHeld, i)
	case req.Op == wire.OpConfirm && st == wire.StatusConfirmed:
		d = r.as(wire.OutcomeAlreadyConfirmed, i)
	case req.Op == wire.OpConfirm && req.ReceivedAt.After(r.Live[i].HeldUntil):
		d.Outcome = wire.OutcomeHoldExpired
		r.remove(&d, i, wire.EventExpired, req, seq)
	case req.Op == wire.OpConfirm:
		r.Held--
		s := &r.Live[i]
		s.Status, s.HeldUntil, s.HoldSeq = wire.StatusConfirmed, time.Time{}, 0
		d = allocation.Decision{Outcome: wire.OutcomeConfirmed, Status: wire.StatusConfirmed, Changes: true,
			Events: []allocation.Event{{Kind: wire.EventConfirmed, UserID: u}}, Changed: []allocation.Signup{*s}}

	case req.Op == wire.OpExpire:
		if st != wire.StatusHeld || r.Live[i].HoldSeq != req.HoldSeq || req.ReceivedAt.Before(r.Live[i].HeldUntil) {
			d = r.as(wire.OutcomeNotHeld, i)
			break
		}
		d.Outcome = wire.OutcomeExpired
		r.remove(&d, i, wire.EventExpired, req, seq)

	case st == wire.StatusWaiting && req.Op != wire.OpCancel:
		d = r.as(wire.OutcomeAlreadyWaiting, i)
	case i >= 0 && req.Op == wire.OpJoin:
		d = r.as(wire.OutcomeAlreadyConfirmed, i)
	case i >= 0 && req.Op == wire.OpClaim:
		d = r.as(wire.OutcomeAlreadyOwned, i)
	case i >= 0: // cancel
		d.Outcome = wire.OutcomeCancelled
		r.remove(&d, i, wire.EventCancelled, req, seq)
	case req.Op == wire.OpCancel:
		d.Outcome = wire.OutcomeNotSignedUp
	case r.Confirmed < r.Capacity: // join or claim takes a seat
		kind, outcome := wire.EventConfirmed, wire.OutcomeConfirmed
		if req.Op == wire.OpClaim {
			kind, outcome = wire.EventGranted, wire.OutcomeGranted
		}
		s := allocation.Signup{UserID: u, QueueSeq: seq}
		r.seat(&s, req.ReceivedAt, seq)
		if s.Status == wire.StatusHeld {
			kind, outcome = wire.EventHeld, wire.OutcomeHeld
			d.HeldUntil = s.HeldUntil
		}
		r.Live = append(r.Live, s)
		d.Outcome, d.Status, d.Changes = outcome, s.Status, true
		d.Events = []allocation.Event{{Kind: kind, UserID: u, HeldUntil: s.HeldUntil}}
		d.Changed = []allocation.Signup{s}
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
