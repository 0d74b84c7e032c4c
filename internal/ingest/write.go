package ingest

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/ingest/idempotency"
	"github.com/allot-dev/allot/internal/ingest/publish"
	"github.com/allot-dev/allot/internal/ingest/reply"
	"github.com/allot-dev/allot/internal/ingest/results"
	"github.com/allot-dev/allot/internal/ingest/shed"
	"github.com/allot-dev/allot/internal/wire"
)

// writeHandler serves the write route of op: validate everything, then
// publish, then answer 202 (or 200 with the result when ?wait= sees it).
func (s *Service) writeHandler(op wire.Op) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.write(w, r, op, r.PathValue("activity"), r.PathValue("user"))
	}
}

// writeReq is one write as it goes through the pipeline.
type writeReq struct {
	op       wire.Op
	activity int64
	user     int64
	capacity *int64 // opens only
	hold     time.Duration
	wait     time.Duration // 0: answer without waiting
	key      string        // Idempotency-Key
	hasKey   bool
	part     int    // the activity's partition
	id       string // the request id (an earlier write's on a repeat)
	data     []byte // the request message
	repeat   bool   // the key's earlier write: id and data are its
}

// write is the write pipeline: parse and validate, spend the caller's
// budgets (access), build the request, bind its idempotency key, publish
// it, then answer: shed (a claim on a full activity), with the result
// (?wait=), or 202. Each step that answers the client returns false.
func (s *Service) write(w http.ResponseWriter, r *http.Request, op wire.Op, aStr, uStr string) {
	ctx := r.Context()
	q, ok := s.parseWrite(w, r, op, aStr, uStr)
	if !ok || !s.callers.access.AllowWrite(w, op) {
		return
	}
	q.wait = s.results.Admit(q.wait)
	if !s.callers.access.AllowUser(w, r, op, q.user) {
		return
	}
	// A claim for an activity with a view may be shed, once it is
	// stored (shed.Answerer): from the view seen now, or from one that
	// arrives while it is published. A keyed claim is left to the
	// allocator, so that a repeat of the key reads the recorded result.
	sheddable := op == wire.OpClaim && !q.hasKey && s.cfg.Shed
	var candidate *shed.View
	if sheddable {
		candidate = s.shed.Candidate(q.activity)
	}
	if !s.buildRequest(ctx, w, &q) || !s.bindKey(ctx, w, &q) {
		return
	}
	// Register before publishing: the allocator may apply the request and
	// announce its result before PublishMsg even returns.
	var wt *results.Waiter
	if q.wait > 0 {
		wt = s.results.Register(q.id)
		defer s.results.Unregister(q.id, wt)
	}
	if q.repeat && s.answerRepeat(ctx, w, q) {
		return
	}
	st, ok := s.publish(ctx, w, q)
	if !ok {
		return
	}
	// Only a place known for sure proves an answer: a request that may be
	// stored twice (its batch's PubAck was lost, then it went alone) is
	// answered by the allocator, from whichever copy comes first.
	sheddable = sheddable && st.Sole
	var viewed <-chan struct{} // closed by the activity's next view
	if sheddable {
		if q.wait > 0 { // before Answer looks, so that no view falls between
			viewed = s.shed.Changes(q.activity)
		}
		if res, ok := s.shed.Answer(ctx, q.id, q.activity, q.user, st.Place, candidate); ok {
			reply.Result(w, http.StatusOK, res)
			return
		}
	}
	if q.wait > 0 {
		// A fresh id cannot have a result yet, and a repeat's was read
		// above after registering, so no MySQL read is due before waiting.
		if res, ok := s.await(ctx, q, wt, st.Place, viewed); ok {
			reply.Result(w, http.StatusOK, res)
			return
		}
	}
	reply.Ack(w, q.id)
}

// await waits up to q.wait for the result of q's request, stored at
// place. A sheddable claim (viewed set) is also answered from a view of
// its activity that arrives meanwhile, once it proves the answer: the
// claims stored just after a sell-out, before ingest knew of it, need not
// wait for the allocator's next batch.
func (s *Service) await(ctx context.Context, q writeReq, wt *results.Waiter, place uint64, viewed <-chan struct{}) (wire.Result, bool) {
	deadline := time.Now().Add(q.wait)
	for {
		res, ok, woken := s.results.AwaitOr(ctx, q.id, wt, time.Until(deadline), viewed)
		if !woken {
			return res, ok
		}
		viewed = s.shed.Changes(q.activity)
		if res, ok := s.shed.Retry(ctx, q.id, q.activity, q.user, place); ok {
			return res, true
		}
	}
}

// parseWrite reads and validates everything the client sent: body, ids,
// ?wait= and the Idempotency-Key.
func (s *Service) parseWrite(w http.ResponseWriter, r *http.Request, op wire.Op, aStr, uStr string) (writeReq, bool) {
	q := writeReq{op: op}
	fail := func(err error) (writeReq, bool) {
		reply.Input(w, err)
		return q, false
	}
	body, err := readBody(w, r, BodyLimit)
	if err != nil {
		return fail(err)
	}
	if q.activity, err = reply.ParseID(aStr, "activity"); err != nil {
		return fail(err)
	}
	if op == wire.OpOpen {
		c, h, err := parseOpen(body)
		if err != nil {
			return fail(err)
		}
		q.capacity, q.hold = &c, h
	} else if q.user, err = reply.ParseID(uStr, "user"); err != nil {
		return fail(err)
	}
	if q.wait, err = parseWait(r.URL.RawQuery, MaxWait); err != nil {
		return fail(err)
	}
	if q.key, q.hasKey, err = idempotencyKey(r.Header); err != nil {
		return fail(err)
	}
	return q, true
}

// buildRequest mints the request id and encodes the request message.
func (s *Service) buildRequest(ctx context.Context, w http.ResponseWriter, q *writeReq) bool {
	_, partitions := s.pub.Settings()
	q.part = bus.PartitionOf(q.activity, partitions)
	uid, err := s.callers.ids.New(q.user, q.part, partitions)
	if err != nil {
		s.deps.Log.ErrorContext(ctx, "mint request id", slog.Any("err", err))
		reply.Error(w, http.StatusInternalServerError, reply.MsgInternal)
		return false
	}
	q.id = uid.String()
	// The message outlives the handler (group commit, settling, the key's
	// record): a buffer of its own, encoded without reflection.
	q.data = wire.Request{
		RequestID:      q.id,
		Op:             q.op,
		ActivityID:     q.activity,
		UserID:         q.user,
		Capacity:       q.capacity,
		Hold:           wire.Duration(q.hold),
		IdempotencyKey: q.key,
		ReceivedAt:     time.Now().UTC(),
	}.AppendJSON(make([]byte, 0, requestBufSize+len(q.key)))
	return true
}

// repeatReadTimeout bounds answerRepeat's read with several shards.
const repeatReadTimeout = time.Second

// requestBufSize fits an encoded request without its Idempotency-Key.
const requestBufSize = 192

// bindKey binds the write's Idempotency-Key, if it has one; a repeat of
// the key takes the earlier write's id and message.
func (s *Service) bindKey(ctx context.Context, w http.ResponseWriter, q *writeReq) bool {
	if !q.hasKey {
		return true
	}
	path := idempotency.CanonicalPath(q.op, q.activity, q.user)
	id, data, repeat, err := s.keys.Claim(ctx, idempotency.Scope(ctx), q.key, q.op, path, q.id, q.data)
	if err != nil {
		if _, ok := errors.AsType[*reply.InputError](err); ok { // 422: the key is bound elsewhere
			reply.Input(w, err)
			return false
		}
		s.deps.Log.WarnContext(ctx, "idempotency key unavailable", slog.String("request_id", q.id), slog.Any("err", err))
		reply.Error(w, http.StatusServiceUnavailable, reply.MsgBrokerDown)
		return false
	}
	q.id, q.data, q.repeat = id, data, repeat
	if repeat {
		s.metrics.replays.Inc()
	}
	return true
}

// answerRepeat answers a repeat whose request is applied already, without
// publishing a copy that JetStream would store again once its duplicate
// window has passed. It reports whether it answered. The one read of
// MySQL on the write path: a failed read counts as "not applied yet" and
// the copy is published (the allocator applies a request id once,
// however many messages carry it), so that a shard that does not answer
// never fails a write; with several shards the read is bounded by
// repeatReadTimeout, so that one that hangs does not hold it long.
func (s *Service) answerRepeat(ctx context.Context, w http.ResponseWriter, q writeReq) bool {
	if !s.rd.Single() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, repeatReadTimeout)
		defer cancel()
	}
	res, ok := s.results.Lookup(ctx, q.id)
	if !ok {
		return false
	}
	if q.wait > 0 {
		reply.Result(w, http.StatusOK, res)
	} else {
		reply.Ack(w, q.id)
	}
	return true
}

// publish stores the request, or answers 503: at once when too many
// publishes are in flight or the broker refused, with the request id when
// it may be stored (settled in the background: republished, else voided,
// so that the id the client is given reaches a final state).
func (s *Service) publish(ctx context.Context, w http.ResponseWriter, q writeReq) (publish.Stored, bool) {
	st, err := s.pub.Publish(ctx, q.activity, q.op, q.id, q.data)
	switch {
	case err == nil:
		return st, true
	case errors.Is(err, publish.ErrOverloaded):
		reply.RetryAfter(w, time.Second)
		reply.Error(w, http.StatusServiceUnavailable, reply.MsgOverloaded)
	case errors.Is(err, publish.ErrMaybeStored):
		s.pub.Settle(q.activity, q.op, q.id, q.data, q.user, q.part)
		reply.MaybeStored(w, q.id)
	default:
		reply.Error(w, http.StatusServiceUnavailable, reply.MsgBrokerDown)
	}
	return publish.Stored{}, false
}
