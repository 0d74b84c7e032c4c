package wire

import (
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
