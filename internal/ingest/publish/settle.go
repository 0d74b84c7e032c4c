package publish

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/wire"
)

// Settling a request whose PubAck was lost. Such a write answered 503 with
// its request id: it may be stored. Its id must still reach a final state,
// whatever crashes meanwhile, so:
//
//  1. the issuing ingest keeps publishing the same message (same
//     Nats-Msg-Id, so at most one copy is stored) in the background, with
//     backoff, until a PubAck says stored or duplicate, for as long as the
//     copies are inside the stream's duplicate window (until the id's time
//     + window - margin);
//  2. if none is confirmed by then, it publishes a void (wire.OpVoid) with
//     the same Nats-Msg-Id in the request's partition, and keeps trying
//     until the broker confirms it;
//  3. any ingest asked to poll an id it issued that still reads pending
//     after the id's time + window + margin publishes the void itself: that
//     covers an issuing ingest that died or was stopped.
//
// The original and its void dedupe each other inside the window; outside
// it the first of them in the partition's order decides (wire/void.go), so
// whichever way the race goes the id has exactly one answer. Timing only
// decides which answer; it never allows two. At most settleMax ids are
// followed at once; beyond that a write's void is published at once (one
// attempt, not followed), and a later poll settles what that missed.

// Defaults of the settling.
const (
	// DefaultSettleMax bounds the ids an instance republishes or voids at
	// once.
	DefaultSettleMax = 10_000
	// settleVoided bounds the ids whose void this instance saw confirmed,
	// so a poll does not publish a void again while it waits for the
	// allocator.
	settleVoided = 100_000
)

// settleMargin is the time kept between the last copy of a request and the
// end of its duplicate window, and added to the window before a poll voids
// an id: a tenth of the window, between 1s and 10s.
func settleMargin(window time.Duration) time.Duration {
	return min(max(window/10, time.Second), 10*time.Second)
}

// VoidAfter is how long after its id's time an id that still reads pending
// is voided by the first poll that asks for it: the duplicate window of the
// request stream plus settleMargin.
func VoidAfter(window time.Duration) time.Duration { return window + settleMargin(window) }

// settler republishes and voids the requests whose PubAck was lost.
type settler struct {
	p      *Publisher
	max    int
	window atomic.Int64 // the request stream's duplicate window, in nanoseconds
	parts  atomic.Int64 // the request stream's partitions

	mu     sync.Mutex
	busy   map[string]bool // ids being republished or voided here
	closed bool
	voided *lru.Cache[string, struct{}]
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newSettler(p *Publisher, max int) *settler {
	voided, _ := lru.New[string, struct{}](settleVoided)
	ctx, cancel := context.WithCancel(context.Background())
	t := &settler{p: p, max: max, busy: make(map[string]bool), voided: voided, ctx: ctx, cancel: cancel}
	t.configure(bus.DefaultRequestDuplicates, 1)
	return t
}

// configure takes the request stream's duplicate window and partitions.
func (t *settler) configure(window time.Duration, partitions int) {
	if window > 0 {
		t.window.Store(int64(window))
	}
	t.parts.Store(int64(max(partitions, 1)))
}

// settings are the duplicate window and the partitions (every write reads
// them: no lock).
func (t *settler) settings() (time.Duration, int) {
	return time.Duration(t.window.Load()), int(t.parts.Load())
}

// stop ends every republishing and voiding and waits for them. What is left
// unsettled is settled by the first poll after the bound.
func (t *settler) stop() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.cancel()
	t.wg.Wait()
}

// take marks id busy; false when it already is, the service stops, or
// (full) the bound is reached.
func (t *settler) take(id string) (ok, full bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.busy[id] {
		return false, false
	}
	if len(t.busy) >= t.max {
		return false, true
	}
	t.busy[id] = true
	t.wg.Add(1)
	t.p.m.Settle.Active.Inc()
	return true, false
}

func (t *settler) release(id string) {
	t.mu.Lock()
	delete(t.busy, id)
	t.mu.Unlock()
	t.p.m.Settle.Active.Dec()
	t.wg.Done()
}

// adopt follows msg, a request whose PubAck was lost, until it is settled.
// user is the request's user_id and p its partition.
func (t *settler) adopt(msg *nats.Msg, id string, uid uuid.UUID, user int64, p int) {
	ok, full := t.take(id)
	if full {
		t.overflow(id, user, p)
		return
	}
	if !ok {
		return
	}
	go func() {
		defer t.release(id)
		if t.republish(msg, id, uid) {
			return
		}
		t.p.m.Settle.Voids.WithLabelValues("issuer").Inc()
		t.void(id, user, p)
	}()
}

// pollVoid voids id, which a poll found pending past VoidAfter, unless a
// void of it is already under way or confirmed here.
func (t *settler) pollVoid(id string, user int64, p int) {
	if t.voided.Contains(id) {
		return
	}
	ok, full := t.take(id)
	if full {
		t.overflow(id, user, p)
		return
	}
	if !ok {
		return
	}
	t.p.m.Settle.Voids.WithLabelValues("poll").Inc()
	go func() {
		defer t.release(id)
		t.void(id, user, p)
	}()
}

// overflow publishes id's void once, unfollowed: the bound is reached.
func (t *settler) overflow(id string, user int64, p int) {
	t.p.m.Settle.Voids.WithLabelValues("overflow").Inc()
	msg, err := t.voidMsg(id, user, p)
	if err != nil {
		return
	}
	// Without a reply subject: the broker stores it and answers nothing, so
	// no PubAck is waited for or kept.
	msg.Header.Set(jetstream.MsgIDHeader, id)
	msg.Header.Set(jetstream.ExpectedStreamHeader, wire.RequestStream)
	if err := t.p.nc.PublishMsg(msg); err != nil {
		t.p.log.Warn("void not published", slog.String("request_id", id), slog.Any("err", err))
	}
}

// backoff is the pause before the attempt-th background publish.
func backoff(attempt int) time.Duration {
	return min(100*time.Millisecond<<min(attempt, 5), 2*time.Second)
}

// republish publishes msg again until a PubAck confirms it, and reports
// whether one did; false once its copies would leave the duplicate window
// (or the service stops).
func (t *settler) republish(msg *nats.Msg, id string, uid uuid.UUID) bool {
	window, _ := t.settings()
	until := IDTime(uid).Add(window - settleMargin(window))
	for attempt := 0; ; attempt++ {
		wait := backoff(attempt)
		if time.Now().Add(wait).After(until) {
			return false
		}
		select {
		case <-t.ctx.Done():
			return false
		case <-time.After(wait):
		}
		if !t.p.nc.IsConnected() {
			// A copy published now would wait in the client's reconnect
			// buffer; the next attempt after the reconnection does better.
			continue
		}
		t.p.m.Settle.Copies.Inc()
		ack, err := t.publish(msg, id)
		if err == nil {
			how := "stored"
			if ack.Duplicate {
				how = "duplicate"
			}
			t.p.m.Settle.Confirmed.WithLabelValues(how).Inc()
			t.p.log.Info("request confirmed stored after its PubAck was lost", slog.String("request_id", id),
				slog.Uint64("seq", ack.Sequence), slog.Bool("duplicate", ack.Duplicate))
			return true
		}
		if t.ctx.Err() != nil {
			return false
		}
	}
}

// void publishes id's void until the broker confirms it (stored, or a
// duplicate of the original or of an earlier void) or the service stops.
func (t *settler) void(id string, user int64, p int) {
	msg, err := t.voidMsg(id, user, p)
	if err != nil {
		t.p.log.Error("encode void", slog.String("request_id", id), slog.Any("err", err))
		return
	}
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			select {
			case <-t.ctx.Done():
				return
			case <-time.After(backoff(attempt)):
			}
		}
		if !t.p.nc.IsConnected() {
			continue // as in republish: wait for the connection
		}
		ack, err := t.publish(msg, id)
		if err == nil {
			t.voided.Add(id, struct{}{})
			t.p.m.Settle.Stored.Inc()
			t.p.log.Info("request id voided", slog.String("request_id", id), slog.Int("partition", p),
				slog.Uint64("seq", ack.Sequence), slog.Bool("duplicate", ack.Duplicate))
			return
		}
		if t.ctx.Err() != nil {
			return
		}
		if attempt == 0 {
			t.p.log.Warn("void not confirmed; trying again", slog.String("request_id", id), slog.Any("err", err))
		}
	}
}

// voidMsg is the void of id, on the carrier subject of partition p.
func (t *settler) voidMsg(id string, user int64, p int) (*nats.Msg, error) {
	_, parts := t.settings()
	data, err := json.Marshal(wire.Request{RequestID: id, Op: wire.OpVoid, UserID: user, ReceivedAt: time.Now().UTC()})
	if err != nil {
		return nil, err
	}
	msg := &nats.Msg{Subject: wire.RequestSubject(bus.VoidCarrier(p, parts)), Data: data, Header: make(nats.Header, 3)}
	msg.Header.Set(wire.OpsHeader, wire.OpsOf(wire.OpVoid))
	return msg, nil
}

// publish publishes msg with Nats-Msg-Id id and waits for its PubAck, at
// most PublishTimeout. A synchronous publish: a PubAck that never comes
// leaves nothing behind.
func (t *settler) publish(msg *nats.Msg, id string) (*jetstream.PubAck, error) {
	ctx, cancel := context.WithTimeout(t.ctx, t.p.timeout)
	defer cancel()
	m := &nats.Msg{Subject: msg.Subject, Data: msg.Data, Header: make(nats.Header, len(msg.Header)+2)}
	for k, v := range msg.Header {
		m.Header[k] = append([]string(nil), v...)
	}
	ack, err := t.p.js.PublishMsg(ctx, m, jetstream.WithMsgID(id), jetstream.WithExpectStream(wire.RequestStream))
	if err != nil {
		return nil, err
	}
	return ack, nil
}

// IDTime is the time a UUIDv7 was minted at.
func IDTime(id uuid.UUID) time.Time {
	sec, nsec := id.Time().UnixTime()
	return time.Unix(sec, nsec)
}

// inProcess reports whether err is the broker's "duplicate message id is
// in process" (10158): a copy with this Nats-Msg-Id is being stored right
// now, so the request exists (or is about to); it is never "nothing
// stored".
func inProcess(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && api.ErrorCode == jetstream.ErrorCode(10158)
}
