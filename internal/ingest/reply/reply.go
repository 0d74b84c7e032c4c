// Package reply writes ingest's HTTP answers: JSON bodies, the error
// sentences every component shares, the 202 ack and its Location, and
// Retry-After. Every part of ingest answers through it, so that an answer
// looks the same whichever part gives it.
package reply

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/allot-dev/allot/internal/wire"
)

// Sentences of the answers that are not about one input.
const (
	MsgBrokerDown  = "The message broker is unavailable, so nothing was stored; retry later."
	MsgMaybeStored = "The message broker did not confirm storing the request in time, so it may have been stored: " +
		"poll the Location to see whether it is applied; retry only with the same Idempotency-Key."
	MsgDatabaseDown    = "The database is unavailable; retry later."
	MsgNoRoute         = "No route matches this path."
	MsgInternal        = "An internal error occurred; it was logged."
	MsgOverloaded      = "Too many requests are in flight; nothing was stored, retry after the time in the Retry-After header."
	MsgReadRateLimited = "Too many reads for this caller; retry after the time in the Retry-After header."
	MsgUserRateLimited = "Too many writes for this user; retry after the time in the Retry-After header."
	MsgRateLimited     = "Too many requests; retry after the time in the Retry-After header."
	MsgOpenRateLimited = "Too many opens and resizes; retry after the time in the Retry-After header."
)

// JSON answers status with v encoded as JSON.
func JSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		// Only the types of package wire and store are encoded here, and
		// they always encode; fail loudly but as JSON if that ever changes.
		status, body = http.StatusInternalServerError, []byte(`{"error":"An internal error occurred; it was logged."}`)
	}
	Raw(w, status, body)
}

// Raw answers status with body, a JSON value, and a newline.
func Raw(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h["Content-Type"] = jsonContentType
	h["Content-Length"] = []string{strconv.Itoa(len(body) + 1)}
	w.WriteHeader(status)
	w.Write(body)       //nolint:errcheck // the client is gone; nothing to do
	w.Write(newline[:]) //nolint:errcheck
}

// Result answers status with res, encoded without reflection
// (wire.Result.AppendJSON): the answer of every shed claim and ?wait=.
func Result(w http.ResponseWriter, status int, res wire.Result) {
	bp := bufPool.Get().(*[]byte)
	b := append(res.AppendJSON((*bp)[:0]), '\n')
	h := w.Header()
	h["Content-Type"] = jsonContentType
	h["Content-Length"] = []string{strconv.Itoa(len(b))}
	w.WriteHeader(status)
	w.Write(b) //nolint:errcheck // the client is gone; nothing to do
	if cap(b) <= 64<<10 {
		*bp = b
		bufPool.Put(bp)
	}
}

var (
	jsonContentType = []string{"application/json"}
	newline         = [1]byte{'\n'}
	// bufPool holds answer buffers; net/http copies what is written
	// before Write returns.
	bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}
)

// Error answers status with {"error": msg}; msg is one sentence that
// ends with a period.
func Error(w http.ResponseWriter, status int, msg string) {
	body, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{msg})
	Raw(w, status, body)
}

// Input answers a validation error, or 400 for any other error.
func Input(w http.ResponseWriter, err error) {
	if ie, ok := errors.AsType[*InputError](err); ok {
		Error(w, ie.Status, ie.Msg)
		return
	}
	Error(w, http.StatusBadRequest, "The request is malformed.")
}

// Pending is {"request_id": id, "state": "pending"}, the 202 ack and
// the pending poll answer, built without reflection on the hot path. A
// request id is a canonical UUID string, which needs no escaping.
func Pending(id string) []byte {
	b := make([]byte, 0, 64)
	b = append(b, `{"request_id":"`...)
	b = append(b, id...)
	b = append(b, `","state":"`+wire.StatePending+`"}`...)
	return b
}

// MaybeStored answers 503 for a request that may have been stored:
// the request id and its Location come with it, so that the client polls
// instead of retrying into a second request. 503 because the write was not
// confirmed; the id because "nothing was stored" may be false.
func MaybeStored(w http.ResponseWriter, id string) {
	w.Header()["Location"] = []string{"/v1/requests/" + id}
	body, _ := json.Marshal(struct {
		Error     string `json:"error"`
		RequestID string `json:"request_id"`
	}{MsgMaybeStored, id})
	Raw(w, http.StatusServiceUnavailable, body)
}

// Ack answers 202 with the request ack and its Location.
func Ack(w http.ResponseWriter, id string) {
	w.Header()["Location"] = []string{"/v1/requests/" + id}
	Raw(w, http.StatusAccepted, Pending(id))
}

// RetryAfter sets Retry-After to d in whole seconds, at least one.
func RetryAfter(w http.ResponseWriter, d time.Duration) {
	w.Header()["Retry-After"] = []string{strconv.Itoa(max(1, int(math.Ceil(d.Seconds()))))}
}

// InputError is a client mistake: it is answered with status and msg, one
// sentence that ends with a period.
type InputError struct {
	Status int
	Msg    string
}

func (e *InputError) Error() string { return e.Msg }

func BadRequest(msg string) error { return &InputError{Status: http.StatusBadRequest, Msg: msg} }

// ParseID parses an id from a path: decimal digits only (no sign, no
// spaces), 1..2^63-1.
func ParseID(s, what string) (int64, error) {
	bad := func() error {
		return BadRequest("The " + what + " id must be a decimal integer from 1 to 9223372036854775807.")
	}
	if s == "" {
		return 0, bad()
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, bad()
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 {
		return 0, bad()
	}
	return n, nil
}
