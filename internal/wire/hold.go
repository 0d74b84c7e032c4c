package wire

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
)

// Holds (docs/architecture.md, "Holds"). An activity with a hold gives a seat first
// as HELD until held_until; the hold's expiry is a request (op expire) in
// the request stream. It gets there through a JetStream message schedule:
// the allocator's outbox relay publishes, for each hold it committed, a
// schedule on HoldScheduleSubject in HoldStream, due at HoldDue; when it is
// due the server stores the expire on HoldDueSubject, and ALLOT_REQUESTS
// sources it from there onto the activity's request subject. The schedule
// lives in a stream of its own because the server refuses schedules in a
// stream that discards new messages when full, which ALLOT_REQUESTS must.
const (
	HoldStream        = "ALLOT_HOLDS"
	HoldSubjectPrefix = "alloc.hold."
	// HoldDuePrefix + <activity> is where a due expire is stored, to be
	// sourced into the request stream.
	HoldDuePrefix = HoldSubjectPrefix + "due."
	// holdSchedulePrefix + <activity>.<user>.<hold seq> holds one hold's
	// schedule: one subject per hold, so schedules never replace each
	// other.
	holdSchedulePrefix = HoldSubjectPrefix + "at."

	// HoldGrace is how long after held_until the expire is due: a confirm
	// received just before held_until is stored before its expire.
	HoldGrace = 250 * time.Millisecond
)

// HoldScheduleSubject is the subject of the schedule of the hold that the
// request at place hold (Place) gave user on activity.
func HoldScheduleSubject(activity, user int64, hold uint64) string {
	return holdSchedulePrefix + strconv.FormatInt(activity, 10) + "." + strconv.FormatInt(user, 10) + "." + holdToken(hold)
}

// holdToken names the hold at place hold in a subject and in an expire's
// id: its stream sequence, with "-index" for a request in a batch, so the
// holds of single requests keep the names they had before batches.
func holdToken(hold uint64) string {
	s := strconv.FormatUint(SeqOf(hold), 10)
	if i := IndexOf(hold); i > 0 {
		s += "-" + strconv.Itoa(i)
	}
	return s
}

// HoldDueSubject is the subject an expire for activity is stored on in
// HoldStream when it is due.
func HoldDueSubject(activity int64) string {
	return HoldDuePrefix + strconv.FormatInt(activity, 10)
}

// HoldDue is when the expire of a hold until heldUntil is due.
func HoldDue(heldUntil time.Time) time.Time { return heldUntil.Add(HoldGrace) }

// holdNamespace roots the derived ids of expire requests.
var holdNamespace = uuid.MustParse("0b6c7a52-8e1f-4d3a-b9c2-5f4e3d2a1b07")

// ExpireRequestID is the request_id (and the schedule's Nats-Msg-Id) of the
// expire of the hold the request at place hold gave user on activity:
// derived, so a schedule published twice (an outbox relayed again after a
// crash) is one request, applied once. A user who joins, cancels and joins
// again inside one batch holds two holds, with two ids.
func ExpireRequestID(activity, user int64, hold uint64) string {
	return uuid.NewSHA1(holdNamespace, []byte(strconv.FormatInt(activity, 10)+"/"+
		strconv.FormatInt(user, 10)+"/"+holdToken(hold))).String()
}

// ExpireRequest is the expire of the hold the request at place hold gave
// user on activity until heldUntil. Its received_at is the moment it is
// due, so a replay decides it exactly as the allocator did.
func ExpireRequest(activity, user int64, hold uint64, heldUntil time.Time) Request {
	return Request{
		RequestID: ExpireRequestID(activity, user, hold), Op: OpExpire,
		ActivityID: activity, UserID: user, HoldSeq: SeqOf(hold), HoldIndex: IndexOf(hold),
		ReceivedAt: HoldDue(heldUntil).UTC(),
	}
}

// Duration is a time.Duration written in JSON as a Go duration string
// ("10m0s"), the form clients send.
type Duration time.Duration

// MarshalJSON writes d as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON reads a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration is a string such as \"10m\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// ParseHold parses a hold as clients and requests write it: a Go duration
// between 0 and MaxHold.
func ParseHold(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("hold %q is not a Go duration such as \"10m\"", s)
	}
	if d < 0 || d > MaxHold {
		return 0, fmt.Errorf("hold %s is outside 0 to %s", d, MaxHold)
	}
	return d, nil
}
