package store

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/wire"
)

// EncodeEvents packs a decision's events as "kind:user_id;kind:user_id",
// the form processed_request.events (the outbox) stores; an event of a hold
// adds the hold's end in Unix microseconds, "kind:user_id:held_until". Kinds
// are fixed lower-case words, so the separators never clash.
func EncodeEvents(events []allocation.Event) string {
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
func DecodeEvents(s string) ([]allocation.Event, error) {
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ";")
	out := make([]allocation.Event, 0, len(parts))
	for _, p := range parts {
		kind, user, ok := strings.Cut(p, ":")
		user, until, held := strings.Cut(user, ":")
		id, err := strconv.ParseInt(user, 10, 64)
		if !ok || err != nil || kind == "" {
			return nil, fmt.Errorf("events column: bad entry %q", p)
		}
		e := allocation.Event{Kind: wire.EventKind(kind), UserID: id}
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

// promotedColumn is r's promoted users as processed_request.promoted_user_ids
// stores them, a JSON list whichever field of r names them ("" for none).
func promotedColumn(r wire.Result) string {
	ids := r.PromotedUserIDs
	if r.PromotedUserID != nil {
		ids = []int64{*r.PromotedUserID}
	}
	if len(ids) == 0 {
		return ""
	}
	b, _ := json.Marshal(ids)
	return string(b)
}

// setPromoted puts the promoted users of column (as promotedColumn wrote
// them) in the field of r that its op names (wire.SinglePromotion).
func setPromoted(r *wire.Result, column string) error {
	if column == "" {
		return nil
	}
	var ids []int64
	if err := json.Unmarshal([]byte(column), &ids); err != nil {
		return fmt.Errorf("decode promoted_user_ids: %w", err)
	}
	switch {
	case len(ids) == 0:
	case wire.SinglePromotion(r.Op) && len(ids) == 1:
		r.PromotedUserID = &ids[0]
	default:
		r.PromotedUserIDs = ids
	}
	return nil
}

// RefusedResult is the REJECTED result of the message r, refused at the
// instant at, exactly as GetResult reads it back from rejected_message
// (InsertRejected): false when r names no request a poll could ask for.
func RefusedResult(r RejectedRow, at time.Time) (wire.Result, bool) {
	q := r.Request
	if !ValidRequestID(q.RequestID) {
		return wire.Result{}, false
	}
	return wire.Result{RequestID: q.RequestID, State: wire.StateDone, Op: wire.Op(rejectedOp(q.Op)),
		ActivityID: q.ActivityID, UserID: q.UserID, Outcome: wire.OutcomeRejected, Seq: r.Seq, Index: r.Index,
		AppliedAt: wire.Instant(at), Reason: RejectedReason(r.Reason)}, true
}

// rejectedOp is op as rejected_message.op (VARCHAR(8)) keeps it.
func rejectedOp(op wire.Op) string { return truncate(string(op), 8) }
