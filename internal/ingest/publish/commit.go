package publish

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/wire"
)

// Group commit. With the broker fsyncing every write (sync: always, the
// embedded server's default) a stream stores one request per fsync: on this
// machine about 1,500 a second, far below a launch night's burst. Databases
// answer that with group commit, and so does ingest: requests that arrive
// while the broker is busy queue up, and the queue is published as one
// JetStream atomic batch, which the server stores with a single fsync
// (nats-server 2.12+, AllowAtomicPublish on ALLOT_REQUESTS). Each request is
// still its own message, with its own Nats-Msg-Id, in arrival order, and a
// batch is all or nothing, so a PubAck still means "durably stored".
//
// A batch costs the server a staging store of its own (a few milliseconds
// here), so small groups go out as ordinary pipelined publishes; only a
// queue of at least MinBatch requests is committed as a batch. Anything a
// batch cannot do (a duplicate id inside it, a server without atomic
// publish, a lost answer) falls back to ordinary publishes of the same
// messages with the same ids, which the broker's duplicate window turns
// into the original sequences when the batch was stored after all.

// Defaults of the group commit.
const (
	DefaultCommitMinBatch = 16
	// DefaultCommitMaxBatch is the server's default limit on an atomic
	// batch.
	DefaultCommitMaxBatch = 1000
	// commitWorkers is how many groups may be in flight at once. One: the
	// server stores a stream's batches one after another, so a second
	// worker only halves the groups and doubles their fixed cost.
	commitWorkers = 1
)

// pubRequest is one request message waiting for its PubAck.
type pubRequest struct {
	msg *nats.Msg
	id  string
	res chan pubResult // buffered 1
}

// pubResult is a publish's outcome. sent reports whether the message may
// have reached the broker (false only when it never left the process).
type pubResult struct {
	ack  *jetstream.PubAck
	sent bool
	err  error
}

// committer publishes request messages, grouping them under load.
type committer struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	log      *slog.Logger
	in       chan *pubRequest
	minBatch int
	maxBatch int
	timeout  time.Duration
	// noAtomic is set once the server refused atomic publishing: from then
	// on every message goes out on its own.
	noAtomic atomic.Bool
	batches  func(n int) // observes committed batch sizes; may be nil
}

// run serves the queue until ctx ends.
func (c *committer) run(ctx context.Context) {
	for range commitWorkers {
		go func() {
			for {
				var first *pubRequest
				select {
				case first = <-c.in:
				case <-ctx.Done():
					return
				}
				group := []*pubRequest{first}
			collect:
				for len(group) < c.maxBatch {
					select {
					case r := <-c.in:
						group = append(group, r)
					default:
						break collect
					}
				}
				if len(group) >= c.minBatch && !c.noAtomic.Load() && c.commitBatch(group) {
					continue
				}
				c.publishEach(group)
			}
		}()
	}
}

// publish queues msg and waits for its outcome, at most until deadline.
func (c *committer) publish(msg *nats.Msg, id string, deadline time.Time) pubResult {
	// The worker gets a copy: publishing sets headers on the message, and
	// the caller may publish msg again while the worker still holds it.
	own := &nats.Msg{Subject: msg.Subject, Data: msg.Data, Header: make(nats.Header, len(msg.Header)+2)}
	for k, v := range msg.Header {
		own.Header[k] = slices.Clone(v)
	}
	r := &pubRequest{msg: own, id: id, res: make(chan pubResult, 1)}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case c.in <- r:
	case <-timer.C:
		return pubResult{err: errors.New("publish queue full")}
	}
	select {
	case res := <-r.res:
		return res
	case <-timer.C:
		return pubResult{sent: true, err: errors.New("no PubAck in time")}
	}
}

// publishEach publishes every message of group on its own, pipelined.
func (c *committer) publishEach(group []*pubRequest) {
	futures := make([]jetstream.PubAckFuture, len(group))
	for i, r := range group {
		f, err := c.js.PublishMsgAsync(r.msg, jetstream.WithMsgID(r.id), jetstream.WithExpectStream(wire.RequestStream))
		if err != nil {
			r.res <- pubResult{err: err}
			continue
		}
		futures[i] = f
	}
	timeout := time.NewTimer(c.timeout)
	defer timeout.Stop()
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case ack := <-f.Ok():
			group[i].res <- pubResult{ack: ack, sent: true}
		case err := <-f.Err():
			group[i].res <- pubResult{sent: true, err: err}
		case <-timeout.C:
			for j := i; j < len(futures); j++ {
				if futures[j] != nil {
					group[j].res <- pubResult{sent: true, err: errors.New("no PubAck in time")}
				}
			}
			return
		}
	}
}

// commitBatch publishes group as one atomic batch and reports whether it
// answered every request in it. On false nothing has been answered and the
// caller publishes the messages on their own.
func (c *committer) commitBatch(group []*pubRequest) bool {
	defer traceGroup(group)()
	n := len(group)
	msgs, ids := make([]*nats.Msg, n), make([]string, n)
	for i, r := range group {
		msgs[i], ids[i] = r.msg, r.id
	}
	first, err := bus.PublishAtomic(c.nc, wire.RequestStream, msgs, ids, c.timeout)
	switch {
	case errors.Is(err, bus.ErrAtomicUnsupported):
		if !c.noAtomic.Swap(true) {
			c.log.Warn("the request stream or the broker does not take atomic batches; publishing one by one", slog.Any("err", err))
		}
		return false
	case errors.Is(err, bus.ErrAtomicRefused):
		c.log.Debug("atomic batch refused; publishing its messages one by one", slog.Int("size", n), slog.Any("err", err))
		return false
	case err != nil:
		c.log.Warn("atomic batch: publishing its messages one by one", slog.Int("size", n), slog.Any("err", err))
		return false
	}
	for i, r := range group {
		r.res <- pubResult{sent: true, ack: &jetstream.PubAck{Stream: wire.RequestStream, Sequence: first + uint64(i)}}
	}
	if c.batches != nil {
		c.batches(n)
	}
	return true
}
