package allocation

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/allot-dev/allot/internal/wire"
)

// RequestOf is what the domain needs of a request message.
func RequestOf(req wire.Request) Request {
	r := Request{
		Op: req.Op, ActivityID: req.ActivityID, UserID: req.UserID,
		Hold: time.Duration(req.Hold), HoldSeq: req.HoldSeq, ReceivedAt: req.ReceivedAt,
	}
	if req.Capacity != nil {
		r.Capacity = *req.Capacity
	}
	return r
}

// ResultOf turns the decision d on req (at stream sequence seq, leaving the
// activity as after) into the result the allocator records and the audit
// expects. AppliedAt is left for the caller, which owns the clock.
func ResultOf(req wire.Request, seq uint64, d Decision, after *Activity) wire.Result {
	r := wire.Result{
		RequestID: req.RequestID, State: wire.StateDone, Op: req.Op,
		ActivityID: req.ActivityID, UserID: req.UserID, Outcome: d.Outcome, Seq: seq,
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
		t := d.HeldUntil
		r.HeldUntil = &t
	}
	switch req.Op {
	case wire.OpCancel, wire.OpConfirm, wire.OpExpire:
		// A seat released by one user goes to one waiter at most.
		if len(d.PromotedUserIDs) > 0 {
			id := d.PromotedUserIDs[0]
			r.PromotedUserID = &id
		}
	case wire.OpOpen:
		r.PromotedUserIDs = slices.Clone(d.PromotedUserIDs)
		if after != nil {
			c := after.Capacity
			r.Capacity = &c
			if d.Outcome == wire.OutcomeRejected && req.Capacity != nil {
				r.Reason = "capacity " + strconv.FormatInt(*req.Capacity, 10) + " is below the " +
					strconv.FormatInt(after.Confirmed, 10) + " seats already taken"
			}
		}
	}
	return r
}

// EncodeEvents packs a decision's events as "kind:user_id;kind:user_id",
// the form processed_request.events (the outbox) stores; an event of a hold
// adds the hold's end in Unix microseconds, "kind:user_id:held_until". Kinds
// are fixed lower-case words, so the separators never clash.
func EncodeEvents(events []Event) string {
	if len(events) == 0 {
		return ""
	}
	var b strings.Builder
	for i, e := range events {
		if i > 0 {
			b.WriteByte(';')
		}
		b.WriteString(string(e.Kind))
		b.WriteByte(':')
		b.WriteString(strconv.FormatInt(e.UserID, 10))
		if !e.HeldUntil.IsZero() {
			b.WriteByte(':')
			b.WriteString(strconv.FormatInt(e.HeldUntil.UnixMicro(), 10))
		}
	}
	return b.String()
}

// DecodeEvents unpacks what EncodeEvents packed.
func DecodeEvents(s string) ([]Event, error) {
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ";")
	out := make([]Event, 0, len(parts))
	for _, p := range parts {
		kind, user, ok := strings.Cut(p, ":")
		user, until, held := strings.Cut(user, ":")
		id, err := strconv.ParseInt(user, 10, 64)
		if !ok || err != nil || kind == "" {
			return nil, fmt.Errorf("events column: bad entry %q", p)
		}
		e := Event{Kind: wire.EventKind(kind), UserID: id}
		if held {
			us, err := strconv.ParseInt(until, 10, 64)
			if err != nil || us == 0 {
				return nil, fmt.Errorf("events column: bad entry %q", p)
			}
			e.HeldUntil = time.UnixMicro(us).UTC()
		}
		out = append(out, e)
	}
	return out, nil
}

// VoidResult is the result a void (wire.OpVoid) records for a request id
// that had none before it in its partition's order: REJECTED, reason
// wire.ReasonNeverStored, changing nothing. A void of an id that has a
// result is a repeat and records nothing.
func VoidResult(req wire.Request, seq uint64) wire.Result {
	return wire.Result{
		RequestID: req.RequestID, State: wire.StateDone, Op: wire.OpVoid,
		ActivityID: 0, UserID: req.UserID, Outcome: wire.OutcomeRejected, Seq: seq,
		Reason: wire.ReasonNeverStored,
	}
}
