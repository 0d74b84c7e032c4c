package wire

import (
	"encoding/json"
	"strconv"
	"time"
)

// The fast decoders read exactly what AppendJSON writes (its field order,
// no spaces, strings of printable ASCII without escapes, times in UTC) and
// give up on anything else, which encoding/json then decodes. So they
// accept a subset of what encoding/json accepts and decode it to the same
// value: TestFastDecodeMatchesUnmarshal holds them to that.

// DecodeResultBatch decodes a payload of ResultSubject.
func DecodeResultBatch(data []byte) (ResultBatch, error) {
	if rs, ok := fastResults(data); ok {
		return ResultBatch{Results: rs}, nil
	}
	var b ResultBatch
	err := json.Unmarshal(data, &b)
	return b, err
}

func fastResults(data []byte) ([]Result, bool) {
	d := scan{b: data}
	if !d.lit(`{"results":[`) {
		return nil, false
	}
	var out []Result
	for {
		r, ok := d.result()
		if !ok {
			return nil, false
		}
		out = append(out, r)
		if d.lit(",") {
			continue
		}
		if d.lit("]}") && d.i == len(d.b) {
			return out, true
		}
		return nil, false
	}
}

// fastBatch reads a batch of n requests, as EncodeBatch writes it.
func fastBatch(data []byte, n int) ([]Request, bool) {
	d := scan{b: data}
	if !d.lit("[") {
		return nil, false
	}
	out := make([]Request, 0, n)
	for {
		r, ok := d.request()
		if !ok || len(out) == n {
			return nil, false
		}
		out = append(out, r)
		if d.lit(",") {
			continue
		}
		if d.lit("]") && d.i == len(d.b) && len(out) == n {
			return out, true
		}
		return nil, false
	}
}

// unmarshalRequest decodes data into req as json.Unmarshal does.
func unmarshalRequest(data []byte, req *Request) error {
	d := scan{b: data}
	if r, ok := d.request(); ok && d.i == len(d.b) {
		*req = r
		return nil
	}
	*req = Request{}
	return json.Unmarshal(data, req)
}

// scan is a cursor over b; every method reports false, having consumed
// anything or not, when b does not go on as expected.
type scan struct {
	b []byte
	i int
}

func (d *scan) lit(s string) bool {
	if len(d.b)-d.i < len(s) || string(d.b[d.i:d.i+len(s)]) != s {
		return false
	}
	d.i += len(s)
	return true
}

func (d *scan) str() (string, bool) {
	b, ok := d.raw()
	return string(b), ok
}

// raw reads a string and returns its bytes, unquoted.
func (d *scan) raw() ([]byte, bool) {
	if d.i >= len(d.b) || d.b[d.i] != '"' {
		return nil, false
	}
	for j := d.i + 1; j < len(d.b); j++ {
		switch c := d.b[j]; {
		case c == '"':
			b := d.b[d.i+1 : j]
			d.i = j + 1
			return b, true
		case c < 0x20 || c == '\\' || c >= 0x80:
			return nil, false
		}
	}
	return nil, false
}

// word reads a string that is most often one of the words of the
// contract (an op, an outcome, a status, a state), which it returns
// without allocating.
func (d *scan) word() (string, bool) {
	b, ok := d.raw()
	if !ok {
		return "", false
	}
	for _, w := range words {
		if string(b) == w {
			return w, true
		}
	}
	return string(b), true
}

var words = []string{
	StateDone, StatePending,
	string(OpClaim), string(OpJoin), string(OpCancel), string(OpOpen), string(OpConfirm), string(OpExpire), string(OpVoid),
	string(OutcomeGranted), string(OutcomeSoldOut), string(OutcomeAlreadyOwned), string(OutcomeConfirmed), string(OutcomeWaiting),
	string(OutcomeRejected), string(OutcomeHeld), string(OutcomeCancelled),
	string(StatusConfirmed), string(StatusWaiting), string(StatusCancelled), string(StatusHeld),
}

// digits consumes a JSON integer (an optional minus when signed, no
// leading zero) and returns its text.
func (d *scan) digits(signed bool) ([]byte, bool) {
	j := d.i
	if signed && j < len(d.b) && d.b[j] == '-' {
		j++
	}
	k := j
	for k < len(d.b) && d.b[k] >= '0' && d.b[k] <= '9' {
		k++
	}
	if k == j || d.b[j] == '0' && k > j+1 {
		return nil, false
	}
	if k < len(d.b) && (d.b[k] == '.' || d.b[k] == 'e' || d.b[k] == 'E') {
		return nil, false
	}
	s := d.b[d.i:k]
	d.i = k
	return s, true
}

func (d *scan) int() (int64, bool) {
	s, ok := d.digits(true)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(string(s), 10, 64)
	return n, err == nil
}

func (d *scan) uint() (uint64, bool) {
	s, ok := d.digits(false)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(string(s), 10, 64)
	return n, err == nil
}

func (d *scan) intPtr() (*int64, bool) {
	if d.lit("null") {
		return nil, true
	}
	n, ok := d.int()
	return &n, ok
}

// time reads a time in UTC: "YYYY-MM-DDTHH:MM:SS[.fraction]Z".
func (d *scan) time() (time.Time, bool) {
	s, ok := d.str()
	if !ok || len(s) < 20 || s[len(s)-1] != 'Z' {
		return time.Time{}, false
	}
	for i := 0; i < 19; i++ {
		c := s[i]
		switch i {
		case 4, 7:
			ok = c == '-'
		case 10:
			ok = c == 'T'
		case 13, 16:
			ok = c == ':'
		default:
			ok = c >= '0' && c <= '9'
		}
		if !ok {
			return time.Time{}, false
		}
	}
	if frac := s[19 : len(s)-1]; frac != "" {
		if len(frac) < 2 || len(frac) > 10 || frac[0] != '.' {
			return time.Time{}, false
		}
		for i := 1; i < len(frac); i++ {
			if frac[i] < '0' || frac[i] > '9' {
				return time.Time{}, false
			}
		}
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	return t, err == nil
}

func (d *scan) request() (r Request, ok bool) {
	var s string
	if !d.lit(`{"request_id":`) {
		return r, false
	}
	if r.RequestID, ok = d.str(); !ok || !d.lit(`,"op":`) {
		return r, false
	}
	if s, ok = d.word(); !ok || !d.lit(`,"activity_id":`) {
		return r, false
	}
	r.Op = Op(s)
	if r.ActivityID, ok = d.int(); !ok || !d.lit(`,"user_id":`) {
		return r, false
	}
	if r.UserID, ok = d.int(); !ok {
		return r, false
	}
	if d.lit(`,"capacity":`) {
		c, ok := d.int()
		if !ok {
			return r, false
		}
		r.Capacity = &c
	}
	if d.lit(`,"hold":`) {
		s, ok := d.str()
		if !ok {
			return r, false
		}
		h, err := time.ParseDuration(s)
		if err != nil {
			return r, false
		}
		r.Hold = Duration(h)
	}
	if d.lit(`,"hold_seq":`) {
		if r.HoldSeq, ok = d.uint(); !ok {
			return r, false
		}
	}
	if d.lit(`,"hold_index":`) {
		n, ok := d.int()
		if !ok || int64(int(n)) != n {
			return r, false
		}
		r.HoldIndex = int(n)
	}
	if d.lit(`,"idempotency_key":`) {
		if r.IdempotencyKey, ok = d.str(); !ok {
			return r, false
		}
	}
	if !d.lit(`,"received_at":`) {
		return r, false
	}
	if r.ReceivedAt, ok = d.time(); !ok {
		return r, false
	}
	return r, d.lit("}")
}

func (d *scan) result() (r Result, ok bool) {
	var s string
	if !d.lit(`{"request_id":`) {
		return r, false
	}
	if r.RequestID, ok = d.str(); !ok || !d.lit(`,"state":`) {
		return r, false
	}
	if r.State, ok = d.word(); !ok || !d.lit(`,"op":`) {
		return r, false
	}
	if s, ok = d.word(); !ok || !d.lit(`,"activity_id":`) {
		return r, false
	}
	r.Op = Op(s)
	if r.ActivityID, ok = d.int(); !ok || !d.lit(`,"user_id":`) {
		return r, false
	}
	if r.UserID, ok = d.int(); !ok || !d.lit(`,"outcome":`) {
		return r, false
	}
	if s, ok = d.word(); !ok || !d.lit(`,"status":`) {
		return r, false
	}
	r.Outcome = Outcome(s)
	if !d.lit("null") {
		if s, ok = d.word(); !ok {
			return r, false
		}
		st := Status(s)
		r.Status = &st
	}
	if !d.lit(`,"position":`) {
		return r, false
	}
	if r.Position, ok = d.intPtr(); !ok || !d.lit(`,"promoted_user_id":`) {
		return r, false
	}
	if r.PromotedUserID, ok = d.intPtr(); !ok {
		return r, false
	}
	if d.lit(`,"promoted_user_ids":[`) {
		for {
			n, ok := d.int()
			if !ok {
				return r, false
			}
			r.PromotedUserIDs = append(r.PromotedUserIDs, n)
			if d.lit("]") {
				break
			}
			if !d.lit(",") {
				return r, false
			}
		}
	}
	if d.lit(`,"capacity":`) {
		c, ok := d.int()
		if !ok {
			return r, false
		}
		r.Capacity = &c
	}
	if d.lit(`,"held_until":`) {
		t, ok := d.time()
		if !ok {
			return r, false
		}
		r.HeldUntil = &t
	}
	if !d.lit(`,"seq":`) {
		return r, false
	}
	if r.Seq, ok = d.uint(); !ok || !d.lit(`,"index":`) {
		return r, false
	}
	n, ok := d.int()
	if !ok || int64(int(n)) != n || !d.lit(`,"applied_at":`) {
		return r, false
	}
	r.Index = int(n)
	if r.AppliedAt, ok = d.time(); !ok {
		return r, false
	}
	if d.lit(`,"reason":`) {
		if r.Reason, ok = d.str(); !ok {
			return r, false
		}
	}
	if d.lit(`,"shed":true`) {
		r.Shed = true
	}
	return r, d.lit("}")
}
