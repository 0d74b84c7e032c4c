package wire

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Request batches. A message on a request subject carries one request, or
// a batch: header BatchHeader = n and a body that is a JSON array of n
// requests, all for the activity of the subject, in order. A batch has a
// Nats-Msg-Id of its own; each request keeps its request_id, and a request
// id is applied once however many messages carry it.
//
// A request's place in the order is (stream sequence of its message, index
// in the batch; 0 for a single request). Results, events and views carry
// the two apart (seq, index); inside the system a place is one number,
// Place, that orders the same way: queue_seq, hold seqs, an activity's
// next_seq and the domain's sequence arguments are places.

// Headers of a request message.
const (
	// BatchHeader marks a batch and gives its number of requests.
	BatchHeader = "Allot-Batch"
	// OpsHeader lists the distinct ops a message carries (OpsOf), so that
	// a reader that only needs to know whether a message can change a
	// claim's answer (ingest's tail) reads no body. A message without it
	// may carry anything.
	OpsHeader = "Allot-Ops"
)

// IndexBits is how many low bits of a Place hold the index in the batch.
const IndexBits = 16

// MaxBatch bounds the requests in one batch; ingest publishes at most
// this many in one message, and the allocator and the audit refuse a
// larger batch as malformed.
const MaxBatch = 1000

// Place packs the place (seq, index) into one number that orders as the
// pair does. seq must be below 2^48, which at a million messages a second
// lasts nine years; index below MaxBatch.
func Place(seq uint64, index int) uint64 { return seq<<IndexBits | uint64(index) }

// SeqOf is the stream sequence of place.
func SeqOf(place uint64) uint64 { return place >> IndexBits }

// IndexOf is the index in its batch of place.
func IndexOf(place uint64) int { return int(place & (1<<IndexBits - 1)) }

// FormatPlace writes place as a reader of the stream finds it: "seq" for a
// single request, "seq#index" for one in a batch.
func FormatPlace(place uint64) string {
	s := strconv.FormatUint(SeqOf(place), 10)
	if i := IndexOf(place); i > 0 {
		s += "#" + strconv.Itoa(i)
	}
	return s
}

// OpsOf is the OpsHeader value of a message carrying ops: the distinct
// ops, sorted, comma-separated.
func OpsOf(ops ...Op) string {
	if len(ops) == 1 {
		return string(ops[0])
	}
	s := make([]string, 0, len(ops))
	for _, op := range ops {
		s = append(s, string(op))
	}
	slices.Sort(s)
	return strings.Join(slices.Compact(s), ",")
}

// ChangesNoClaim reports whether a message whose OpsHeader is ops
// carries only requests that never change a claim's answer on a full
// activity (claims, and voids, which change no activity). A message
// without the header (ops "") may carry anything: false.
func ChangesNoClaim(ops string) bool {
	if ops == "" {
		return false
	}
	for op := range strings.SplitSeq(ops, ",") {
		if Op(op) != OpClaim && Op(op) != OpVoid {
			return false
		}
	}
	return true
}

// EncodeBatch is the body of a batch of the encoded requests reqs: a JSON
// array of them, in order.
func EncodeBatch(reqs [][]byte) []byte {
	n := 1 + len(reqs)
	for _, r := range reqs {
		n += len(r)
	}
	b := make([]byte, 0, n)
	b = append(b, '[')
	for i, r := range reqs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, r...)
	}
	return append(b, ']')
}

// BatchSize reads a message's BatchHeader: 0 when absent (a single
// request), else n between 1 and MaxBatch.
func BatchSize(header string) (int, error) {
	if header == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(header)
	if err != nil || n < 1 || n > MaxBatch {
		return 0, fmt.Errorf("%s %q is not a number from 1 to %d", BatchHeader, header, MaxBatch)
	}
	return n, nil
}

// Decoded is one request of a message at its index, or why it cannot be
// applied (Err; Request then holds what could be read of it).
type Decoded struct {
	Index   int
	Request Request
	Err     error
}

// DecodeMessage reads the requests of a message stored on subject with
// BatchHeader batch (empty for a single request). An error means the
// message as a whole is malformed (its body is not an array of batch
// requests): nothing in it is applied, and it is refused at index 0. A
// request of a well-formed batch that is malformed by itself is refused
// alone (its Decoded.Err); the others are applied.
func DecodeMessage(subject, batch string, data []byte) ([]Decoded, error) {
	n, err := BatchSize(batch)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		req, err := DecodeRequest(subject, data)
		return []Decoded{{Request: req, Err: err}}, nil
	}
	if reqs, ok := fastBatch(data, n); ok {
		out := make([]Decoded, n)
		for i, r := range reqs {
			req, err := checkRequest(subject, r)
			out[i] = batchDecoded(i, req, err)
		}
		return out, nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("undecodable batch: %v", err)
	}
	if len(raw) != n {
		return nil, fmt.Errorf("batch of %d requests says %s %d", len(raw), BatchHeader, n)
	}
	out := make([]Decoded, n)
	for i, r := range raw {
		req, err := DecodeRequest(subject, r)
		out[i] = batchDecoded(i, req, err)
	}
	return out, nil
}

func batchDecoded(i int, req Request, err error) Decoded {
	if err == nil && req.Op == OpVoid {
		err = errors.New("a void is never part of a batch")
	}
	return Decoded{Index: i, Request: req, Err: err}
}
