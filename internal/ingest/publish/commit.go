package publish

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/wire"
)

// Group commit. With the broker fsyncing every write (sync: always, the
// embedded server's default) a stream stores one message per fsync, and
// every stored message is acknowledged, delivered to every ingest's tail
// and to the allocator. Databases answer that with group commit, and so
// does ingest, twice over:
//
//   - requests that arrive while the broker is busy queue up, and the queue
//     (a group) is taken at once;
//   - within a group, the requests for one activity (one subject), in
//     arrival order, become ONE message when there are two or more: a
//     batch (wire.BatchHeader, wire.EncodeBatch of the encoded requests),
//     with a Nats-Msg-Id of its own, at most MaxBatch requests and
//     maxBatchBytes per message. A lone request stays a plain message
//     whose Nats-Msg-Id is its request id.
//
// Every message carries wire.OpsHeader, so that a tail decides from headers
// alone whether it can change a claim's answer. A request's place is
// (PubAck sequence of its message, its index in it).
//
// The messages of a group go out as one JetStream atomic batch, stored
// with a single fsync (nats-server 2.12+, AllowAtomicPublish on
// ALLOT_REQUESTS), when there are at least MinBatch of them (many
// activities at once); else, and whenever an atomic batch cannot be done
// (a server without atomic publish, a duplicate id, a lost answer), as
// ordinary pipelined publishes of the same messages with the same ids,
// which the broker's duplicate window turns into the original sequences
// when the atomic batch was stored after all.
//
// A batch message whose PubAck does not come is published again with the
// same Nats-Msg-Id (stored once) within the group's budget. If it is still
// unconfirmed, its requests are answered "batched, maybe stored", and each
// is published alone by its caller (Publish): such a request may be stored
// twice, which is safe (a request id is applied once) but leaves its place
// unsure, so it is never shed.
//
// Order: within a group, an activity's requests keep their arrival order
// in their messages, and its messages go out in that order (one atomic
// batch, or pipelined on one connection, which the broker stores in
// order). Only a copy published again after a lost PubAck that had not in
// fact been stored can land behind a later message of the same group;
// every request of a group was in flight at the same time, so no client
// saw one answered before it sent another, and causal order always holds.

// Defaults of the group commit.
const (
	DefaultCommitMinBatch = 16
	// DefaultCommitMaxBatch is the server's default limit on an atomic
	// batch: the most messages a group publishes.
	DefaultCommitMaxBatch = 1000
	// DefaultBatchMax is the most requests in one message.
	DefaultBatchMax = wire.MaxBatch
	// maxBatchBytes bounds a batch message's body, well below the broker's
	// max_payload (1 MiB).
	maxBatchBytes = 512 << 10
	// maxGroup bounds the requests taken into one group.
	maxGroup = 8 * DefaultCommitMaxBatch
	// commitWorkers is how many groups may be in flight at once. One: the
	// server stores a stream's messages one after another, so a second
	// worker only halves the groups and doubles their fixed cost.
	commitWorkers = 1
)

// pubRequest is one request waiting for its PubAck.
type pubRequest struct {
	msg   *nats.Msg
	id    string
	op    wire.Op
	until time.Time      // the caller waits for an answer until then
	res   chan pubResult // buffered 1
	// twins are later uses of the same request id in the same group (one
	// Idempotency-Key used at once): they are answered with this one's
	// outcome and not published again.
	twins []*pubRequest
}

// pubResult is a publish's outcome. sent reports whether a copy may have
// reached the broker (false only when none left the process, or the broker
// refused the only one); batched that the request went out in a batch
// message. On success the request's place is (ack.Sequence, index).
type pubResult struct {
	ack     *jetstream.PubAck
	index   int
	sent    bool
	batched bool
	err     error
}

// outMsg is one message of a group: a single request or a batch.
type outMsg struct {
	msg   *nats.Msg
	id    string // Nats-Msg-Id
	reqs  []*pubRequest
	bytes int
}

func (m *outMsg) batch() bool { return len(m.reqs) > 1 }

// committer publishes request messages, grouping them under load.
type committer struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	log      *slog.Logger
	in       chan *pubRequest
	minBatch int // < 0: never an atomic batch
	maxBatch int // messages in an atomic batch
	batchMax int // requests in a message; 1: no batches
	// noAtomic is set once the server refused atomic publishing: from then
	// on every message goes out on its own.
	noAtomic atomic.Bool
	batches  func(n int) // observes committed atomic batches' messages; may be nil
	perMsg   func(n int) // observes the requests of every message published; may be nil
	// dropAck, when set (tests), is asked for every PubAck of a batch
	// message; true drops it, as if it were lost.
	dropAck func(id string) bool
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
				for len(group) < maxGroup {
					select {
					case r := <-c.in:
						group = append(group, r)
					default:
						break collect
					}
				}
				c.commit(group)
			}
		}()
	}
}

// commit publishes one group, by the earliest time one of its callers
// waits until. A request whose caller no longer waits is not published: it
// is told nothing left the process.
func (c *committer) commit(group []*pubRequest) {
	now := time.Now()
	live := group[:0]
	var deadline time.Time
	for _, r := range group {
		if !r.until.After(now) {
			r.res <- pubResult{err: errors.New("the publish deadline passed in the queue")}
			continue
		}
		if deadline.IsZero() || r.until.Before(deadline) {
			deadline = r.until
		}
		live = append(live, r)
	}
	group = live
	for len(group) > 0 {
		msgs, rest := c.messages(group)
		group = rest
		if c.perMsg != nil {
			for _, m := range msgs {
				c.perMsg(len(m.reqs))
			}
		}
		if len(msgs) >= c.minBatch && c.minBatch > 0 && !c.noAtomic.Load() &&
			c.commitBatch(msgs, time.Until(deadline)/2) {
			continue
		}
		c.publishEach(msgs, deadline)
	}
}

// messages makes the messages of group, in order: the requests of one
// activity, in arrival order, go into as few messages as the bounds allow;
// a message is placed where its first request arrived. At most maxBatch
// messages; the requests beyond are returned.
func (c *committer) messages(group []*pubRequest) (msgs []*outMsg, rest []*pubRequest) {
	open := make(map[string]*outMsg) // the subject's last message, while it has room
	first := make(map[string]*pubRequest, len(group))
	for i, r := range group {
		if f, ok := first[r.id]; ok {
			// The same request again (one key used twice at once): one
			// copy, one place, both answered with it.
			f.twins = append(f.twins, r)
			continue
		}
		first[r.id] = r
		m := open[r.msg.Subject]
		if m == nil || len(m.reqs) >= c.batchMax || m.bytes+1+len(r.msg.Data) > maxBatchBytes {
			if len(msgs) == c.maxBatch {
				return c.build(msgs), group[i:]
			}
			m = &outMsg{}
			msgs = append(msgs, m)
			open[r.msg.Subject] = m
		}
		m.reqs = append(m.reqs, r)
		m.bytes += 1 + len(r.msg.Data)
	}
	return c.build(msgs), nil
}

// build fills each message's body, headers and Nats-Msg-Id.
func (c *committer) build(msgs []*outMsg) []*outMsg {
	for _, m := range msgs {
		if !m.batch() {
			r := m.reqs[0]
			m.msg, m.id = r.msg, r.id
			m.msg.Header.Set(wire.OpsHeader, wire.OpsOf(r.op))
			continue
		}
		data := make([][]byte, len(m.reqs))
		ops := make([]wire.Op, len(m.reqs))
		for i, r := range m.reqs {
			data[i], ops[i] = r.msg.Data, r.op
		}
		m.msg = &nats.Msg{Subject: m.reqs[0].msg.Subject, Data: wire.EncodeBatch(data), Header: make(nats.Header, 6)}
		m.msg.Header.Set(wire.BatchHeader, strconv.Itoa(len(m.reqs)))
		m.msg.Header.Set(wire.OpsHeader, wire.OpsOf(ops...))
		traceBatch(m)
		m.id = uuid.Must(uuid.NewV7()).String()
	}
	return msgs
}

// answer tells every request of m its place in m, stored at ack.
func answer(m *outMsg, ack *jetstream.PubAck) {
	for i, r := range m.reqs {
		res := pubResult{ack: ack, index: i, sent: true, batched: m.batch()}
		r.res <- res
		for _, t := range r.twins {
			t.res <- res
		}
	}
}

// fail tells every request of m that m was not confirmed.
func fail(m *outMsg, sent bool, err error) {
	for _, r := range m.reqs {
		res := pubResult{sent: sent, batched: m.batch(), err: err}
		r.res <- res
		for _, t := range r.twins {
			t.res <- res
		}
	}
}

// errNoAck is a PubAck that did not come in time.
var errNoAck = errors.New("no PubAck in time")

// publishEach publishes every message of msgs on its own, pipelined, and
// answers every request by deadline. A batch message that is not confirmed
// is published again, with the same Nats-Msg-Id, once half the time is
// gone; a single request is answered at once, and its caller publishes it
// again itself.
func (c *committer) publishEach(msgs []*outMsg, deadline time.Time) {
	type pending struct {
		m     *outMsg
		f     jetstream.PubAckFuture
		maybe bool // a copy of m may be stored
		last  error
	}
	var todo []*pending
	send := func(p *pending) bool {
		f, err := c.js.PublishMsgAsync(p.m.msg, jetstream.WithMsgID(p.m.id), jetstream.WithExpectStream(wire.RequestStream))
		if err != nil {
			p.last = err
			return false
		}
		p.f = f
		return true
	}
	for _, m := range msgs {
		p := &pending{m: m}
		if !send(p) {
			fail(m, false, p.last)
			continue
		}
		todo = append(todo, p)
	}
	// Two rounds: the first waits until half the time is gone; the second
	// (batch messages published again) until deadline.
	rounds := [2]time.Time{time.Now().Add(time.Until(deadline) / 2), deadline}
	var timer *time.Timer // one for both rounds
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for round, until := range rounds {
		if len(todo) == 0 {
			break
		}
		if timer == nil {
			timer = time.NewTimer(time.Until(until))
		} else {
			timer.Reset(time.Until(until)) // no stale tick survives a Reset (Go 1.23+ timers)
		}
		var again []*pending
		expired := false
		for _, p := range todo {
			if p.f == nil {
				again = append(again, p)
				continue
			}
			var (
				ack *jetstream.PubAck
				err error
			)
			if !expired {
				select {
				case ack = <-p.f.Ok():
				case err = <-p.f.Err():
				case <-timer.C:
					expired = true
				}
			}
			if expired && ack == nil && err == nil {
				select { // the time is up: take only what has come
				case ack = <-p.f.Ok():
				case err = <-p.f.Err():
				default:
					err = errNoAck
				}
			}
			if ack != nil && p.m.batch() && c.dropAck != nil && c.dropAck(p.m.id) {
				ack, err = nil, errNoAck
			}
			switch {
			case ack != nil:
				answer(p.m, ack)
			case refused(err) && p.m.batch() && p.maybe:
				fail(p.m, true, err) // this copy is refused; an earlier one may be stored
			case refused(err):
				fail(p.m, false, err) // the only copy is not stored
			default:
				p.maybe, p.last = true, err
				again = append(again, p)
			}
		}
		todo = todo[:0]
		for _, p := range again {
			if round == len(rounds)-1 || !p.m.batch() {
				fail(p.m, p.maybe, p.last)
				continue
			}
			p.f = nil
			send(p) // a failure leaves p.f nil: answered in the last round
			todo = append(todo, p)
		}
	}
}

// commitBatch publishes msgs as one atomic batch, waiting at most timeout,
// and reports whether it answered every request in it. On false nothing
// has been answered and the caller publishes the messages on their own.
func (c *committer) commitBatch(msgs []*outMsg, timeout time.Duration) bool {
	defer traceGroup(msgs)()
	n := len(msgs)
	nm, ids := make([]*nats.Msg, n), make([]string, n)
	for i, m := range msgs {
		nm[i], ids[i] = m.msg, m.id
	}
	first, err := bus.PublishAtomic(c.nc, wire.RequestStream, nm, ids, timeout)
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
	for i, m := range msgs {
		answer(m, &jetstream.PubAck{Stream: wire.RequestStream, Sequence: first + uint64(i)})
	}
	if c.batches != nil {
		c.batches(n)
	}
	return true
}

// publish queues msg, a request with op, and waits for its outcome, at
// most until deadline (the committer answers by then; a little more is
// waited for, in case it is late). msg belongs to the committer from then
// on: publishing sets headers on it, possibly after publish returned
// unconfirmed, so a caller that publishes the request again does so with a
// copy (copyMsg).
func (c *committer) publish(msg *nats.Msg, op wire.Op, id string, deadline time.Time) pubResult {
	r := &pubRequest{msg: msg, id: id, op: op, until: deadline, res: make(chan pubResult, 1)}
	var timer *time.Timer
	select {
	case c.in <- r:
	default: // the queue is full: wait for room, at most until deadline
		timer = time.NewTimer(time.Until(deadline))
		defer timer.Stop()
		select {
		case c.in <- r:
		case <-timer.C:
			return pubResult{err: errors.New("publish queue full")}
		}
	}
	if timer == nil {
		timer = time.NewTimer(time.Until(deadline) + 50*time.Millisecond)
		defer timer.Stop()
	} else {
		timer.Reset(time.Until(deadline) + 50*time.Millisecond)
	}
	select {
	case res := <-r.res:
		return res
	case <-timer.C:
		// It may have gone out in a batch that is still being published.
		return pubResult{sent: true, batched: true, err: errNoAck}
	}
}

// copyMsg is a copy of msg whose headers can be set apart from msg's.
func copyMsg(msg *nats.Msg) *nats.Msg {
	own := &nats.Msg{Subject: msg.Subject, Data: msg.Data, Header: make(nats.Header, len(msg.Header)+3)}
	for k, v := range msg.Header {
		own.Header[k] = slices.Clone(v)
	}
	return own
}
