// Package wire is the contract between processes, in code: the JSON shapes of requests, results
// and events, the operation and outcome words, and the NATS subject names.
// Everything that crosses a process boundary is defined here and nowhere else.
package wire

import (
	"strconv"
	"time"

	"github.com/google/uuid"
)

// Stream and subject names.
const (
	RequestStream = "ALLOT_REQUESTS"
	EventStream   = "ALLOT_EVENTS"

	RequestSubjectPrefix = "alloc.req."
	EventSubjectPrefix   = "alloc.evt."

	// ResultSubject carries, after each commit, the results of the requests
	// the commit applied. It is core NATS (at most once): it only wakes up
	// waiting HTTP handlers, which fall back to MySQL.
	ResultSubject = "allot.results"
)

// RequestSubject is the subject a request for activity is published on.
func RequestSubject(activity int64) string {
	return RequestSubjectPrefix + strconv.FormatInt(activity, 10)
}

// EventSubject is the subject an event of kind for activity is published on.
func EventSubject(activity int64, kind EventKind) string {
	return EventSubjectPrefix + strconv.FormatInt(activity, 10) + "." + string(kind)
}

// Op is an operation a request carries.
type Op string

// Operations a request can carry.
const (
	OpOpen   Op = "open"
	OpJoin   Op = "join"
	OpCancel Op = "cancel"
	OpClaim  Op = "claim"
	// OpConfirm turns a hold into a confirmed seat.
	OpConfirm Op = "confirm"
	// OpExpire lapses a hold; never sent by clients: the allocator's outbox
	// relay schedules it in ALLOT_HOLDS when the hold is committed (see
	// hold.go).
	OpExpire Op = "expire"
	// OpVoid settles a request id whose write got no PubAck and that may
	// never have been stored; never sent by clients: ingest publishes it
	// (void.go).
	OpVoid Op = "void"
)

// Outcome is what applying a request decided.
type Outcome string

// Outcomes of applying a request.
const (
	OutcomeOpened           Outcome = "OPENED"
	OutcomeResized          Outcome = "RESIZED"
	OutcomeRejected         Outcome = "REJECTED"
	OutcomeConfirmed        Outcome = "CONFIRMED"
	OutcomeWaiting          Outcome = "WAITING"
	OutcomeAlreadyConfirmed Outcome = "ALREADY_CONFIRMED"
	OutcomeAlreadyWaiting   Outcome = "ALREADY_WAITING"
	OutcomeCancelled        Outcome = "CANCELLED"
	OutcomeNotSignedUp      Outcome = "NOT_SIGNED_UP"
	OutcomeGranted          Outcome = "GRANTED"
	OutcomeSoldOut          Outcome = "SOLD_OUT"
	OutcomeAlreadyOwned     Outcome = "ALREADY_OWNED"
	OutcomeNoSuchActivity   Outcome = "NO_SUCH_ACTIVITY"
	OutcomeHeld             Outcome = "HELD"
	OutcomeNotHeld          Outcome = "NOT_HELD"
	OutcomeHoldExpired      Outcome = "HOLD_EXPIRED"
	OutcomeExpired          Outcome = "EXPIRED"
)

// Status is a signup's status, as stored in activity_signup.status.
type Status string

// Signup statuses.
const (
	StatusConfirmed Status = "CONFIRMED"
	StatusWaiting   Status = "WAITING"
	StatusCancelled Status = "CANCELLED"
	// StatusHeld is a seat taken under a hold, not yet confirmed.
	StatusHeld Status = "HELD"
)

// EventKind is the kind of an event, the last token of its subject.
type EventKind string

// Event kinds.
const (
	EventOpened     EventKind = "opened"
	EventResized    EventKind = "resized"
	EventConfirmed  EventKind = "confirmed"
	EventWaitlisted EventKind = "waitlisted"
	EventGranted    EventKind = "granted"
	EventPromoted   EventKind = "promoted"
	EventCancelled  EventKind = "cancelled"
	EventSoldOut    EventKind = "sold_out"
	EventHeld       EventKind = "held"
	EventExpired    EventKind = "expired"
)

// Limits on input, shared by ingest (validation) and the allocator (defence).
const (
	MaxCapacity          = 10_000_000
	MaxIdempotencyKeyLen = 255
	// MaxHold bounds an activity's hold.
	MaxHold = 168 * time.Hour
)

// Request is the message published on alloc.req.<activity>.
type Request struct {
	RequestID  string `json:"request_id"`
	Op         Op     `json:"op"`
	ActivityID int64  `json:"activity_id"`
	UserID     int64  `json:"user_id"`
	Capacity   *int64 `json:"capacity,omitempty"`
	// Hold is an open's hold (0: none), a Go duration in JSON.
	Hold Duration `json:"hold,omitempty"`
	// HoldSeq and HoldIndex name the hold an expire lapses: the place
	// (stream sequence, index in its batch) of the request that created
	// it (HoldPlace).
	HoldSeq        uint64    `json:"hold_seq,omitempty"`
	HoldIndex      int       `json:"hold_index,omitempty"`
	IdempotencyKey string    `json:"idempotency_key,omitempty"`
	ReceivedAt     time.Time `json:"received_at"`
}

// HoldPlace is the place of the hold an expire names.
func (r Request) HoldPlace() uint64 { return Place(r.HoldSeq, r.HoldIndex) }

// PlaceOf is the place of the request a result answers.
func (r Result) PlaceOf() uint64 { return Place(r.Seq, r.Index) }

// Result is a request's final, recorded result: the poll answer when done.
// It has one shape on the result subject, in MySQL and in an answer (see
// result.go).
type Result struct {
	RequestID  string  `json:"request_id"`
	State      string  `json:"state"`
	Op         Op      `json:"op"`
	ActivityID int64   `json:"activity_id"`
	UserID     int64   `json:"user_id"`
	Outcome    Outcome `json:"outcome"`
	Status     *Status `json:"status"`
	Position   *int64  `json:"position"`
	// PromotedUserID is the waiter a cancel, confirm or expire promoted;
	// PromotedUserIDs the waiters an open promoted, in queue order. A
	// result uses the one its op names (SinglePromotion), never both.
	PromotedUserID  *int64  `json:"promoted_user_id"`
	PromotedUserIDs []int64 `json:"promoted_user_ids,omitempty"`
	Capacity        *int64  `json:"capacity,omitempty"`
	// HeldUntil is the end of the hold this request created (the user's,
	// or the promoted user's) or, for a held user's repeat, of the hold
	// the user has.
	HeldUntil *time.Time `json:"held_until,omitempty"`
	// Seq and Index are the request's place: the stream sequence of the
	// message that carried it and its index in that message's batch (0
	// for a single request).
	Seq   uint64 `json:"seq"`
	Index int    `json:"index"`
	// AppliedAt is an Instant: UTC, whole microseconds.
	AppliedAt time.Time `json:"applied_at"`
	// Reason says why a REJECTED request changed nothing (CutReason).
	Reason string `json:"reason,omitempty"`
	// Shed marks a claim that ingest answered before the allocator applied
	// it, because the answer was already decided at the claim's place in
	// the stream. The claim is stored and applied like any other; its
	// recorded result is the same, and applied_at there is the allocator's.
	Shed bool `json:"shed,omitempty"`
}

// Request states as seen by a polling client.
const (
	StatePending = "pending"
	StateDone    = "done"
)

// Ack is the body of a 202: the request is durably stored and pending.
type Ack struct {
	RequestID string `json:"request_id"`
	State     string `json:"state"`
}

// Event is the message published on alloc.evt.<activity>.<kind>.
type Event struct {
	EventID    string    `json:"event_id"`
	Kind       EventKind `json:"kind"`
	ActivityID int64     `json:"activity_id"`
	UserID     int64     `json:"user_id"`
	RequestID  string    `json:"request_id"`
	// Seq and Index are the place of the request that caused the event.
	Seq   uint64    `json:"seq"`
	Index int       `json:"index"`
	At    time.Time `json:"at"`
	// HeldUntil is set on held and promoted events of a hold.
	HeldUntil *time.Time `json:"held_until,omitempty"`
}

// ResultBatch is the payload of ResultSubject: the results a commit
// recorded, or the views it changed (sent first, so that ingest never
// answers from a view older than a result it has already given out).
type ResultBatch struct {
	Results []Result `json:"results,omitempty"`
	Views   []View   `json:"views,omitempty"`
}

// eventNamespace roots the deterministic event ids.
var eventNamespace = uuid.MustParse("6f1c3e5a-2b0d-4c8e-9a57-3d2e1f0b9c44")

// EventID is the id of the index-th event caused by request requestID. It is
// derived, not drawn, so an event relayed again after a crash carries the
// same id and is dropped by the stream's duplicate window and by consumers
// that dedupe by event_id.
func EventID(requestID string, index int) string {
	return uuid.NewSHA1(eventNamespace, []byte(requestID+"/"+strconv.Itoa(index))).String()
}

// ViewBucket is the JetStream KV bucket where the allocator keeps a view of
// every full activity without waiters, so that ingest can answer a claim for
// it at once.
const ViewBucket = "ALLOT_VIEW"

// MaxViewHolders bounds the holders a view lists; a full activity with more
// live signups is published without them (Complete false) and not shed.
// Whether a view decides a claim, and what it answers, is
// allocation.ViewDecides and allocation.ClaimOnFull.
const MaxViewHolders = 10_000

// ViewKey is the key of activity's view in ViewBucket.
func ViewKey(activity int64) string { return "a." + strconv.FormatInt(activity, 10) }

// View is the value of a full activity's key: its counters and, when
// Complete or HoldsListed, every user holding a seat (HELD ones apart, with
// the ends of their holds), which is all a claim's decision needs
// while nobody waits. An activity with waiters has no view: its waitlist
// changes with every join, and claims on it are rare.
type View struct {
	ActivityID int64 `json:"activity_id"`
	Capacity   int64 `json:"capacity"`
	Confirmed  int64 `json:"confirmed"`
	// Seq and Index are the place of the last request applied to the
	// activity.
	Seq   uint64 `json:"seq"`
	Index int    `json:"index,omitempty"`
	// Complete: every holder is listed in Holders, and none holds a seat
	// under a hold.
	Complete bool    `json:"complete"`
	Holders  []int64 `json:"holders,omitempty"` // CONFIRMED users
	// HoldsListed marks the view of a full activity with HELD seats that
	// lists every holder: the CONFIRMED ones in Holders, the HELD ones in
	// Held, with the ends of their holds, since a claim by a HELD user is
	// answered with them (ALREADY_OWNED, status HELD, held_until).
	// Complete stays false on such a view, so that an ingest that knows
	// nothing of holds never answers from it.
	HoldsListed bool       `json:"holds_listed,omitempty"`
	Held        []HeldSeat `json:"held,omitempty"`
}

// HeldSeat is a seat a view lists as HELD: its user and the end of the
// hold (as the signup row keeps it, whole microseconds in UTC).
type HeldSeat struct {
	UserID    int64     `json:"user_id"`
	HeldUntil time.Time `json:"held_until"`
}
