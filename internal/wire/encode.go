package wire

import (
	"slices"
	"strconv"
	"time"
	"unicode/utf8"
)

// AppendJSON appends e as encoding/json would marshal it, without
// reflection: the relay encodes one event per change, tens of thousands a
// second. TestEventAppendJSONMatchesMarshal holds the two to the same bytes.
func (e Event) AppendJSON(b []byte) []byte {
	b = append(b, `{"event_id":`...)
	b = appendString(b, e.EventID)
	b = append(b, `,"kind":`...)
	b = appendString(b, string(e.Kind))
	b = append(b, `,"activity_id":`...)
	b = strconv.AppendInt(b, e.ActivityID, 10)
	b = append(b, `,"user_id":`...)
	b = strconv.AppendInt(b, e.UserID, 10)
	b = append(b, `,"request_id":`...)
	b = appendString(b, e.RequestID)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, e.Seq, 10)
	b = append(b, `,"index":`...)
	b = strconv.AppendInt(b, int64(e.Index), 10)
	b = append(b, `,"at":"`...)
	b = e.At.AppendFormat(b, time.RFC3339Nano)
	if e.HeldUntil != nil {
		b = append(b, `","held_until":"`...)
		b = e.HeldUntil.AppendFormat(b, time.RFC3339Nano)
	}
	return append(b, `"}`...)
}

// appendString appends s as a JSON string. Ids and kinds are plain ASCII;
// anything else falls back to strconv's quoting, escaped as encoding/json
// escapes HTML-sensitive and control characters.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' || c >= utf8.RuneSelf {
			return appendQuoted(b, s)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

func appendQuoted(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b = append(b, '\\', byte(r))
		case r == '\n':
			b = append(b, '\\', 'n')
		case r == '\r':
			b = append(b, '\\', 'r')
		case r == '\t':
			b = append(b, '\\', 't')
		case r < 0x20 || r == '<' || r == '>' || r == '&' || r == '\u2028' || r == '\u2029':
			b = append(b, '\\', 'u', '0', '0', hex[r>>4&0xf], hex[r&0xf])
			if r > 0xff {
				b = append(b[:len(b)-4], hex[r>>12&0xf], hex[r>>8&0xf], hex[r>>4&0xf], hex[r&0xf])
			}
		case r == utf8.RuneError:
			b = append(b, `\ufffd`...)
		default:
			b = utf8.AppendRune(b, r)
		}
	}
	return append(b, '"')
}

// AppendJSON appends r as encoding/json would marshal it, without
// reflection: ingest encodes one request per write.
// TestRequestAppendJSONMatchesMarshal holds the two to the same bytes.
func (r Request) AppendJSON(b []byte) []byte {
	b = append(b, `{"request_id":`...)
	b = appendString(b, r.RequestID)
	b = append(b, `,"op":`...)
	b = appendString(b, string(r.Op))
	b = append(b, `,"activity_id":`...)
	b = strconv.AppendInt(b, r.ActivityID, 10)
	b = append(b, `,"user_id":`...)
	b = strconv.AppendInt(b, r.UserID, 10)
	if r.Capacity != nil {
		b = append(b, `,"capacity":`...)
		b = strconv.AppendInt(b, *r.Capacity, 10)
	}
	if r.Hold != 0 {
		b = append(b, `,"hold":`...)
		b = appendString(b, time.Duration(r.Hold).String())
	}
	if r.HoldSeq != 0 {
		b = append(b, `,"hold_seq":`...)
		b = strconv.AppendUint(b, r.HoldSeq, 10)
	}
	if r.HoldIndex != 0 {
		b = append(b, `,"hold_index":`...)
		b = strconv.AppendInt(b, int64(r.HoldIndex), 10)
	}
	if r.IdempotencyKey != "" {
		b = append(b, `,"idempotency_key":`...)
		b = appendString(b, r.IdempotencyKey)
	}
	b = append(b, `,"received_at":`...)
	b = appendTime(b, r.ReceivedAt)
	return append(b, '}')
}

// AppendJSON appends r as encoding/json would marshal it, without
// reflection: results are encoded on their way to ingest and in every
// answer that carries one. TestResultAppendJSONMatchesMarshal holds the
// two to the same bytes.
func (r Result) AppendJSON(b []byte) []byte {
	b = append(b, `{"request_id":`...)
	b = appendString(b, r.RequestID)
	b = append(b, `,"state":`...)
	b = appendString(b, r.State)
	b = append(b, `,"op":`...)
	b = appendString(b, string(r.Op))
	b = append(b, `,"activity_id":`...)
	b = strconv.AppendInt(b, r.ActivityID, 10)
	b = append(b, `,"user_id":`...)
	b = strconv.AppendInt(b, r.UserID, 10)
	b = append(b, `,"outcome":`...)
	b = appendString(b, string(r.Outcome))
	b = append(b, `,"status":`...)
	if r.Status != nil {
		b = appendString(b, string(*r.Status))
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"position":`...)
	b = appendIntPtr(b, r.Position)
	b = append(b, `,"promoted_user_id":`...)
	b = appendIntPtr(b, r.PromotedUserID)
	if len(r.PromotedUserIDs) > 0 {
		b = append(b, `,"promoted_user_ids":[`...)
		for i, u := range r.PromotedUserIDs {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, u, 10)
		}
		b = append(b, ']')
	}
	if r.Capacity != nil {
		b = append(b, `,"capacity":`...)
		b = strconv.AppendInt(b, *r.Capacity, 10)
	}
	if r.HeldUntil != nil {
		b = append(b, `,"held_until":`...)
		b = appendTime(b, *r.HeldUntil)
	}
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, r.Seq, 10)
	b = append(b, `,"index":`...)
	b = strconv.AppendInt(b, int64(r.Index), 10)
	b = append(b, `,"applied_at":`...)
	b = appendTime(b, r.AppliedAt)
	if r.Reason != "" {
		b = append(b, `,"reason":`...)
		b = appendString(b, r.Reason)
	}
	if r.Shed {
		b = append(b, `,"shed":true`...)
	}
	return append(b, '}')
}

func appendIntPtr(b []byte, p *int64) []byte {
	if p == nil {
		return append(b, "null"...)
	}
	return strconv.AppendInt(b, *p, 10)
}

// appendTime appends t quoted in RFC 3339 with nanoseconds, as
// time.Time's MarshalJSON writes it. Only years 0 to 9999 have that form
// (MarshalJSON fails outside them); no request or result carries another.
func appendTime(b []byte, t time.Time) []byte {
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

// AppendResults appends the ResultBatch of results as encoding/json would
// marshal it, without reflection: the allocator sends one after every
// commit. TestAppendResultsMatchesMarshal holds the two to the same bytes.
func AppendResults(b []byte, results []Result) []byte {
	if len(results) == 0 {
		return append(b, "{}"...)
	}
	b = slices.Grow(b, 16+300*len(results))
	b = append(b, `{"results":[`...)
	for i, r := range results {
		if i > 0 {
			b = append(b, ',')
		}
		b = r.AppendJSON(b)
	}
	return append(b, "]}"...)
}
