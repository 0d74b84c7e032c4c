package allocation

import "github.com/allot-dev/allot/internal/wire"

// A claim on a full activity is decided by the claimant's seat alone, and
// changes nothing: this is the rule that lets ingest shed a claim from a
// view (internal/ingest/shed), and it is written once, here.
// Apply's claim decides with it, the allocator's views are built so that
// it can decide from them (Viewed, ViewOf), and ingest decides from a view
// with it (ViewSeats), building the answer with ResultOf like the
// allocator does.

// ClaimOnFull decides a claim on an activity whose capacity seats are all
// taken (confirmed >= capacity), by a user whose live signup is seat (found
// false: none): a holder, CONFIRMED or HELD, is ALREADY_OWNED with the
// seat's status (and, for a HELD seat, the end of its hold); anyone else
// is SOLD_OUT. decided is false when the claim needs more than that: a
// seat is free (the claim may be granted), or the user waits (the answer
// carries the user's place on the waitlist), or the seat is not one a claim
// can be answered on (a HELD seat without the end of its hold).
func ClaimOnFull(capacity, confirmed int64, seat Signup, found bool) (d Decision, decided bool) {
	if confirmed < capacity {
		return Decision{}, false
	}
	if !found {
		return Decision{Outcome: wire.OutcomeSoldOut}, true
	}
	switch seat.Status {
	case wire.StatusConfirmed:
		return Decision{Outcome: wire.OutcomeAlreadyOwned, Status: wire.StatusConfirmed}, true
	case wire.StatusHeld:
		if seat.HeldUntil.IsZero() {
			return Decision{}, false
		}
		return Decision{Outcome: wire.OutcomeAlreadyOwned, Status: wire.StatusHeld, HeldUntil: seat.HeldUntil}, true
	}
	return Decision{}, false
}

// Viewed reports whether a gets a view (wire.View): when ClaimOnFull
// decides a claim on it by anyone without a seat, and nobody waits, so
// that a user a view does not list has no signup.
func Viewed(a *Activity) bool {
	if a == nil || a.Waiting() > 0 {
		return false
	}
	_, decided := ClaimOnFull(a.Capacity, a.Confirmed, Signup{}, false)
	return decided
}

// ViewOf is the view of a Viewed activity: its counters, the sequence its
// state covers and, unless it has more than wire.MaxViewHolders seats
// taken, every holder, so that ViewSeats can decide a claim from it.
func ViewOf(a *Activity) wire.View {
	v := wire.View{ActivityID: a.ID, Capacity: a.Capacity, Confirmed: a.Confirmed,
		Seq: wire.SeqOf(a.NextSeq - 1), Index: wire.IndexOf(a.NextSeq - 1)}
	if a.Confirmed > wire.MaxViewHolders {
		return v
	}
	// A claim by a HELD user is answered ALREADY_OWNED with status HELD
	// and held_until, so the HELD users are listed apart, with their
	// holds' ends, in a view an ingest without holds does not shed from.
	v.Holders = make([]int64, 0, a.Confirmed-a.Held)
	for _, s := range a.Live() {
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

// ViewSeats is what a claim on v's activity is decided from: every seat
// holder's signup (status and hold's end), by user, for ClaimOnFull. ok is
// false when v decides no claim: not every holder is listed (a view over
// wire.MaxViewHolders seats, or a cleared one), a seat is free, or a
// listed seat is one ClaimOnFull cannot answer on.
func ViewSeats(v wire.View) (seats map[int64]Signup, ok bool) {
	if !ViewDecides(v) {
		return nil, false
	}
	seats = make(map[int64]Signup, len(v.Holders)+len(v.Held))
	for _, u := range v.Holders {
		seats[u] = Signup{UserID: u, Status: wire.StatusConfirmed}
	}
	for _, h := range v.Held {
		seats[h.UserID] = Signup{UserID: h.UserID, Status: wire.StatusHeld, HeldUntil: h.HeldUntil.UTC()}
	}
	return seats, true
}

// ViewDecides reports whether v decides every claim on its activity, as
// ViewSeats' ok, without building the seats.
func ViewDecides(v wire.View) bool {
	if !v.Complete && !v.HoldsListed {
		return false
	}
	if _, decided := ClaimOnFull(v.Capacity, v.Confirmed, Signup{}, false); !decided {
		return false
	}
	for _, h := range v.Held {
		seat := Signup{UserID: h.UserID, Status: wire.StatusHeld, HeldUntil: h.HeldUntil}
		if _, decided := ClaimOnFull(v.Capacity, v.Confirmed, seat, true); !decided {
			// Not a hold the allocator could have given.
			return false
		}
	}
	return true
}
