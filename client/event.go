package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// ErrMalformedEvent is wrapped by DecodeEvent's errors: the data is not an
// event a receiver can dedupe.
var ErrMalformedEvent = errors.New("malformed event")

// DecodeEvent decodes an event message (the data of a message on
// alloc.evt.<activity>.<kind>, or the body of a notifier's webhook call)
// and checks that it carries an event_id a receiver can dedupe by: a
// printable token of at most 255 bytes.
func DecodeEvent(data []byte) (Event, error) {
	var ev Event
	if err := json.Unmarshal(data, &ev); err != nil {
		return ev, fmt.Errorf("%w: %v", ErrMalformedEvent, err)
	}
	if ev.EventID == "" {
		return ev, fmt.Errorf("%w: no event_id", ErrMalformedEvent)
	}
	if len(ev.EventID) > 255 || strings.IndexFunc(ev.EventID, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0 {
		return ev, fmt.Errorf("%w: event_id %q is not a printable token of at most 255 bytes", ErrMalformedEvent, ev.EventID)
	}
	return ev, nil
}
