package client

import "time"

// Op is the operation a request carries.
type Op string

// The operations.
const (
	OpOpen   Op = "open" // creates or resizes an activity
	OpJoin   Op = "join"
	OpCancel Op = "cancel"
	OpClaim  Op = "claim"
	// OpConfirm turns a seat held under an activity's hold into a
	// confirmed one (Client.Confirm).
	OpConfirm Op = "confirm"
	// OpExpire lapses a hold. Clients never send it: the allocator puts it
	// in the request stream when the hold ends; its results are readable.
	OpExpire Op = "expire"
	// OpVoid settles a request id whose write answered 503 with the id
	// (no PubAck in time) and that was never stored: its result is
	// REJECTED with Reason ReasonNeverStored. Clients never send it.
	OpVoid Op = "void"
)

// ReasonNeverStored is the Reason of a voided request id (OpVoid).
const ReasonNeverStored = "never stored"

// Outcome is the result of applying a request.
type Outcome string

// The outcomes, by op (see api/openapi.yaml, Outcome).
const (
	Opened           Outcome = "OPENED"            // open
	Resized          Outcome = "RESIZED"           // open, also when the capacity is unchanged
	Rejected         Outcome = "REJECTED"          // open below the confirmed count, or stored but refused when applied (see Result.Reason)
	Confirmed        Outcome = "CONFIRMED"         // join took a seat
	Waiting          Outcome = "WAITING"           // join joined the waitlist (Result.Position)
	AlreadyConfirmed Outcome = "ALREADY_CONFIRMED" // join: unchanged
	AlreadyWaiting   Outcome = "ALREADY_WAITING"   // join or claim: the user waits; unchanged
	Cancelled        Outcome = "CANCELLED"         // cancel (Result.PromotedUserID)
	NotSignedUp      Outcome = "NOT_SIGNED_UP"     // cancel: no live signup
	Granted          Outcome = "GRANTED"           // claim took a seat
	SoldOut          Outcome = "SOLD_OUT"          // claim: no seat left
	AlreadyOwned     Outcome = "ALREADY_OWNED"     // claim: the user holds a seat
	NoSuchActivity   Outcome = "NO_SUCH_ACTIVITY"  // any op: never opened
	// Holds (an activity opened with a hold).
	Held        Outcome = "HELD"         // join or claim took a seat under the hold (Result.HeldUntil)
	NotHeld     Outcome = "NOT_HELD"     // confirm or expire: the user holds no seat under a hold; unchanged
	HoldExpired Outcome = "HOLD_EXPIRED" // confirm received after held_until: the seat is released
	Expired     Outcome = "EXPIRED"      // expire: the hold lapsed, the seat is released
)

// Status is a signup's status.
type Status string

// The statuses.
const (
	StatusConfirmed Status = "CONFIRMED"
	StatusWaiting   Status = "WAITING"
	StatusCancelled Status = "CANCELLED"
	// StatusHeld is a seat taken under a hold, until SignupState.HeldUntil
	// unless confirmed.
	StatusHeld Status = "HELD"
)

// EventKind is the kind of an event, the last token of its subject
// alloc.evt.<activity>.<kind>.
type EventKind string

// The event kinds. Each change of one signup's status yields exactly one
// event; opened, resized and sold_out are about the activity.
const (
	EventOpened     EventKind = "opened"
	EventResized    EventKind = "resized"
	EventConfirmed  EventKind = "confirmed"
	EventWaitlisted EventKind = "waitlisted"
	EventGranted    EventKind = "granted"
	EventPromoted   EventKind = "promoted"
	EventCancelled  EventKind = "cancelled"
	EventSoldOut    EventKind = "sold_out"
	EventHeld       EventKind = "held"    // join or claim took a seat under a hold (Event.HeldUntil)
	EventExpired    EventKind = "expired" // a hold lapsed, or a confirm came too late
)

// Request states as a polling client sees them.
const (
	StatePending = "pending"
	StateDone    = "done"
)

// Ack is the answer to a write that is stored but not yet applied (HTTP
// 202), and the poll answer while it is pending.
type Ack struct {
	RequestID string `json:"request_id"`
	State     string `json:"state"`
}

// Result is a request's final, recorded result: the poll answer when
// State is done. It is also what the allocator publishes after a commit.
type Result struct {
	RequestID  string  `json:"request_id"`
	State      string  `json:"state"`
	Op         Op      `json:"op"`
	ActivityID int64   `json:"activity_id"`
	UserID     int64   `json:"user_id"` // 0 for open
	Outcome    Outcome `json:"outcome"`
	// Reason says why a request was REJECTED: the data MySQL refused, or
	// ReasonNeverStored for a void.
	Reason string `json:"reason,omitempty"`
	// Status is the user's signup status after the request; nil for open
	// and when the user has no signup.
	Status *Status `json:"status"`
	// Position is the 1-based place on the waitlist, for WAITING.
	Position *int64 `json:"position"`
	// PromotedUserID is the waiter a cancel promoted, if any.
	PromotedUserID *int64 `json:"promoted_user_id"`
	// PromotedUserIDs are the waiters a resize up promoted, in queue order.
	PromotedUserIDs []int64 `json:"promoted_user_ids,omitempty"`
	// Capacity is the capacity an open set.
	Capacity *int64 `json:"capacity,omitempty"`
	// HeldUntil is the end of the hold the request created (for the user,
	// or for the user it promoted) or, for a HELD user's repeat, of the
	// hold the user has.
	HeldUntil *time.Time `json:"held_until,omitempty"`
	// Seq is the stream sequence of the message that carries the request
	// in the request stream, and Index the request's 0-based index in that
	// message's batch (0 for a single request): the request's place,
	// (Seq, Index), orders as a pair and is the order in which it was
	// applied.
	Seq       uint64    `json:"seq"`
	Index     int       `json:"index"`
	AppliedAt time.Time `json:"applied_at"`
	// Shed marks a claim ingest answered at once from the allocator's view
	// of a full activity, exactly as the allocator would have.
	Shed bool `json:"shed,omitempty"`
}

// Done reports whether r is a final result rather than a pending state.
func (r *Result) Done() bool { return r.State == StateDone }

// Event is the message on alloc.evt.<activity>.<kind> (stream
// ALLOT_EVENTS), and the body the notifier POSTs to a webhook with
// Idempotency-Key set to EventID. Delivery is at least once: a receiver
// dedupes by EventID.
type Event struct {
	EventID    string    `json:"event_id"`
	Kind       EventKind `json:"kind"`
	ActivityID int64     `json:"activity_id"`
	UserID     int64     `json:"user_id"`    // 0 for opened, resized and sold_out
	RequestID  string    `json:"request_id"` // the request that caused it
	Seq        uint64    `json:"seq"`        // the stream sequence of that request's message
	Index      int       `json:"index"`      // that request's index in its message's batch (0 alone)
	At         time.Time `json:"at"`
	// HeldUntil is set on held and promoted events of a hold.
	HeldUntil *time.Time `json:"held_until,omitempty"`
}

// ActivityState is an activity's counters, read in one snapshot.
type ActivityState struct {
	ActivityID int64 `json:"activity_id"`
	Capacity   int64 `json:"capacity"`
	Confirmed  int64 `json:"confirmed"` // seats taken, held ones included
	Held       int64 `json:"held"`      // seats held, not yet confirmed
	Waiting    int64 `json:"waiting"`
	Remaining  int64 `json:"remaining"`
	// Hold is the activity's hold as a Go duration ("10m0s"), "" when it
	// has none.
	Hold string `json:"hold,omitempty"`
}

// SignupState is one user's signup in one activity.
type SignupState struct {
	ActivityID int64  `json:"activity_id"`
	UserID     int64  `json:"user_id"`
	Status     Status `json:"status"`
	// Position is the 1-based place on the waitlist while WAITING.
	Position *int64 `json:"position"`
	// HeldUntil is when a HELD seat is released unless confirmed.
	HeldUntil *time.Time `json:"held_until,omitempty"`
}
