package ingest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/allot-dev/allot/internal/ingest/reply"
	"github.com/allot-dev/allot/internal/wire"
)

// parseRequestID accepts only the canonical 36-character form, the form
// ingest issues and processed_request stores; it returns the lower-case
// string used as the key.
func parseRequestID(s string) (uuid.UUID, string, error) {
	if len(s) != 36 {
		return uuid.Nil, "", reply.BadRequest("The request id must be a UUID in its 36-character form, such as 0190f5e2-7c4a-7b3e-8f00-3c1d2e4f5a6b.")
	}
	id, err := uuid.Parse(s)
	if err != nil {
		return uuid.Nil, "", reply.BadRequest("The request id must be a UUID in its 36-character form, such as 0190f5e2-7c4a-7b3e-8f00-3c1d2e4f5a6b.")
	}
	return id, id.String(), nil
}

// parseWait reads ?wait=<Go duration>: absent or 0 means no wait, above max
// counts as max, negative or unparsable is a 400.
func parseWait(rawQuery string, maxWait time.Duration) (time.Duration, error) {
	if rawQuery == "" {
		return 0, nil
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return 0, reply.BadRequest("The query string is malformed.")
	}
	vs, ok := q["wait"]
	if !ok {
		return 0, nil
	}
	d, err := time.ParseDuration(vs[0])
	if err != nil || d < 0 || len(vs) > 1 {
		return 0, reply.BadRequest("The wait parameter must be one non-negative Go duration, such as 2s or 500ms.")
	}
	return min(d, maxWait), nil
}

// idempotencyKey reads the Idempotency-Key header: absent is "", present
// must be 1..255 printable ASCII characters.
func idempotencyKey(h http.Header) (string, bool, error) {
	vs, ok := h["Idempotency-Key"]
	if !ok {
		return "", false, nil
	}
	bad := reply.BadRequest("The Idempotency-Key header must be one value of 1 to 255 printable ASCII characters.")
	if len(vs) != 1 {
		return "", false, bad
	}
	k := vs[0]
	if len(k) < 1 || len(k) > wire.MaxIdempotencyKeyLen {
		return "", false, bad
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return "", false, bad
		}
	}
	return k, true, nil
}

// readBody reads the whole body up to limit bytes; more is a 413. Write
// routes that ignore their body call it too, so that the limit holds on
// every write and the connection stays reusable.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	tooLarge := func() error {
		// The rest of the body stays unread: close the connection rather
		// than read it to reuse the connection.
		w.Header()["Connection"] = []string{"close"}
		return &reply.InputError{Status: http.StatusRequestEntityTooLarge,
			Msg: "The request body is larger than " + strconv.FormatInt(limit/1024, 10) + " KiB."}
	}
	if r.ContentLength > limit {
		return nil, tooLarge()
	}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, nil
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, tooLarge()
		}
		return nil, reply.BadRequest("The request body could not be read.")
	}
	return body, nil
}

// parseOpen decodes the body of an open: {"capacity": N} with an optional
// "hold". N is a JSON integer (not a string, not 1.0, not 1e3) in
// 0..wire.MaxCapacity, required; the hold a JSON string holding a Go
// duration in 0..wire.MaxHold (0 or absent: no holds); no other field, no
// trailing data.
func parseOpen(body []byte) (int64, time.Duration, error) {
	var in struct {
		Capacity json.RawMessage `json:"capacity"`
		Hold     json.RawMessage `json:"hold"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		// encoding/json reports an unknown field only in its text.
		if strings.HasPrefix(err.Error(), "json: unknown field") {
			return 0, 0, reply.BadRequest(`The body has an unknown field; only "capacity" and "hold" are allowed.`)
		}
		return 0, 0, reply.BadRequest(`The body must be a JSON object such as {"capacity": 100}.`)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return 0, 0, reply.BadRequest(`The body must be one JSON object such as {"capacity": 100}, with nothing after it.`)
	}
	n, err := parseCapacity(in.Capacity)
	if err != nil {
		return 0, 0, err
	}
	hold, err := parseHold(in.Hold)
	if err != nil {
		return 0, 0, err
	}
	return n, hold, nil
}

// parseCapacity reads the capacity of an open's body.
func parseCapacity(raw json.RawMessage) (int64, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, reply.BadRequest(`The body must set "capacity", e.g. {"capacity": 100}.`)
	}
	if raw[0] != '-' && (raw[0] < '0' || raw[0] > '9') {
		return 0, reply.BadRequest("The capacity must be a JSON integer.")
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		if ne, ok := errors.AsType[*strconv.NumError](err); ok && errors.Is(ne.Err, strconv.ErrRange) {
			return 0, reply.BadRequest("The capacity must be between 0 and " + strconv.Itoa(wire.MaxCapacity) + ".")
		}
		return 0, reply.BadRequest("The capacity must be a JSON integer.")
	}
	if n < 0 || n > wire.MaxCapacity {
		return 0, reply.BadRequest("The capacity must be between 0 and " + strconv.Itoa(wire.MaxCapacity) + ".")
	}
	return n, nil
}

// parseHold reads the optional hold of an open's body: absent is 0 (no
// holds); present, a JSON string holding a Go duration from 0 to
// wire.MaxHold.
func parseHold(raw json.RawMessage) (time.Duration, error) {
	if len(raw) == 0 {
		return 0, nil
	}
	var s string
	if raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return 0, reply.BadRequest(`The hold must be a JSON string holding a Go duration, such as "10m".`)
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, reply.BadRequest(`The hold must be a Go duration such as "10m" or "1h30m".`)
	}
	if d < 0 || d > wire.MaxHold {
		return 0, reply.BadRequest("The hold must be between 0 and " + strings.TrimSuffix(wire.MaxHold.String(), "0m0s") + ".")
	}
	return d, nil
}
