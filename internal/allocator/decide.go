package allocator

import (
	"cmp"
	"context"
	"database/sql"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/allocator/messages"
	"github.com/allot-dev/allot/internal/allocator/rows"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/store/waitlist"
	"github.com/allot-dev/allot/internal/wire"
)

// valid is a decoded request of a message at its place in the stream.
type valid struct {
	item
	index int
	place uint64 // wire.Place(seq, index)
	req   wire.Request
}

// decision is one transaction's decisions in the making: decide's steps
// share it.
type decision struct {
	now      time.Time
	out      outcome
	reqs     []valid             // decoded, in place order
	rejected []store.RejectedRow // refused: undecodable, or by the domain
	// done holds the request ids already applied (or applied by this
	// batch): a repeat is skipped.
	done    map[string]bool
	repeats []string // the ids of the requests skipped as repeats, in order
	// refusedAt maps a void's target to the first place it was refused
	// at (nil: the batch holds no void).
	refusedAt map[string]uint64
	locked    lockedActivities
	signups   map[[2]int64]store.SignupRow // rows to write, by (activity, user)
	touched   map[int64]bool               // activities to write; changed: whose view may change
	changed   map[int64]bool
	results   []store.ResultRow
}

// lockedActivities are the activities a transaction locked (ids, ascending),
// their states as decided so far and their waitlist buckets.
type lockedActivities struct {
	ids   []int64
	acts  map[int64]*allocation.Activity
	waits map[int64]*waitlist.Waitlist
}

// decide applies work (sorted, all above the fence) through the domain and
// writes everything in the open transaction: decode, skip repeats, lock
// and load the activities, decide each request, write.
func (a *Allocator) decide(ctx context.Context, tx *sql.Tx, work []item, out outcome, mode txMode) (outcome, error) {
	// The batch's one clock reading, as its results carry it and MySQL
	// keeps it.
	d := &decision{now: wire.Instant(time.Now()), out: out}
	a.decode(d, work)
	if mode.single && len(work) == 1 && work[0].batch != "" {
		// Isolating a batch: its requests one at a time (isolate.go).
		if err := a.decideEach(ctx, tx, d); err != nil {
			return d.out, err
		}
	} else if err := a.decideAll(ctx, tx, d, mode); err != nil {
		return d.out, err
	}
	d.out.fence = work[len(work)-1].seq
	d.out.last = d.out.fence
	return d.out, store.SetPartition(ctx, tx, a.deps.Partition, d.out.fence)
}

// decideAll decides d's requests (decoded) in one go: skip repeats, lock
// and load the activities, decide each request, write.
func (a *Allocator) decideAll(ctx context.Context, tx *sql.Tx, d *decision, mode txMode) error {
	if err := a.findRepeats(ctx, tx, d, mode); err != nil {
		return err
	}
	if err := a.lockActivities(ctx, tx, d); err != nil {
		return err
	}
	d.out.results = slices.Grow(d.out.results, len(d.reqs))
	for _, r := range d.reqs {
		a.decideOne(ctx, d, r)
	}
	if err := a.write(ctx, tx, d); err != nil {
		return err
	}
	return a.answerRepeats(ctx, tx, d)
}

// answerRepeats tells the clients of d's repeats (a request id applied
// before, by an earlier message or earlier in this one) the first
// application's recorded result, as MySQL holds it.
func (a *Allocator) answerRepeats(ctx context.Context, tx *sql.Tx, d *decision) error {
	if len(d.repeats) == 0 {
		return nil
	}
	first, err := store.GetResults(ctx, tx, d.repeats)
	if err != nil {
		return err
	}
	for _, id := range d.repeats {
		if res, ok := first[id]; ok {
			d.out.results = append(d.out.results, res)
		}
	}
	return nil
}

// decode expands each message of work into its requests at their places
// (messages.Expand). A message malformed as a whole is refused at (seq,
// 0), nothing in it applied; a request that cannot be read (or is on the
// wrong subject) is refused alone at its place.
func (a *Allocator) decode(d *decision, work []item) {
	d.reqs = make([]valid, 0, len(work))
	for _, it := range work {
		reqs, err := messages.Expand(it.seq, it.subject, it.batch, it.data, a.cfg.Partitions)
		if err != nil {
			d.refuse(store.RejectedRow{Seq: it.seq, Subject: it.subject, Reason: err.Error()}, true)
			continue
		}
		for _, r := range reqs {
			if r.Err != nil {
				d.refuse(store.RejectedRow{Seq: it.seq, Index: r.Index, Subject: it.subject, Reason: r.Err.Error(), Request: r.Req}, it.batch == "")
				continue
			}
			d.reqs = append(d.reqs, valid{item: it, index: r.Index, place: r.Place, req: r.Req})
		}
	}
}

// refuse records the refusal row; whole says it refuses its message as a
// whole (a single request's, or a malformed message), which is then
// terminated rather than acknowledged.
func (d *decision) refuse(row store.RejectedRow, whole bool) {
	d.rejected = append(d.rejected, row)
	d.out.reject(row, whole, d.now)
}

// findRepeats looks up the requests that already have their answer.
//
// Requests already applied: the same request stored twice (an
// Idempotency-Key repeat after the broker's duplicate window). That is
// rare, so it is looked up only after InsertResults ran into one
// (mode.checkDuplicates). A void of a request stored and refused before it
// is a repeat too: the id has its answer (rejected_message). Voids are
// rare, so they are looked up whenever a batch holds one.
func (a *Allocator) findRepeats(ctx context.Context, tx *sql.Tx, d *decision, mode txMode) error {
	d.done = make(map[string]bool, len(d.reqs))
	if mode.checkDuplicates {
		ids := make([]string, len(d.reqs))
		for i, r := range d.reqs {
			ids[i] = r.req.RequestID
		}
		var err error
		if d.done, err = store.Processed(ctx, tx, ids); err != nil {
			return err
		}
	}
	var err error
	d.refusedAt, err = a.refusedBefore(ctx, tx, voidIDs(d.reqs), d.rejected)
	return err
}

// lockActivities locks the rows of the activities the requests name, in
// ascending id order, and takes their states and waitlists.
func (a *Allocator) lockActivities(ctx context.Context, tx *sql.Tx, d *decision) error {
	d.locked.ids = make([]int64, 0, 4)
	for _, r := range d.reqs {
		if r.req.Op != wire.OpVoid { // a void names no activity
			d.locked.ids = append(d.locked.ids, r.req.ActivityID)
		}
	}
	slices.Sort(d.locked.ids)
	d.locked.ids = slices.Compact(d.locked.ids)
	rows, err := store.LockActivities(ctx, tx, d.locked.ids)
	if err != nil {
		return err
	}
	d.locked.acts = make(map[int64]*allocation.Activity, len(d.locked.ids))
	d.locked.waits = make(map[int64]*waitlist.Waitlist, len(d.locked.ids))
	d.signups = make(map[[2]int64]store.SignupRow, len(d.reqs))
	d.touched, d.changed = make(map[int64]bool), make(map[int64]bool)
	d.results = make([]store.ResultRow, 0, len(d.reqs))
	for _, id := range d.locked.ids {
		act, err := a.activity(ctx, tx, id, rows)
		if err != nil {
			return err
		}
		d.locked.acts[id] = act
		if act != nil {
			if d.locked.waits[id], err = a.waitlist(ctx, tx, act); err != nil {
				return err
			}
		}
	}
	return nil
}

// decideOne decides request r, in place order, on the states so far.
func (a *Allocator) decideOne(ctx context.Context, d *decision, r valid) {
	if d.done[r.req.RequestID] {
		d.repeats = append(d.repeats, r.req.RequestID)
		return
	}
	if r.req.Op == wire.OpVoid {
		a.decideVoid(d, r)
		return
	}
	act := d.locked.acts[r.req.ActivityID]
	var wasWaiting uint64 // the requester's queue_seq if it waits
	if s, ok := act.Lookup(r.req.UserID); ok && s.Status == wire.StatusWaiting {
		wasWaiting = s.QueueSeq
	}
	after, dec, err := allocation.Apply(act, allocation.RequestOf(r.req), r.place)
	if err != nil {
		if _, ok := d.refusedAt[r.req.RequestID]; !ok && d.refusedAt != nil {
			d.refusedAt[r.req.RequestID] = r.place
		}
		d.refuse(store.RejectedRow{Seq: r.seq, Index: r.index, Subject: r.subject, Reason: err.Error(), Request: r.req}, r.batch == "")
		return
	}
	d.done[r.req.RequestID] = true // a repeat later in this batch is skipped too
	d.locked.acts[r.req.ActivityID] = after
	if after != nil {
		d.touched[after.ID] = true
		if dec.Changes {
			d.changed[after.ID] = true
		}
	}
	if after != nil && len(dec.Changed) > 0 {
		if d.locked.waits[after.ID] == nil {
			d.locked.waits[after.ID] = waitlist.New(a.deps.Test.BucketSize) // opened by this request
			a.loop.waits.Add(after.ID, d.locked.waits[after.ID])
		}
		a.keepWaitlist(ctx, d.locked.waits, after, r.req.UserID, wasWaiting, dec.Changed)
	}
	for _, s := range dec.Changed {
		d.signups[[2]int64{r.req.ActivityID, s.UserID}] = rows.SignupRow(r.req.ActivityID, s)
	}
	res := allocation.ResultOf(r.req, r.place, dec, after, d.now)
	a.traceDecision(ctx, r.item, res, len(dec.Events))
	d.out.results = append(d.out.results, res)
	a.m.decisions.WithLabelValues(string(r.req.Op), string(dec.Outcome)).Inc()
	a.m.acceptToApply.Observe(d.now.Sub(r.req.ReceivedAt).Seconds())
	d.results = append(d.results, rows.ResultRow(res, a.deps.Partition, dec.Events))
	d.out.events += len(dec.Events)
}

// decideVoid decides a void, unless the id it voids was refused before it.
func (a *Allocator) decideVoid(d *decision, r valid) {
	if at, ok := d.refusedAt[r.req.RequestID]; ok && at < r.place {
		return
	}
	// The id has no result before this void in the partition's order (a
	// repeat was skipped): it was never stored, and a copy stored later
	// is a repeat of this result.
	d.done[r.req.RequestID] = true
	res := allocation.VoidResult(r.req, r.seq, d.now) // a void is a single message: its place is (seq, 0)
	d.out.results = append(d.out.results, res)
	a.m.decisions.WithLabelValues(string(r.req.Op), string(res.Outcome)).Inc()
	d.results = append(d.results, store.ResultRow{Result: res, Partition: a.deps.Partition})
}

// write stores what d decided: the activities, signups, waitlists,
// results and refusals, in an order that keeps lock acquisition
// deterministic; it caches the activities' new states.
func (a *Allocator) write(ctx context.Context, tx *sql.Tx, d *decision) error {
	actRows := make([]store.ActivityRow, 0, len(d.touched))
	for _, id := range d.locked.ids {
		if act := d.locked.acts[id]; act != nil && d.touched[id] {
			actRows = append(actRows, rows.ActivityRow(act))
			a.loop.cache.Add(id, act)
			if d.changed[id] {
				d.out.changed = append(d.out.changed, act)
			}
		}
	}
	// A stable order keeps lock acquisition deterministic.
	signupRows := slices.SortedFunc(maps.Values(d.signups), func(x, y store.SignupRow) int {
		if x.ActivityID != y.ActivityID {
			return cmp.Compare(x.ActivityID, y.ActivityID)
		}
		return cmp.Compare(x.UserID, y.UserID)
	})
	if err := store.UpsertActivities(ctx, tx, actRows); err != nil {
		return err
	}
	if err := store.UpsertSignups(ctx, tx, signupRows); err != nil {
		return err
	}
	if err := waitlist.FlushAll(ctx, tx, d.locked.waits); err != nil {
		return err
	}
	if err := store.InsertResults(ctx, tx, d.results, a.deps.Test.PieceBytes); err != nil {
		return err
	}
	return store.InsertRejected(ctx, tx, d.rejected, d.now)
}

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
// place they were refused at; nil when ids is empty.
func (a *Allocator) refusedBefore(ctx context.Context, tx *sql.Tx, ids []string, batch []store.RejectedRow) (map[string]uint64, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	at, err := store.RefusedRequests(ctx, tx, ids)
	if err != nil {
		return nil, err
	}
	for _, r := range batch {
		place := wire.Place(r.Seq, r.Index)
		if first, ok := at[r.Request.RequestID]; store.ValidRequestID(r.Request.RequestID) && (!ok || place < first) {
			at[r.Request.RequestID] = place
		}
	}
	return at, nil
}

// activity returns the live state of activity id under its row lock: the
// cached one when it matches the row, else one loaded from MySQL.
func (a *Allocator) activity(ctx context.Context, tx *sql.Tx, id int64, locked map[int64]store.ActivityRow) (*allocation.Activity, error) {
	row, ok := locked[id]
	if !ok {
		a.loop.cache.Remove(id)
		return nil, nil
	}
	if c, _ := a.loop.cache.Get(id); c != nil && rows.Matches(c, row) {
		a.m.cache.hits.Inc()
		return c, nil
	}
	a.m.cache.loads.Inc()
	a.loop.waits.Remove(id) // its buckets are loaded with it
	live, err := store.LiveSignups(ctx, tx, id)
	if err != nil {
		return nil, err
	}
	act, err := rows.Activity(row, live)
	if err != nil {
		return nil, err
	}
	a.loop.cache.Add(id, act)
	return act, nil
}

// waitlist returns the waitlist buckets of act (its state under the row
// lock, before this batch's requests): the cached ones, or the rows in
// MySQL. Rows that do not describe act's waiters exactly (written by hand,
// or by a version without buckets) are rebuilt from act and rewritten in
// this transaction.
func (a *Allocator) waitlist(ctx context.Context, tx *sql.Tx, act *allocation.Activity) (*waitlist.Waitlist, error) {
	if w, ok := a.loop.waits.Get(act.ID); ok {
		return w, nil
	}
	w, err := waitlist.Load(ctx, tx, act.ID, a.deps.Test.BucketSize)
	if err != nil {
		return nil, err
	}
	if seqs := rows.WaiterSeqs(act); !w.Fits(seqs) {
		a.deps.Log.WarnContext(ctx, "waitlist buckets do not match the signups; rebuilding them", slog.Int64("activity_id", act.ID))
		w = waitlist.Build(seqs, a.deps.Test.BucketSize)
	}
	a.loop.waits.Add(act.ID, w)
	return w, nil
}

// keepWaitlist applies to the buckets of after what one request changed
// (changed, the decision's rows): a WAITING row joined the waitlist; the
// requester (who waited at wasWaiting, or 0) left it when its row is no
// longer WAITING; any other user's row changes only by a promotion, off
// the waitlist. A change the buckets cannot take (which the load-time
// check rules out) rebuilds them from after.
func (a *Allocator) keepWaitlist(ctx context.Context, waits map[int64]*waitlist.Waitlist, after *allocation.Activity,
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
			a.deps.Log.ErrorContext(ctx, "waitlist buckets out of step; rebuilding them", slog.Int64("activity_id", after.ID), slog.Any("err", err))
			w = waitlist.Build(rows.WaiterSeqs(after), a.deps.Test.BucketSize)
			waits[after.ID] = w
			a.loop.waits.Add(after.ID, w)
			return
		}
	}
}
