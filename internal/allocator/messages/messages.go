// Package messages reads the stored messages of the request stream as the
// allocator applies them: a message expanded into its requests, each at
// its place (wire.Place), and how many whole messages one transaction
// takes.
package messages

import (
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/wire"
)

// Request is one request of a message at its place, or why it is refused
// alone there (Err; Req then holds what could be read of it).
type Request struct {
	Index int
	Place uint64
	Req   wire.Request
	Err   error
}

// Expand reads the message stored at seq on subject, with BatchHeader
// batch (empty for a single request), as its requests in order, each
// checked against its subject and the partition count. An error means the
// message is malformed as a whole: it is refused at (seq, 0) and nothing
// in it is applied.
func Expand(seq uint64, subject, batch string, data []byte, partitions int) ([]Request, error) {
	decoded, err := wire.DecodeMessage(subject, batch, data)
	if err != nil {
		return nil, err
	}
	out := make([]Request, len(decoded))
	for i, d := range decoded {
		err := d.Err
		if err == nil {
			err = bus.CheckRequestSubject(subject, d.Request, partitions)
		}
		out[i] = Request{Index: d.Index, Place: wire.Place(seq, d.Index), Req: d.Request, Err: err}
	}
	return out, nil
}

// Count is how many requests a message with BatchHeader batch carries, as
// the transaction bound counts them: 1 for a single request, and for a
// header that is not a batch size (such a message is refused whole).
func Count(batch string) int {
	if n, err := wire.BatchSize(batch); err == nil && n > 0 {
		return n
	}
	return 1
}

// Take is how many of n messages (counts(i) requests in message i) one
// transaction takes: whole messages, in order, until their requests reach
// bound; always at least one.
func Take(n, bound int, counts func(i int) int) int {
	reqs := 0
	for i := range n {
		if i > 0 && reqs >= bound {
			return i
		}
		reqs += counts(i)
	}
	return n
}
