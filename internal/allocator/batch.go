package allocator

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// item is one stored request: delivered by the consumer (msg set) or read
// straight from the stream to fill a gap (msg nil).
type item struct {
	seq     uint64
	subject string
	data    []byte
	msg     jetstream.Msg
	// dseq is the consumer's delivery sequence and delivered the number of
	// deliveries so far (delivered messages only).
	dseq, delivered uint64
}

// outcome is what one transaction decided, kept for after the commit.
type outcome struct {
	fence    uint64 // the partition's fence after the commit
	results  []wire.Result
	rejected map[uint64]string // seq → reason
	events   int
	changed  []*allocation.Activity // activities whose state the commit changed
	last     uint64                 // the last stream sequence the commit covered; 0 when it covered none
}

// handle applies msgs (possibly none: then it only looks for a gap) and
// acknowledges them. It returns an error only when the allocator must stop.
func (a *Allocator) handle(ctx context.Context, msgs []jetstream.Msg) error {
	ctx, endTrace := a.traceBatch(ctx, msgs)
	defer endTrace()
	items := make([]item, 0, len(msgs))
	for _, m := range msgs {
		md, err := m.Metadata()
		if err != nil {
			// Not a JetStream message: nothing to apply, nothing to ack.
			a.log.ErrorContext(ctx, "message without metadata", slog.Any("err", err))
			continue
		}
		items = append(items, item{seq: md.Sequence.Stream, subject: m.Subject(), data: m.Data(), msg: m,
			dseq: md.Sequence.Consumer, delivered: md.NumDelivered})
	}
	slices.SortFunc(items, func(x, y item) int { return cmp.Compare(x.seq, y.seq) })
	items = slices.CompactFunc(items, func(x, y item) bool { return x.seq == y.seq })

	for {
		out, err := a.applyOnce(ctx, items)
		if err != nil && store.Rejectable(err) {
			// One bad request must not sink the batch: apply it one
			// request per transaction, so the bad one is isolated.
			a.log.WarnContext(ctx, "batch failed; isolating requests", slog.Any("err", err), slog.Int("batch", len(items)))
			return a.isolate(ctx, items)
		}
		if err != nil {
			// Not the requests' fault (broker, database, shutdown): nothing
			// is rejected and nothing acknowledged; the batch is tried again.
			return fmt.Errorf("apply batch: %w", err)
		}
		if err := a.afterCommit(ctx, items, out); err != nil {
			return err
		}
		a.noteCommitted(items, out)
		var rest []item
		for _, it := range items {
			if it.seq > out.fence {
				rest = append(rest, it)
			}
		}
		if len(rest) == 0 {
			return nil
		}
		// A gap was filled first; apply what was delivered next.
		items = rest
	}
}

// isolate applies the partition from the fence on, one message per
// transaction, until items are covered. The messages are taken in stream
// order exactly as a batch takes them (delivered, or read from the stream
// to fill a gap), so the one the database refuses is recorded as rejected
// by itself and the fence never passes a message without a result or a
// rejection.
func (a *Allocator) isolate(ctx context.Context, items []item) error {
	a.single = true
	defer func() { a.single = false }()
	for {
		a.tried = 0
		out, err := a.applyOnce(ctx, items)
		if err != nil && store.Rejectable(err) && a.tried != 0 {
			a.log.ErrorContext(ctx, "request cannot be applied; rejecting it", slog.Uint64("seq", a.tried), slog.Any("err", err))
			var rejected bool
			out, rejected, err = a.reject(ctx, items, a.tried, err)
			if err == nil && !rejected {
				// The partition moved on under another allocator: the
				// message that failed is no longer next. Apply again.
				a.log.WarnContext(ctx, "the refused request is no longer next; applying again", slog.Uint64("seq", a.tried))
				continue
			}
		}
		if err != nil {
			return fmt.Errorf("apply request: %w", err)
		}
		if err := a.afterCommit(ctx, items, out); err != nil {
			return err
		}
		a.noteCommitted(items, out)
		if len(items) == 0 || out.fence >= items[len(items)-1].seq || out.last == 0 {
			return nil
		}
	}
}

// errRetryChecked asks applyOnce to run the batch again with the lookup of
// already applied requests.
var errRetryChecked = errors.New("batch holds an already applied request")

// applyOnce runs one transaction (retried on lost races) over the items not
// yet applied, after filling any gap before them.
func (a *Allocator) applyOnce(ctx context.Context, items []item) (outcome, error) {
	var out outcome
	ctx, endTrace := traceTx(ctx)
	defer endTrace()
	start := time.Now()
	err := store.WithTx(ctx, a.db, store.TxOptions{
		OnRetry: func(attempt int, err error) {
			a.m.txRetries.Inc()
			a.log.WarnContext(ctx, "transaction retried", slog.Int("attempt", attempt), slog.Any("err", err))
			for _, it := range items {
				if it.msg != nil {
					it.msg.InProgress() //nolint:errcheck // best effort: keep the lease while retrying
				}
			}
		},
	}, func(tx *sql.Tx) error {
		var err error
		out, err = a.applyTx(ctx, tx, items)
		if errors.Is(err, store.ErrDuplicateRequest) && !a.checkDuplicates {
			return errRetryChecked
		}
		return err
	})
	if errors.Is(err, errRetryChecked) {
		// A request was stored twice: apply the batch again, looking up
		// every request first. The cache holds the rolled-back decisions.
		a.cache.Purge()
		a.waits.Purge()
		a.checkDuplicates = true
		defer func() { a.checkDuplicates = false }()
		return a.applyOnce(ctx, items)
	}
	if err != nil {
		// The cache may hold decisions that were rolled back; the next
		// transaction sees their NextSeq disagree with the row and reloads,
		// but dropping them now keeps memory honest.
		a.cache.Purge()
		a.waits.Purge()
		return out, err
	}
	a.m.txSeconds.Observe(time.Since(start).Seconds())
	a.noteProgress()
	return out, nil
}

// applyTx is one transaction's body. It must be safe to run again.
func (a *Allocator) applyTx(ctx context.Context, tx *sql.Tx, items []item) (outcome, error) {
	fence, err := store.LockPartition(ctx, tx, a.cfg.Partition)
	if err != nil {
		return outcome{}, err
	}
	work := make([]item, 0, len(items))
	for _, it := range items {
		if it.seq > fence {
			work = append(work, it)
		}
	}
	if !a.contiguous(fence, work) && (len(work) > 0 || len(items) == 0) {
		walked, filled, err := a.walk(ctx, fence, work)
		if err != nil {
			return outcome{}, err
		}
		if filled > 0 {
			a.log.InfoContext(ctx, "applying messages read from the stream", slog.Int("count", filled),
				slog.Uint64("after_seq", fence))
			a.m.gapFilled.Add(float64(filled))
		}
		work = walked
	}
	if a.single && len(work) > 1 {
		work = work[:1]
	}
	if a.single && len(work) == 1 {
		a.tried = work[0].seq
	}
	out := outcome{fence: fence, rejected: map[uint64]string{}}
	if len(work) == 0 {
		return out, nil
	}
	return a.decide(ctx, tx, work, out)
}

// contiguous reports whether work (sorted, all above fence) is provably
// the next run of this partition's messages, with no message missing
// between the fence and it or inside it. The proof is cheap: this
// allocator set the fence itself after handling the delivery lastDseq, and
// work holds first deliveries numbered lastDseq+1, lastDseq+2, … in stream
// order. Every delivery, redeliveries too, takes the next consumer
// sequence, and first deliveries come in stream order, so a message between
// two of them would have taken a number between theirs. Anything else (a
// start, a redelivery, a message the client dropped as a slow consumer, a
// delivery to another allocator) falls back to walk.
func (a *Allocator) contiguous(fence uint64, work []item) bool {
	if len(work) == 0 || a.lastDseq == 0 || a.lastFence != fence {
		return false
	}
	for i, it := range work {
		if it.msg == nil || it.delivered != 1 || it.dseq != a.lastDseq+1+uint64(i) {
			return false
		}
	}
	return true
}

// walk reads this partition's messages after fence from the stream itself,
// in order, at most one batch, using the delivered copy of any message in
// work. It returns what to apply next and how many messages it read that no
// delivery brought (a crashed allocator's, or dropped on the way).
func (a *Allocator) walk(ctx context.Context, fence uint64, work []item) ([]item, int, error) {
	delivered := make(map[uint64]item, len(work))
	for _, it := range work {
		delivered[it.seq] = it
	}
	var (
		out    []item
		filled int
		last   uint64
	)
	if len(work) > 0 {
		last = work[len(work)-1].seq
	}
	filter := bus.PartitionFilter(a.cfg.Partition, a.cfg.Partitions)
	for next := fence + 1; len(out) < a.cfg.BatchSize && (len(work) == 0 || next <= last); {
		if it, ok := delivered[next]; ok && a.cfg.Partitions <= 1 {
			// One partition: the stream holds nothing else, no lookup needed.
			out = append(out, it)
			next++
			continue
		}
		raw, err := a.stream.GetMsg(ctx, next, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, 0, fmt.Errorf("%w: read stream after %d: %w", bus.ErrUnavailable, next-1, err)
		}
		if it, ok := delivered[raw.Sequence]; ok {
			out = append(out, it)
		} else {
			out = append(out, item{seq: raw.Sequence, subject: raw.Subject, data: raw.Data})
			filled++
		}
		next = raw.Sequence + 1
	}
	return out, filled, nil
}

// noteCommitted remembers, after a commit, where this allocator left the
// fence and the last delivery it handled, for the next contiguous check.
//
// Only a first delivery may stand for "every delivery up to here is
// covered": first deliveries come in stream order, so one of stream
// sequence s ≤ fence numbered d says every first delivery numbered below d
// is of a message at or below s. A redelivery says nothing of the kind:
// its number is the next free one, past deliveries this allocator may
// never have seen (dropped on the way, or made to another allocator) of
// messages above the fence. Counting it made the next first delivery look
// contiguous and the fence jump over those messages.
// So lastDseq is the highest-numbered first delivery of the covered run
// (the items up to the fence, none read from the stream); without one it
// is 0 and the next batch is proven by a walk.
func (a *Allocator) noteCommitted(items []item, out outcome) {
	a.lastFence = out.fence
	a.applied.Store(out.fence)
	a.lastDseq = 0
	for _, it := range items {
		if it.msg == nil || it.seq > out.fence {
			return // a walk or a partial batch: prove the next batch again
		}
		if it.delivered == 1 {
			a.lastDseq = max(a.lastDseq, it.dseq)
		}
	}
}

// valid is a decoded request at its place in the stream.
type valid struct {
	item
	req wire.Request
}

// decide applies work (sorted, all above the fence) through the domain and
// writes everything in the open transaction.
func (a *Allocator) decide(ctx context.Context, tx *sql.Tx, work []item, out outcome) (outcome, error) {
	// The batch's one clock reading, as its results carry it and MySQL
	// keeps it.
	now := wire.Instant(time.Now())

	var (
		reqs     = make([]valid, 0, len(work))
		rejected []store.RejectedRow
	)
	for _, it := range work {
		req, err := wire.DecodeRequest(it.subject, it.data)
		if err == nil {
			err = bus.CheckRequestSubject(it.subject, req, a.cfg.Partitions)
		}
		if err != nil {
			rejected = append(rejected, store.RejectedRow{Seq: it.seq, Subject: it.subject, Reason: err.Error(), Request: req})
			out.reject(it.seq, req, err.Error(), now)
			continue
		}
		reqs = append(reqs, valid{it, req})
	}

	// Skip requests already applied: the same request stored twice (an
	// Idempotency-Key repeat after the broker's duplicate window). That is
	// rare, so it is looked up only after InsertResults ran into one.
	done := make(map[string]bool, len(reqs))
	if a.checkDuplicates {
		ids := make([]string, len(reqs))
		for i, r := range reqs {
			ids[i] = r.req.RequestID
		}
		var err error
		if done, err = store.Processed(ctx, tx, ids); err != nil {
			return out, err
		}
	}
	// A void of a request stored and refused before it is a repeat too:
	// the id has its answer (rejected_message). Voids are rare, so they
	// are looked up whenever a batch holds one.
	refusedAt, err := a.refusedBefore(ctx, tx, voidIDs(reqs), rejected)
	if err != nil {
		return out, err
	}
	actIDs := make([]int64, 0, 4)
	for _, r := range reqs {
		if r.req.Op != wire.OpVoid { // a void names no activity
			actIDs = append(actIDs, r.req.ActivityID)
		}
	}
	slices.Sort(actIDs)
	actIDs = slices.Compact(actIDs)
	rows, err := store.LockActivities(ctx, tx, actIDs)
	if err != nil {
		return out, err
	}
	acts := make(map[int64]*allocation.Activity, len(actIDs))
	waits := make(map[int64]*store.Waitlist, len(actIDs))
	for _, id := range actIDs {
		act, err := a.activity(ctx, tx, id, rows)
		if err != nil {
			return out, err
		}
		acts[id] = act
		if act != nil {
			if waits[id], err = a.waitlist(ctx, tx, act); err != nil {
				return out, err
			}
		}
	}

	var (
		signups = make(map[[2]int64]store.SignupRow)
		touched = make(map[int64]bool)
		changed = make(map[int64]bool)
		rowsOut = make([]store.ResultRow, 0, len(reqs))
	)
	out.results = slices.Grow(out.results, len(reqs))
	for _, r := range reqs {
		if done[r.req.RequestID] {
			continue
		}
		if r.req.Op == wire.OpVoid {
			if at, ok := refusedAt[r.req.RequestID]; ok && at < r.seq {
				continue
			}
			// The id has no result before this void in the partition's
			// order (a repeat was skipped above): it was never stored, and
			// a copy stored later is a repeat of this result.
			done[r.req.RequestID] = true
			res := allocation.VoidResult(r.req, r.seq, now)
			out.results = append(out.results, res)
			a.m.decisions.WithLabelValues(string(r.req.Op), string(res.Outcome)).Inc()
			rowsOut = append(rowsOut, store.ResultRow{Result: res, Partition: a.cfg.Partition})
			continue
		}
		act := acts[r.req.ActivityID]
		var wasWaiting uint64 // the requester's queue_seq if it waits
		if s, ok := act.Lookup(r.req.UserID); ok && s.Status == wire.StatusWaiting {
			wasWaiting = s.QueueSeq
		}
		after, d, err := allocation.Apply(act, allocation.RequestOf(r.req), r.seq)
		if err != nil {
			if _, ok := refusedAt[r.req.RequestID]; !ok && refusedAt != nil {
				refusedAt[r.req.RequestID] = r.seq
			}
			rejected = append(rejected, store.RejectedRow{Seq: r.seq, Subject: r.subject, Reason: err.Error(), Request: r.req})
			out.reject(r.seq, r.req, err.Error(), now)
			continue
		}
		done[r.req.RequestID] = true // a repeat later in this batch is skipped too
		acts[r.req.ActivityID] = after
		if after != nil {
			touched[after.ID] = true
			if d.Changes {
				changed[after.ID] = true
			}
		}
		if after != nil && len(d.Changed) > 0 {
			if waits[after.ID] == nil {
				waits[after.ID] = store.NewWaitlist(a.cfg.bucketSize) // opened by this request
				a.waits.Add(after.ID, waits[after.ID])
			}
			a.keepWaitlist(ctx, waits, after, r.req.UserID, wasWaiting, d.Changed)
		}
		for _, s := range d.Changed {
			signups[[2]int64{r.req.ActivityID, s.UserID}] = store.SignupRow{
				ActivityID: r.req.ActivityID, UserID: s.UserID, Status: s.Status, QueueSeq: s.QueueSeq,
				HeldUntil: s.HeldUntil, HoldSeq: s.HoldSeq,
			}
		}
		res := allocation.ResultOf(r.req, r.seq, d, after, now)
		a.traceDecision(ctx, r.item, res, len(d.Events))
		out.results = append(out.results, res)
		a.m.decisions.WithLabelValues(string(r.req.Op), string(d.Outcome)).Inc()
		a.m.acceptToApply.Observe(now.Sub(r.req.ReceivedAt).Seconds())
		rowsOut = append(rowsOut, store.ResultRow{Result: res, Partition: a.cfg.Partition, Events: store.EncodeEvents(d.Events)})
		out.events += len(d.Events)
	}

	actRows := make([]store.ActivityRow, 0, len(touched))
	for _, id := range actIDs {
		if act := acts[id]; act != nil && touched[id] {
			actRows = append(actRows, store.ActivityRow{ID: id, Capacity: act.Capacity, Confirmed: act.Confirmed, NextSeq: act.NextSeq,
				Hold: act.Hold, Held: act.Held, Waiting: act.Waiting()})
			a.cache.Add(id, act)
			if changed[id] {
				out.changed = append(out.changed, act)
			}
		}
	}
	signupRows := make([]store.SignupRow, 0, len(signups))
	for _, s := range signups {
		signupRows = append(signupRows, s)
	}
	// A stable order keeps lock acquisition deterministic.
	slices.SortFunc(signupRows, func(x, y store.SignupRow) int {
		if x.ActivityID != y.ActivityID {
			return cmp.Compare(x.ActivityID, y.ActivityID)
		}
		return cmp.Compare(x.UserID, y.UserID)
	})
	if err := store.UpsertActivities(ctx, tx, actRows); err != nil {
		return out, err
	}
	if err := store.UpsertSignups(ctx, tx, signupRows); err != nil {
		return out, err
	}
	if err := store.FlushWaitlists(ctx, tx, waits); err != nil {
		return out, err
	}
	if err := store.InsertResults(ctx, tx, rowsOut, a.cfg.PieceBytes); err != nil {
		return out, err
	}
	if err := store.InsertRejected(ctx, tx, rejected, now); err != nil {
		return out, err
	}
	out.fence = work[len(work)-1].seq
	out.last = out.fence
	if err := store.SetPartition(ctx, tx, a.cfg.Partition, out.fence); err != nil {
		return out, err
	}
	return out, nil
}

// voidIDs returns the request ids of the voids among reqs.
func voidIDs(reqs []valid) []string {
	var ids []string
	for _, r := range reqs {
		if r.req.Op == wire.OpVoid {
			ids = append(ids, r.req.RequestID)
		}
	}
	return ids
}

// refusedBefore maps those of ids that were stored and refused (a
// rejected_message row, or a refusal earlier in this batch) to the first
// sequence they were refused at; nil when ids is empty.
func (a *Allocator) refusedBefore(ctx context.Context, tx *sql.Tx, ids []string, batch []store.RejectedRow) (map[string]uint64, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	at, err := store.RefusedRequests(ctx, tx, ids)
	if err != nil {
		return nil, err
	}
	for _, r := range batch {
		if seq, ok := at[r.Request.RequestID]; store.ValidRequestID(r.Request.RequestID) && (!ok || r.Seq < seq) {
			at[r.Request.RequestID] = r.Seq
		}
	}
	return at, nil
}

// activity returns the live state of activity id under its row lock: the
// cached one when it matches the row, else one loaded from MySQL.
func (a *Allocator) activity(ctx context.Context, tx *sql.Tx, id int64, rows map[int64]store.ActivityRow) (*allocation.Activity, error) {
	row, ok := rows[id]
	if !ok {
		a.cache.Remove(id)
		return nil, nil
	}
	if c, _ := a.cache.Get(id); c != nil && c.NextSeq == row.NextSeq && c.Capacity == row.Capacity && c.Confirmed == row.Confirmed &&
		c.Hold == row.Hold && c.Held == row.Held && c.Waiting() == row.Waiting {
		a.m.cacheHits.Inc()
		return c, nil
	}
	a.m.cacheLoads.Inc()
	a.waits.Remove(id) // its buckets are loaded with it
	live, err := store.LiveSignups(ctx, tx, id)
	if err != nil {
		return nil, err
	}
	act, err := allocation.Restore(id, row.Capacity, row.Confirmed, row.NextSeq, row.Hold, toSignups(live))
	if err != nil {
		return nil, fmt.Errorf("activity %d in mysql breaks an invariant: %w", id, err)
	}
	a.cache.Add(id, act)
	return act, nil
}

// waitlist returns the waitlist buckets of act (its state under the row
// lock, before this batch's requests): the cached ones, or the rows in
// MySQL. Rows that do not describe act's waiters exactly (written by hand,
// or by a version without buckets) are rebuilt from act and rewritten in
// this transaction.
func (a *Allocator) waitlist(ctx context.Context, tx *sql.Tx, act *allocation.Activity) (*store.Waitlist, error) {
	if w, ok := a.waits.Get(act.ID); ok {
		return w, nil
	}
	w, err := store.LoadWaitlist(ctx, tx, act.ID, a.cfg.bucketSize)
	if err != nil {
		return nil, err
	}
	if seqs := waiterSeqs(act); !w.Fits(seqs) {
		a.log.WarnContext(ctx, "waitlist buckets do not match the signups; rebuilding them", slog.Int64("activity_id", act.ID))
		w = store.BuildWaitlist(seqs, a.cfg.bucketSize)
	}
	a.waits.Add(act.ID, w)
	return w, nil
}

// waiterSeqs are the queue_seqs of act's WAITING signups.
func waiterSeqs(act *allocation.Activity) []uint64 {
	var seqs []uint64
	for _, s := range act.Live() {
		if s.Status == wire.StatusWaiting {
			seqs = append(seqs, s.QueueSeq)
		}
	}
	return seqs
}

// keepWaitlist applies to the buckets of after what one request changed
// (changed, the decision's rows): a WAITING row joined the waitlist; the
// requester (who waited at wasWaiting, or 0) left it when its row is no
// longer WAITING; any other user's row changes only by a promotion, off
// the waitlist. A change the buckets cannot take (which the load-time
// check rules out) rebuilds them from after.
func (a *Allocator) keepWaitlist(ctx context.Context, waits map[int64]*store.Waitlist, after *allocation.Activity,
	requester int64, wasWaiting uint64, changed []allocation.Signup) {
	w := waits[after.ID]
	for _, s := range changed {
		var err error
		switch {
		case s.Status == wire.StatusWaiting:
			err = w.Join(s.QueueSeq)
		case s.UserID == requester:
			if wasWaiting != 0 {
				err = w.Leave(wasWaiting)
			}
		default:
			err = w.Leave(s.QueueSeq)
		}
		if err != nil {
			a.log.ErrorContext(ctx, "waitlist buckets out of step; rebuilding them", slog.Int64("activity_id", after.ID), slog.Any("err", err))
			w = store.BuildWaitlist(waiterSeqs(after), a.cfg.bucketSize)
			waits[after.ID] = w
			a.waits.Add(after.ID, w)
			return
		}
	}
}

// reject records the message at stream sequence seq, the one a
// transaction of its own just failed on, as rejected for cause, and moves
// the fence onto it, in a transaction of its own. It checks under the
// fence's lock that seq is still the partition's next message: if another
// allocator applied it meanwhile, nothing is rejected (rejected false) and
// the caller applies again, so a valid request is never rejected for an
// earlier transaction's cause.
func (a *Allocator) reject(ctx context.Context, items []item, seq uint64, cause error) (outcome, bool, error) {
	var (
		out      outcome
		rejected bool
	)
	err := store.WithTx(ctx, a.db, store.TxOptions{}, func(tx *sql.Tx) error {
		out, rejected = outcome{rejected: map[uint64]string{}}, false
		fence, err := store.LockPartition(ctx, tx, a.cfg.Partition)
		if err != nil {
			return err
		}
		out.fence, out.last = fence, 0
		var work []item
		for _, it := range items {
			if it.seq > fence {
				work = append(work, it)
			}
		}
		if !a.contiguous(fence, work) {
			if work, _, err = a.walk(ctx, fence, work); err != nil {
				return err
			}
		}
		if len(work) == 0 || work[0].seq != seq {
			return nil
		}
		next := work[0]
		now := wire.Instant(time.Now())
		req, _ := wire.DecodeRequest(next.subject, next.data) // what can be read of it names the rejection
		reason := "cannot be applied: " + cause.Error()
		if err := store.InsertRejected(ctx, tx, []store.RejectedRow{{Seq: next.seq, Subject: next.subject, Reason: reason, Request: req}}, now); err != nil {
			return err
		}
		out.reject(next.seq, req, reason, now)
		out.fence, out.last = next.seq, next.seq
		rejected = true
		return store.SetPartition(ctx, tx, a.cfg.Partition, out.fence)
	})
	return out, rejected, err
}

// reject notes that the message at seq was refused for reason, and, when
// it names a request that rejected_message records (so that a poll finds
// it), the REJECTED result its waiting client is told, as a poll reads it.
func (o *outcome) reject(seq uint64, req wire.Request, reason string, at time.Time) {
	o.rejected[seq] = reason
	if res, ok := store.RefusedResult(store.RejectedRow{Seq: seq, Reason: reason, Request: req}, at); ok {
		o.results = append(o.results, res)
	}
}

// afterCommit acknowledges what the commit covered, terminates rejected
// messages, wakes waiting clients and the outbox relay.
func (a *Allocator) afterCommit(ctx context.Context, items []item, out outcome) error {
	if a.hooks.AfterCommit != nil {
		if err := a.hooks.AfterCommit(); err != nil {
			return fmt.Errorf("%w: %w", ErrCrashed, err)
		}
	}
	var last jetstream.Msg
	for _, it := range items {
		if it.msg == nil || it.seq > out.fence {
			continue
		}
		if reason, bad := out.rejected[it.seq]; bad {
			a.m.rejected.Inc()
			a.log.WarnContext(ctx, "malformed request terminated", slog.Uint64("seq", it.seq),
				slog.String("subject", it.subject), slog.String("reason", reason))
			it.msg.TermWithReason(reason) //nolint:errcheck // the fence already covers it
			continue
		}
		if last != nil {
			last.Ack() //nolint:errcheck // a lost ack is a redelivery the fence skips
		}
		last = it.msg
	}
	a.m.batchSize.Observe(float64(len(out.results)))
	// Views now, in this goroutine: they read activities the next batch
	// will change, and they must reach ingest before these results.
	a.publishViews(ctx, out.changed)
	if out.events > 0 {
		a.relay.kick()
	}
	if p := (postCommit{last: last, results: out.results}); a.post != nil {
		a.post <- p
	} else {
		a.postOne(p) // not launched (a test driving handle itself)
	}
	return nil
}

// postQueue is how many committed batches may wait for postLoop before the
// apply loop waits for it.
const postQueue = 4

// postCommit is what follows a commit off the apply loop's path.
type postCommit struct {
	// last is the batch's last acknowledged message, sent as a DoubleAck:
	// its confirmation says the server has taken every ack sent before it
	// on this connection.
	last    jetstream.Msg
	results []wire.Result
	// flushed, when set, is closed once everything before it is done.
	flushed chan struct{}
}

// flushPost waits until postLoop has done every batch queued so far.
func (a *Allocator) flushPost() {
	if a.post == nil {
		return
	}
	done := make(chan struct{})
	a.post <- postCommit{flushed: done}
	<-done
}

// postLoop confirms each batch's acks and tells waiting clients about its
// results, in commit order, while the apply loop goes on with the next
// batch. Neither is needed for exactly-once (an ack the server never got
// is a redelivery the fence skips; a lost result notice sends the client
// to MySQL), so neither holds up the next commit: waiting for the
// confirmation in the loop cost about a tenth of a hot activity's drain.
// It ends when a.post is closed and drained.
func (a *Allocator) postLoop() {
	defer close(a.postDone)
	for p := range a.post {
		a.postOne(p)
	}
}

func (a *Allocator) postOne(p postCommit) {
	if p.last != nil {
		if a.hooks.BeforeConfirm != nil {
			a.hooks.BeforeConfirm()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := p.last.DoubleAck(ctx); err != nil {
			a.log.Warn("ack not confirmed; the fence will skip the redelivery", slog.Any("err", err))
		}
		cancel()
	}
	if len(p.results) > 0 {
		a.publishResults(p.results)
	}
	if p.flushed != nil {
		close(p.flushed)
	}
}

// publishResults tells waiting HTTP handlers about the results just
// committed. Core NATS, at most once: handlers fall back to MySQL.
func (a *Allocator) publishResults(results []wire.Result) {
	const chunk = 1000
	for lo := 0; lo < len(results); lo += chunk {
		part := results[lo:min(lo+chunk, len(results))]
		b, err := json.Marshal(wire.ResultBatch{Results: part})
		if err == nil && int64(len(b)) > a.nc.MaxPayload() && len(part) > 1 {
			// A huge result (a resize promoting many) would take the
			// others' notices down with it: one at a time, and one too big
			// for a message is read from MySQL by its waiter.
			for _, r := range part {
				a.publishResults([]wire.Result{r})
			}
			continue
		}
		if err == nil && int64(len(b)) <= a.nc.MaxPayload() {
			a.nc.Publish(wire.ResultSubject, b) //nolint:errcheck // best effort by design
		}
	}
}
