package allocator

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/allocator/messages"
	"github.com/allot-dev/allot/internal/allocator/spans"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// item is one stored message (one request, or a batch of them): delivered
// by the consumer (msg set) or read straight from the stream to fill a gap
// (msg nil).
type item struct {
	seq     uint64
	subject string
	batch   string // its wire.BatchHeader: "" for a single request
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
	rejected map[uint64]string // seq → reason, of the messages refused whole
	refused  int               // requests (and messages) refused
	events   int
	changed  []*allocation.Activity // activities whose state the commit changed
	last     uint64                 // the last message (stream sequence) the commit covered; 0 when it covered none
	tried    uint64                 // a single transaction's message (txMode.single), even when it failed
}

// handle applies msgs (possibly none: then it only looks for a gap) and
// acknowledges them. It returns an error only when the allocator must stop.
func (a *Allocator) handle(ctx context.Context, msgs []jetstream.Msg) error {
	ctx, endTrace := spans.Batch(ctx, msgs, a.deps.Partition)
	defer endTrace()
	items := make([]item, 0, len(msgs))
	for _, m := range msgs {
		md, err := m.Metadata()
		if err != nil {
			// Not a JetStream message: nothing to apply, nothing to ack.
			a.deps.Log.ErrorContext(ctx, "message without metadata", slog.Any("err", err))
			continue
		}
		items = append(items, item{seq: md.Sequence.Stream, subject: m.Subject(), batch: m.Headers().Get(wire.BatchHeader), data: m.Data(), msg: m,
			dseq: md.Sequence.Consumer, delivered: md.NumDelivered})
	}
	slices.SortFunc(items, func(x, y item) int { return cmp.Compare(x.seq, y.seq) })
	items = slices.CompactFunc(items, func(x, y item) bool { return x.seq == y.seq })

	for {
		out, err := a.applyOnce(ctx, items, txMode{})
		if err != nil && store.Rejectable(err) {
			// One bad request must not sink the batch: apply it one
			// request per transaction, so the bad one is isolated.
			a.deps.Log.WarnContext(ctx, "batch failed; isolating requests", slog.Any("err", err), slog.Int("batch", len(items)))
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
	for {
		out, err := a.applyOnce(ctx, items, txMode{single: true})
		if err != nil && store.Rejectable(err) && out.tried != 0 {
			tried := out.tried
			a.deps.Log.ErrorContext(ctx, "request cannot be applied; rejecting it", slog.Uint64("seq", tried), slog.Any("err", err))
			var rejected bool
			out, rejected, err = a.reject(ctx, items, tried, err)
			if err == nil && !rejected {
				// The partition moved on under another allocator: the
				// message that failed is no longer next. Apply again.
				a.deps.Log.WarnContext(ctx, "the refused request is no longer next; applying again", slog.Uint64("seq", tried))
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

// txMode says how one transaction takes its items. The zero value is a
// batch's first try.
type txMode struct {
	// single applies one message only (isolate's mode); the outcome's
	// tried is then the stream sequence of the message it tried.
	single bool
	// checkDuplicates looks up which requests were already applied before
	// deciding: only to redo a batch that ran into one.
	checkDuplicates bool
}

// errRetryChecked asks applyOnce to run the batch again with the lookup of
// already applied requests.
var errRetryChecked = errors.New("batch holds an already applied request")

// applyOnce runs one transaction (retried on lost races) over the items not
// yet applied, after filling any gap before them.
func (a *Allocator) applyOnce(ctx context.Context, items []item, mode txMode) (outcome, error) {
	var (
		out   outcome
		tried uint64 // the message a single transaction tried, in any attempt
	)
	ctx, endTrace := spans.Tx(ctx)
	defer endTrace()
	start := time.Now()
	err := store.WithTx(ctx, a.deps.DB, store.TxOptions{
		OnRetry: func(attempt int, err error) {
			a.m.txRetries.Inc()
			a.deps.Log.WarnContext(ctx, "transaction retried", slog.Int("attempt", attempt), slog.Any("err", err))
			for _, it := range items {
				if it.msg != nil {
					it.msg.InProgress() //nolint:errcheck // best effort: keep the lease while retrying
				}
			}
		},
	}, func(tx *sql.Tx) error {
		var err error
		out, err = a.applyTx(ctx, tx, items, mode)
		tried = max(tried, out.tried)
		if errors.Is(err, store.ErrDuplicateRequest) && !mode.checkDuplicates {
			return errRetryChecked
		}
		return err
	})
	if errors.Is(err, errRetryChecked) {
		// A request was stored twice: apply the batch again, looking up
		// every request first. The cache holds the rolled-back decisions.
		a.loop.cache.Purge()
		a.loop.waits.Purge()
		mode.checkDuplicates = true
		out, err = a.applyOnce(ctx, items, mode)
		out.tried = max(out.tried, tried)
		return out, err
	}
	out.tried = tried
	if err != nil {
		// The cache may hold decisions that were rolled back; the next
		// transaction sees their NextSeq disagree with the row and reloads,
		// but dropping them now keeps memory honest.
		a.loop.cache.Purge()
		a.loop.waits.Purge()
		return out, err
	}
	a.m.txSeconds.Observe(time.Since(start).Seconds())
	a.noteProgress()
	return out, nil
}

// applyTx is one transaction's body. It must be safe to run again.
func (a *Allocator) applyTx(ctx context.Context, tx *sql.Tx, items []item, mode txMode) (outcome, error) {
	fence, err := store.LockPartition(ctx, tx, a.deps.Partition, a.deps.Tenure.Epoch())
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
			a.deps.Log.InfoContext(ctx, "applying messages read from the stream", slog.Int("count", filled),
				slog.Uint64("after_seq", fence))
			a.m.gapFilled.Add(float64(filled))
		}
		work = walked
	}
	out := outcome{fence: fence, rejected: map[uint64]string{}}
	if mode.single && len(work) > 1 {
		work = work[:1]
	}
	// The bound counts requests: whole messages until it is reached.
	work = work[:messages.Take(len(work), a.cfg.BatchSize, func(i int) int { return messages.Count(work[i].batch) })]
	if mode.single && len(work) == 1 {
		out.tried = work[0].seq
	}
	if len(work) == 0 {
		return out, nil
	}
	return a.decide(ctx, tx, work, out, mode)
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
	if len(work) == 0 || a.loop.lastDseq == 0 || a.loop.lastFence != fence {
		return false
	}
	for i, it := range work {
		if it.msg == nil || it.delivered != 1 || it.dseq != a.loop.lastDseq+1+uint64(i) {
			return false
		}
	}
	return true
}

// walk reads this partition's messages after fence from the stream itself,
// in order, whole messages up to one batch's requests (BatchSize), using
// the delivered copy of any message in work. It returns what to apply next and how many messages it read that no
// delivery brought (a crashed allocator's, or dropped on the way).
func (a *Allocator) walk(ctx context.Context, fence uint64, work []item) ([]item, int, error) {
	delivered := make(map[uint64]item, len(work))
	for _, it := range work {
		delivered[it.seq] = it
	}
	var (
		out    []item
		filled int
		reqs   int
		last   uint64
	)
	if len(work) > 0 {
		last = work[len(work)-1].seq
	}
	filter := bus.PartitionFilter(a.deps.Partition, a.cfg.Partitions)
	for next := fence + 1; reqs < a.cfg.BatchSize && (len(work) == 0 || next <= last); {
		if it, ok := delivered[next]; ok && a.cfg.Partitions <= 1 {
			// One partition: the stream holds nothing else, no lookup needed.
			out = append(out, it)
			reqs += messages.Count(it.batch)
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
		it, ok := delivered[raw.Sequence]
		if !ok {
			it = item{seq: raw.Sequence, subject: raw.Subject, batch: raw.Header.Get(wire.BatchHeader), data: raw.Data}
			filled++
		}
		out = append(out, it)
		reqs += messages.Count(it.batch)
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
	a.loop.lastFence, a.loop.changed = out.fence, len(out.changed) > 0
	a.stall.applied.Store(out.fence)
	a.loop.lastDseq = 0
	for _, it := range items {
		if it.msg == nil || it.seq > out.fence {
			return // a walk or a partial batch: prove the next batch again
		}
		if it.delivered == 1 {
			a.loop.lastDseq = max(a.loop.lastDseq, it.dseq)
		}
	}
}

// reject records the message at stream sequence seq, the one a
// transaction of its own just failed on, as rejected for cause (each of a
// batch's requests at its place), and moves the fence onto it, in a
// transaction of its own. It checks under the fence's lock that seq is
// still the partition's next message: if another allocator applied it
// meanwhile, nothing is rejected (rejected false) and the caller applies
// again, so a valid request is never rejected for an earlier
// transaction's cause.
func (a *Allocator) reject(ctx context.Context, items []item, seq uint64, cause error) (outcome, bool, error) {
	var (
		out      outcome
		rejected bool
	)
	err := store.WithTx(ctx, a.deps.DB, store.TxOptions{}, func(tx *sql.Tx) error {
		out, rejected = outcome{rejected: map[uint64]string{}}, false
		fence, err := store.LockPartition(ctx, tx, a.deps.Partition, a.deps.Tenure.Epoch())
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
		reason := "cannot be applied: " + cause.Error()
		// What can be read of it names the rejections.
		rows := []store.RejectedRow{{Seq: next.seq, Subject: next.subject, Reason: reason}}
		if reqs, err := messages.Expand(next.seq, next.subject, next.batch, next.data, a.cfg.Partitions); err == nil {
			rows = rows[:0]
			for _, r := range reqs {
				rows = append(rows, store.RejectedRow{Seq: next.seq, Index: r.Index, Subject: next.subject, Reason: reason, Request: r.Req})
			}
		}
		if err := store.InsertRejected(ctx, tx, rows, now); err != nil {
			return err
		}
		for _, r := range rows {
			out.reject(r, true, now)
		}
		out.fence, out.last = next.seq, next.seq
		rejected = true
		return store.SetPartition(ctx, tx, a.deps.Partition, out.fence)
	})
	return out, rejected, err
}

// reject notes that the request at r's place was refused (whole: its
// message is refused as a whole, and terminated), and, when r names a
// request that rejected_message records (so that a poll finds it), the
// REJECTED result its waiting client is told, as a poll reads it.
func (o *outcome) reject(r store.RejectedRow, whole bool, at time.Time) {
	o.refused++
	if whole {
		o.rejected[r.Seq] = r.Reason
	}
	if res, ok := store.RefusedResult(r, at); ok {
		o.results = append(o.results, res)
	}
}
