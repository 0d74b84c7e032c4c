package ingest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/wire"
)

// writeHandler serves the write route of op: validate everything, then
// publish, then answer 202 (or 200 with the result when ?wait= sees it).
func (s *Service) writeHandler(op wire.Op) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.write(w, r, op, r.PathValue("activity"), r.PathValue("user"))
	}
}

func (s *Service) write(w http.ResponseWriter, r *http.Request, op wire.Op, aStr, uStr string) {
	body, err := readBody(w, r, s.opts.BodyLimit)
	if err != nil {
		writeInputError(w, err)
		return
	}
	activity, err := parseID(aStr, "activity")
	if err != nil {
		writeInputError(w, err)
		return
	}
	var user int64
	var capacity *int64
	var hold time.Duration
	if op == wire.OpOpen {
		c, h, err := parseOpen(body)
		if err != nil {
			writeInputError(w, err)
			return
		}
		capacity, hold = &c, h
	} else if user, err = parseID(uStr, "user"); err != nil {
		writeInputError(w, err)
		return
	}
	wait, err := parseWait(r.URL.RawQuery, s.opts.MaxWait)
	if err != nil {
		writeInputError(w, err)
		return
	}
	key, hasKey, err := idempotencyKey(r.Header)
	if err != nil {
		writeInputError(w, err)
		return
	}
	if s.limiter != nil && !s.limiter.Allow() {
		retryAfter(w, time.Second)
		writeError(w, http.StatusTooManyRequests, msgRateLimited)
		return
	}
	if op == wire.OpOpen && s.opens != nil && !s.opens.Allow() {
		retryAfter(w, time.Second)
		writeError(w, http.StatusTooManyRequests, msgOpenRateLimited)
		return
	}
	if wait > 0 && s.waiters.count() >= int64(s.opts.MaxWaiters) {
		// Too many handlers wait already: this write is published and
		// answered without waiting (202, or an early answer), as if it had
		// come without ?wait=; the client polls.
		s.metrics.waitersRefused.Inc()
		wait = 0
	}
	if s.users != nil && op != wire.OpOpen {
		if ok, wait := s.users.allow(limitKey(r.Context(), user), time.Now()); !ok {
			retryAfter(w, wait)
			writeError(w, http.StatusTooManyRequests, msgUserRateLimited)
			return
		}
	}
	// A claim for an activity with a view may be answered early, once it
	// is stored (answerEarly). A keyed claim is left to the allocator, so
	// that a repeat of the key reads the recorded result.
	var candidate *shedView
	if op == wire.OpClaim && !hasKey && !s.opts.DisableShed {
		candidate = s.views.get(activity)
	}

	ctx := r.Context()
	_, partitions := s.settle.settings()
	part := bus.PartitionOf(activity, partitions)
	uid, err := s.ids.New(user, part, partitions)
	if err != nil {
		s.log.ErrorContext(ctx, "mint request id", slog.Any("err", err))
		writeError(w, http.StatusInternalServerError, msgInternal)
		return
	}
	id := uid.String()
	data, err := json.Marshal(wire.Request{
		RequestID:      id,
		Op:             op,
		ActivityID:     activity,
		UserID:         user,
		Capacity:       capacity,
		Hold:           wire.Duration(hold),
		IdempotencyKey: key,
		ReceivedAt:     time.Now().UTC(),
	})
	if err != nil {
		s.log.ErrorContext(ctx, "encode request", slog.String("request_id", id), slog.Any("err", err))
		writeError(w, http.StatusInternalServerError, msgInternal)
		return
	}

	repeat := false
	if hasKey {
		path := canonicalPath(op, activity, user)
		boundID, boundData, again, err := s.claimKey(ctx, keyScope(ctx), key, op, path, id, data)
		if err != nil {
			if _, ok := errors.AsType[*inputError](err); ok { // 422: the key is bound elsewhere
				writeInputError(w, err)
				return
			}
			s.log.WarnContext(ctx, "idempotency key unavailable", slog.String("request_id", id), slog.Any("err", err))
			writeError(w, http.StatusServiceUnavailable, msgBrokerDown)
			return
		}
		id, data, repeat = boundID, boundData, again
		if repeat {
			s.metrics.replays.Inc()
		}
	}

	// Register before publishing: the allocator may apply the request and
	// announce its result before PublishMsg even returns.
	var wt *waiter
	if wait > 0 {
		wt = s.waiters.add(id)
		defer s.waiters.remove(id, wt)
	}
	if repeat {
		// Already applied: answer without publishing a copy that JetStream
		// would store again once its duplicate window has passed.
		if res, ok := s.lookup(ctx, id); ok {
			if wait > 0 {
				writeJSON(w, http.StatusOK, res)
			} else {
				writeAck(w, id)
			}
			return
		}
	}
	seq, err := s.publish(ctx, activity, id, data)
	if err != nil {
		if errors.Is(err, errOverloaded) {
			retryAfter(w, time.Second)
			writeError(w, http.StatusServiceUnavailable, msgOverloaded)
			return
		}
		if errors.Is(err, errMaybeStored) {
			// Settled in the background: republished, else voided
			// (settle.go), so the id the client is given reaches a final
			// state.
			if u, perr := uuid.Parse(id); perr == nil {
				s.settle.adopt(&nats.Msg{Subject: wire.RequestSubject(activity), Data: data, Header: make(nats.Header, 2)}, id, u, user, part)
			}
			writeMaybeStored(w, id)
			return
		}
		writeError(w, http.StatusServiceUnavailable, msgBrokerDown)
		return
	}
	if candidate != nil {
		if res, ok := s.answerEarly(ctx, id, activity, user, seq, candidate); ok {
			writeJSON(w, http.StatusOK, res)
			return
		}
	}
	if wait > 0 {
		// A fresh id cannot have a result yet, and a repeat's was read
		// above after registering, so no MySQL read is due before waiting.
		if res, ok := s.await(ctx, id, wt, wait, false); ok {
			writeJSON(w, http.StatusOK, res)
			return
		}
	}
	writeAck(w, id)
}

// limitKey is whose per-user write budget a write spends: the caller's
// subject when authentication is on (so that changing the path's user
// changes nothing), else the path's user.
func limitKey(ctx context.Context, user int64) int64 {
	id, ok := caller(ctx)
	if !ok {
		return user
	}
	if id.User != 0 {
		return id.User
	}
	h := fnv.New64a()
	h.Write([]byte(id.Subject))
	return -int64(h.Sum64()>>1) - 1 // negative: never a user id
}

// keyScope is the scope of the caller's idempotency keys: its subject, or
// "" when authentication is off.
func keyScope(ctx context.Context) string {
	id, _ := caller(ctx)
	return id.Subject
}

// canonicalPath is the path of a write, built from the parsed ids so that
// /v1/activities/007 and /v1/activities/7 are the same path.
func canonicalPath(op wire.Op, activity, user int64) string {
	a := strconv.FormatInt(activity, 10)
	u := strconv.FormatInt(user, 10)
	switch op {
	case wire.OpOpen:
		return "/v1/activities/" + a
	case wire.OpClaim:
		return "/v1/activities/" + a + "/claims/" + u
	case wire.OpConfirm:
		return "/v1/activities/" + a + "/signups/" + u + "/confirm"
	default: // join and cancel share their path; the op tells them apart
		return "/v1/activities/" + a + "/signups/" + u
	}
}

// publish stores one request message in ALLOT_REQUESTS and waits for the
// PubAck. Nats-Msg-Id is the request id, so JetStream drops a re-publish
// within its duplicate window. The publish is not cut short when the client
// leaves: its outcome is logged either way.
func (s *Service) publish(ctx context.Context, activity int64, id string, data []byte) (uint64, error) {
	select {
	case s.flight <- struct{}{}:
		defer func() { <-s.flight }()
	default:
		s.metrics.publishFailures.Inc()
		return 0, fmt.Errorf("%w: %d publishes already in flight", errOverloaded, cap(s.flight))
	}
	msg := &nats.Msg{Subject: wire.RequestSubject(activity), Data: data, Header: make(nats.Header, 2)}
	ctx, span := tracePublish(ctx, msg, id, activity)
	start := time.Now()
	ack, err := s.publishAsync(msg, id)
	endPublish(span, ack, err)
	s.metrics.publishDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		s.metrics.publishFailures.Inc()
		s.log.WarnContext(ctx, "publish request", slog.String("request_id", id),
			slog.Int64("activity_id", activity), slog.Any("err", err))
		return 0, fmt.Errorf("%w: publish %s: %w", bus.ErrUnavailable, id, err)
	}
	if s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.DebugContext(ctx, "request published", slog.String("request_id", id),
			slog.Int64("activity_id", activity), slog.Uint64("seq", ack.Sequence), slog.Bool("duplicate", ack.Duplicate))
	}
	return ack.Sequence, nil
}

// errOverloaded means the in-flight bound is reached: 503 at once.
var errOverloaded = errors.New("too many publishes in flight")

// errMaybeStored means a copy of the request left the process and no
// answer came back: the broker may have stored it. The client is told the
// request id, to poll it, rather than "nothing was stored", which would
// send it to retry into a second request.
var errMaybeStored = errors.New("the request may have been stored")

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
// A publish that left the process but got no PubAck (the broker went away,
// a timeout) may or may not be stored. It is published again with the same
// Nats-Msg-Id until the deadline: once the broker answers, a stored copy
// comes back as a duplicate and the client gets its 202. If the deadline
// passes first, the error wraps errMaybeStored. A copy the broker refused
// for a definite reason (refused) is answered at once; "nothing stored"
// holds then only if no earlier copy may be stored.
func (s *Service) publishAsync(msg *nats.Msg, id string) (*jetstream.PubAck, error) {
	// The group commit gets half the budget, so that a copy whose answer
	// was lost there leaves time to publish it again below.
	until := time.Now().Add(s.opts.PublishTimeout / 2)
	deadline := time.NewTimer(s.opts.PublishTimeout)
	defer deadline.Stop()
	var (
		last  error
		maybe bool // a copy left the process and got no answer
	)
	unconfirmed := func() error {
		if maybe {
			return fmt.Errorf("%w: no PubAck within %s: %w", errMaybeStored, s.opts.PublishTimeout, last)
		}
		return fmt.Errorf("no PubAck within %s: %w", s.opts.PublishTimeout, last)
	}
	first := 0
	if s.commit != nil {
		// The first copy goes out through the group commit (commit.go).
		res := s.commit.publish(msg, id, until)
		switch {
		case res.err == nil:
			return res.ack, nil
		case !res.sent:
			return nil, res.err // it never left the process: nothing stored
		case refused(res.err):
			return nil, fmt.Errorf("refused: %w", res.err) // nothing stored
		}
		last, maybe, first = res.err, true, 1
	}
	for attempt := first; ; attempt++ {
		if attempt > 0 {
			select {
			case <-deadline.C:
				return nil, unconfirmed()
			case <-time.After(min(time.Duration(attempt)*50*time.Millisecond, 500*time.Millisecond)):
			}
		}
		f, err := s.js.PublishMsgAsync(msg, jetstream.WithMsgID(id), jetstream.WithExpectStream(wire.RequestStream))
		if err != nil {
			if !maybe {
				return nil, err // no copy ever left the process: nothing stored
			}
			last = err // an earlier copy may be stored: keep asking
			continue
		}
		select {
		case ack := <-f.Ok():
			return ack, nil
		case err := <-f.Err():
			last = err
			if refused(err) && !maybe {
				return nil, fmt.Errorf("refused: %w", err) // nothing stored
			}
			if refused(err) {
				// This copy is not stored; an earlier one may be, and
				// asking again would get the same refusal.
				return nil, unconfirmed()
			}
			maybe = true
		case <-deadline.C:
			maybe = true
			last = jetstream.ErrAsyncPublishTimeout
			return nil, unconfirmed()
		}
	}
}

// idemRecord is the value stored under an Idempotency-Key.
type idemRecord struct {
	RequestID string  `json:"request_id"`
	Op        wire.Op `json:"op"`
	Path      string  `json:"path"`
	Msg       []byte  `json:"msg"` // the request message exactly as first published
}

// claimKey binds key to this write, or finds the write it is bound to. It
// returns the request id and message to publish, and repeat=true when they
// are an earlier write's; an *inputError (422) when the key is bound to
// another op or path; bus.ErrUnavailable when the bucket does not answer. Keys are stored as hex(sha256(key)): any printable
// key becomes a valid KV key of fixed length. A non-empty scope (the
// caller's subject) is hashed in before the key, so that two callers' keys
// never meet: one cannot learn or replay another's request by guessing a
// key.
func (s *Service) claimKey(ctx context.Context, scope, key string, op wire.Op, path, id string, data []byte) (string, []byte, bool, error) {
	kv := s.bucket()
	if kv == nil {
		return "", nil, false, fmt.Errorf("%w: ingest is not started", bus.ErrUnavailable)
	}
	var sum [sha256.Size]byte
	if scope == "" {
		sum = sha256.Sum256([]byte(key)) // as before authentication existed
	} else {
		sum = sha256.Sum256([]byte("sub:" + scope + "\x00" + key))
	}
	k := hex.EncodeToString(sum[:])
	val, err := json.Marshal(idemRecord{RequestID: id, Op: op, Path: path, Msg: data})
	if err != nil {
		return "", nil, false, fmt.Errorf("encode idempotency record: %w", err)
	}
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.PublishTimeout)
	defer cancel()
	// Create is atomic: of concurrent first uses, one wins and the others
	// read its record. A record that expires between Create and Get is
	// claimed again, hence the loop.
	for range 3 {
		_, err := kv.Create(kctx, k, val)
		if err == nil {
			return id, data, false, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return "", nil, false, fmt.Errorf("%w: create idempotency key: %w", bus.ErrUnavailable, err)
		}
		e, err := kv.Get(kctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return "", nil, false, fmt.Errorf("%w: read idempotency key: %w", bus.ErrUnavailable, err)
		}
		var old idemRecord
		if err := json.Unmarshal(e.Value(), &old); err != nil || old.RequestID == "" || len(old.Msg) == 0 {
			return "", nil, false, fmt.Errorf("%w: undecodable idempotency record %s: %v", bus.ErrUnavailable, k, err)
		}
		if old.Op != op || old.Path != path {
			return "", nil, false, &inputError{status: http.StatusUnprocessableEntity,
				msg: "This Idempotency-Key was first used for " + string(old.Op) + " on " + old.Path +
					"; use a new key for another operation or path."}
		}
		return old.RequestID, old.Msg, true, nil
	}
	return "", nil, false, fmt.Errorf("%w: idempotency key %s keeps vanishing", bus.ErrUnavailable, k)
}
