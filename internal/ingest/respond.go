package ingest

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/allot-dev/allot/internal/wire"
)

// Sentences of the answers that are not about one input.
const (
	msgBrokerDown  = "The message broker is unavailable, so nothing was stored; retry later."
	msgMaybeStored = "The message broker did not confirm storing the request in time, so it may have been stored: " +
		"poll the Location to see whether it is applied; retry only with the same Idempotency-Key."
	msgDatabaseDown    = "The database is unavailable; retry later."
	msgNoRoute         = "No route matches this path."
	msgInternal        = "An internal error occurred; it was logged."
	msgOverloaded      = "Too many requests are in flight; nothing was stored, retry after the time in the Retry-After header."
	msgReadRateLimited = "Too many reads for this caller; retry after the time in the Retry-After header."
	msgUserRateLimited = "Too many writes for this user; retry after the time in the Retry-After header."
	msgRateLimited     = "Too many requests; retry after the time in the Retry-After header."
	msgOpenRateLimited = "Too many opens and resizes; retry after the time in the Retry-After header."
)

// writeJSON answers status with v encoded as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		// Only the types of package wire and store are encoded here, and
		// they always encode; fail loudly but as JSON if that ever changes.
		status, body = http.StatusInternalServerError, []byte(`{"error":"An internal error occurred; it was logged."}`)
	}
	writeRaw(w, status, body)
}

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h["Content-Type"] = jsonContentType
	h["Content-Length"] = []string{strconv.Itoa(len(body) + 1)}
	w.WriteHeader(status)
	w.Write(body)       //nolint:errcheck // the client is gone; nothing to do
	w.Write(newline[:]) //nolint:errcheck
}

var (
	jsonContentType = []string{"application/json"}
	newline         = [1]byte{'\n'}
)

// writeError answers status with {"error": msg}; msg is one sentence that
// ends with a period.
func writeError(w http.ResponseWriter, status int, msg string) {
	body, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{msg})
	writeRaw(w, status, body)
}

// writeInputError answers a validation error, or 400 for any other error.
func writeInputError(w http.ResponseWriter, err error) {
	if ie, ok := errors.AsType[*inputError](err); ok {
		writeError(w, ie.status, ie.msg)
		return
	}
	writeError(w, http.StatusBadRequest, "The request is malformed.")
}

// pendingBody is {"request_id": id, "state": "pending"}, the 202 ack and
// the pending poll answer, built without reflection on the hot path. A
// request id is a canonical UUID string, which needs no escaping.
func pendingBody(id string) []byte {
	b := make([]byte, 0, 64)
	b = append(b, `{"request_id":"`...)
	b = append(b, id...)
	b = append(b, `","state":"`+wire.StatePending+`"}`...)
	return b
}

// writeMaybeStored answers 503 for a request that may have been stored:
// the request id and its Location come with it, so that the client polls
// instead of retrying into a second request. 503 because the write was not
// confirmed; the id because "nothing was stored" may be false.
func writeMaybeStored(w http.ResponseWriter, id string) {
	w.Header()["Location"] = []string{"/v1/requests/" + id}
	body, _ := json.Marshal(struct {
		Error     string `json:"error"`
		RequestID string `json:"request_id"`
	}{msgMaybeStored, id})
	writeRaw(w, http.StatusServiceUnavailable, body)
}

// writeAck answers 202 with the request ack and its Location.
func writeAck(w http.ResponseWriter, id string) {
	w.Header()["Location"] = []string{"/v1/requests/" + id}
	writeRaw(w, http.StatusAccepted, pendingBody(id))
}

// retryAfter sets Retry-After to d in whole seconds, at least one.
func retryAfter(w http.ResponseWriter, d time.Duration) {
	w.Header()["Retry-After"] = []string{strconv.Itoa(max(1, int(math.Ceil(d.Seconds()))))}
}
