// Package publish stores request messages in the request stream: the
// group commit (commit.go) that publishes a queue of requests as few
// messages (one batch per activity) and those as one atomic batch, the
// PubAck wait and its retries with the same Nats-Msg-Id
// (Publish), and the settling of a request whose PubAck was lost, which is
// republished in the background or else voided (settle.go), so that every
// request id a client is given reaches a final state.
package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/wire"
)

// Config is the publishing's part of ingest's configuration.
type Config struct {
	// PublishTimeout bounds one publish, PubAck included
	// (ALLOT_INGEST_PUBLISH_TIMEOUT).
	PublishTimeout time.Duration
	// MaxInFlight bounds the publishes awaiting their PubAck
	// (ALLOT_INGEST_MAX_IN_FLIGHT); beyond, ErrOverloaded.
	MaxInFlight int
	// CommitMinBatch is the fewest messages of a group published as one
	// atomic batch (ALLOT_INGEST_COMMIT_MIN_BATCH); negative: never.
	CommitMinBatch int
	// BatchMax is the most requests in one message
	// (ALLOT_INGEST_BATCH_MAX); 1: no batches.
	BatchMax int
	// SettleMax bounds the ids settled at once (DefaultSettleMax in
	// production).
	SettleMax int
	// DropBatchAck, when set (tests only), is asked for every PubAck of a
	// batch message the group commit receives; true drops it as if it
	// were lost, so that the batch is published again.
	DropBatchAck func(id string) bool
}

// Metrics are the publishing's series; ingest registers them.
type Metrics struct {
	PublishDuration prometheus.Histogram
	PublishFailures prometheus.Counter
	CommitBatch     prometheus.Histogram // messages per atomic batch
	MessageRequests prometheus.Histogram // requests per message
	Settle          SettleMetrics
}

// SettleMetrics are the series of settling (settle.go).
type SettleMetrics struct {
	Active    prometheus.Gauge
	Copies    prometheus.Counter
	Confirmed *prometheus.CounterVec // how: stored, duplicate
	Voids     *prometheus.CounterVec // by: issuer, poll, overflow
	Stored    prometheus.Counter
}

// Publisher publishes ingest's request messages.
type Publisher struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	log     *slog.Logger
	timeout time.Duration
	flight  chan struct{} // one token per publish in flight
	commit  *committer    // nil when CommitMinBatch < 0 and BatchMax is 1
	settle  *settler
	m       Metrics
	stop    context.CancelFunc
}

// New returns a Publisher over nc and js. It does no I/O; Start starts the
// group commit.
func New(cfg Config, nc *nats.Conn, js jetstream.JetStream, log *slog.Logger, m Metrics) *Publisher {
	p := &Publisher{nc: nc, js: js, log: log, timeout: cfg.PublishTimeout,
		flight: make(chan struct{}, cfg.MaxInFlight), m: m}
	p.settle = newSettler(p, cfg.SettleMax)
	batchMax := min(max(cfg.BatchMax, 1), wire.MaxBatch)
	if cfg.CommitMinBatch > 0 || batchMax > 1 {
		p.commit = &committer{nc: nc, js: js, log: log, in: make(chan *pubRequest, cfg.MaxInFlight),
			minBatch: cfg.CommitMinBatch, maxBatch: DefaultCommitMaxBatch, batchMax: batchMax,
			batches: func(n int) { m.CommitBatch.Observe(float64(n)) },
			perMsg:  func(n int) { m.MessageRequests.Observe(float64(n)) },
			dropAck: cfg.DropBatchAck}
	}
	return p
}

// Start runs the group commit until Stop.
func (p *Publisher) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	p.stop = cancel
	if p.commit != nil {
		p.commit.run(ctx)
	}
}

// Stop ends the group commit and every republishing and voiding, and
// waits for the latter.
func (p *Publisher) Stop() {
	if p.stop != nil {
		p.stop()
	}
	p.settle.stop()
}

// StopSettling ends every republishing and voiding and waits for them, as
// Stop does; what is left unsettled is settled by the first poll after
// VoidAfter.
func (p *Publisher) StopSettling() { p.settle.stop() }

// InFlight is the number of publishes awaiting their PubAck.
func (p *Publisher) InFlight() int { return len(p.flight) }

// Configure takes the request stream's duplicate window and partitions,
// as Start found them.
func (p *Publisher) Configure(window time.Duration, partitions int) {
	p.settle.configure(window, partitions)
}

// Settings are the request stream's duplicate window and partitions.
func (p *Publisher) Settings() (time.Duration, int) { return p.settle.settings() }

// Settle follows a request with op whose Publish returned ErrMaybeStored
// until it is settled: republished, else voided. user is its user_id and
// part its partition.
func (p *Publisher) Settle(activity int64, op wire.Op, id string, data []byte, user int64, part int) {
	if u, err := uuid.Parse(id); err == nil {
		p.settle.adopt(requestMsg(activity, op, data), id, u, user, part)
	}
}

// requestMsg is the message of a single request with op on activity.
func requestMsg(activity int64, op wire.Op, data []byte) *nats.Msg {
	msg := &nats.Msg{Subject: wire.RequestSubject(activity), Data: data, Header: make(nats.Header, 3)}
	msg.Header.Set(wire.OpsHeader, wire.OpsOf(op))
	return msg
}

// Stored is where Publish stored a request.
type Stored struct {
	// Place is the request's place, wire.Place(seq, index).
	Place uint64
	// Sole reports that Place holds the only copy this ingest may have
	// stored. It is false when the request went out in a batch whose
	// PubAck was lost and then alone: the request may be stored twice, and
	// which copy the allocator applies (the first) is not known here, so
	// its answer must not be given from Place (shedding).
	Sole bool
}

// PollVoid voids id, which a poll found pending past VoidAfter, unless a
// void of it is already under way or confirmed here.
func (p *Publisher) PollVoid(id string, user int64, part int) { p.settle.pollVoid(id, user, part) }

// Publish stores one request with op (encoded as data) in ALLOT_REQUESTS,
// alone or in a batch of its activity's requests (group commit), and waits
// for the PubAck. Every use of an Idempotency-Key publishes the same
// request: uses in one group share one copy, and copies in different
// messages are one request to the allocator, which applies a request id
// once and answers its repeats with the recorded result. Each copy of a message keeps its Nats-Msg-Id (the request
// id for a single request, the batch's own for a batch), so JetStream
// drops a re-publish within its duplicate window. The publish is not cut
// short when the client leaves: its outcome is logged either way.
func (p *Publisher) Publish(ctx context.Context, activity int64, op wire.Op, id string, data []byte) (Stored, error) {
	select {
	case p.flight <- struct{}{}:
		defer func() { <-p.flight }()
	default:
		p.m.PublishFailures.Inc()
		return Stored{}, fmt.Errorf("%w: %d publishes already in flight", ErrOverloaded, cap(p.flight))
	}
	msg := requestMsg(activity, op, data)
	ctx, span := tracePublish(ctx, msg, id, activity)
	start := time.Now()
	st, ack, err := p.publishAsync(msg, op, id)
	endPublish(span, ack, st, err)
	p.m.PublishDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		p.m.PublishFailures.Inc()
		p.log.WarnContext(ctx, "publish request", slog.String("request_id", id),
			slog.Int64("activity_id", activity), slog.Any("err", err))
		return Stored{}, fmt.Errorf("%w: publish %s: %w", bus.ErrUnavailable, id, err)
	}
	if p.log.Enabled(ctx, slog.LevelDebug) {
		p.log.DebugContext(ctx, "request published", slog.String("request_id", id),
			slog.Int64("activity_id", activity), slog.String("place", wire.FormatPlace(st.Place)),
			slog.Bool("sole", st.Sole), slog.Bool("duplicate", ack.Duplicate))
	}
	return st, nil
}

// ErrOverloaded means the in-flight bound is reached: 503 at once.
var ErrOverloaded = errors.New("too many publishes in flight")

// ErrMaybeStored means a copy of the request left the process and no
// answer came back: the broker may have stored it. The client is told the
// request id, to poll it, rather than "nothing was stored", which would
// send it to retry into a second request.
var ErrMaybeStored = errors.New("the request may have been stored")

// refused reports whether err is the broker's definite answer that it did
// not store this copy: an error in the PubAck (the stream is full, it is
// not the stream the request was meant for, the message is too large…)
// or no stream listening on the subject. Waiting does not change such an
// answer, so it is given at once instead of holding an in-flight slot
// until the deadline.
func refused(err error) bool {
	if inProcess(err) {
		return false // another copy with this id is being stored
	}
	_, api := errors.AsType[*jetstream.APIError](err)
	return api || errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders)
}

// publishAsync publishes without a round trip of its own: many handlers'
// messages share the connection's pipeline and their PubAcks come back
// asynchronously; this handler waits for its own, at most PublishTimeout.
//
// The first copy goes out through the group commit (commit.go), alone or
// in a batch. A publish that left the process but got no PubAck (the
// broker went away, a timeout) may or may not be stored. It is published
// again, alone, with Nats-Msg-Id = the request id, until the deadline:
// once the broker answers, a stored copy of the request alone comes back
// as a duplicate and the client gets its 202; a request whose batch was
// not confirmed may be stored twice then (Stored.Sole is false). If the
// deadline passes first, the error wraps ErrMaybeStored. A copy the broker
// refused for a definite reason (refused) is answered at once; "nothing
// stored" holds then only if no earlier copy may be stored.
func (p *Publisher) publishAsync(msg *nats.Msg, op wire.Op, id string) (Stored, *jetstream.PubAck, error) {
	// The group commit gets half the budget, so that a copy whose answer
	// was lost there leaves time to publish it again below.
	start := time.Now()
	until := start.Add(p.timeout / 2)
	var (
		last  error
		maybe bool // a copy left the process and got no answer
		sole  = true
	)
	unconfirmed := func() (Stored, *jetstream.PubAck, error) {
		if maybe {
			return Stored{}, nil, fmt.Errorf("%w: no PubAck within %s: %w", ErrMaybeStored, p.timeout, last)
		}
		return Stored{}, nil, fmt.Errorf("no PubAck within %s: %w", p.timeout, last)
	}
	first := 0
	if p.commit != nil {
		// The committer owns msg from now on (it sets headers on it, maybe
		// after answering): a copy is kept for publishing again, made
		// before, and made only when a trace's headers would be lost by
		// building the request's message afresh.
		subject, data := msg.Subject, msg.Data
		var spare *nats.Msg
		if len(msg.Header) > 1 {
			spare = copyMsg(msg)
		}
		res := p.commit.publish(msg, op, id, until)
		if res.err != nil {
			if msg = spare; msg == nil {
				msg = &nats.Msg{Subject: subject, Data: data, Header: make(nats.Header, 3)}
				msg.Header.Set(wire.OpsHeader, wire.OpsOf(op))
			}
		}
		switch {
		case res.err == nil:
			return Stored{Place: wire.Place(res.ack.Sequence, res.index), Sole: true}, res.ack, nil
		case !res.sent && !res.batched:
			return Stored{}, nil, res.err // it never left the process, or was refused: nothing stored
		case !res.sent:
			// Its batch is not stored (refused, or it never left): the
			// request is published alone, as if for the first time.
			last = res.err
		default:
			last, maybe, first = res.err, true, 1
			sole = !res.batched
		}
	}
	deadline := time.NewTimer(time.Until(start.Add(p.timeout)))
	defer deadline.Stop()
	for attempt := first; ; attempt++ {
		if attempt > 0 {
			select {
			case <-deadline.C:
				return unconfirmed()
			case <-time.After(min(time.Duration(attempt)*50*time.Millisecond, 500*time.Millisecond)):
			}
		}
		f, err := p.js.PublishMsgAsync(msg, jetstream.WithMsgID(id), jetstream.WithExpectStream(wire.RequestStream))
		if err != nil {
			if !maybe {
				return Stored{}, nil, err // no copy ever left the process: nothing stored
			}
			last = err // an earlier copy may be stored: keep asking
			continue
		}
		select {
		case ack := <-f.Ok():
			return Stored{Place: wire.Place(ack.Sequence, 0), Sole: sole}, ack, nil
		case err := <-f.Err():
			last = err
			if refused(err) && !maybe {
				return Stored{}, nil, fmt.Errorf("refused: %w", err) // nothing stored
			}
			if refused(err) {
				// This copy is not stored; an earlier one may be, and
				// asking again would get the same refusal.
				return unconfirmed()
			}
			maybe = true
		case <-deadline.C:
			maybe = true
			last = jetstream.ErrAsyncPublishTimeout
			return unconfirmed()
		}
	}
}
