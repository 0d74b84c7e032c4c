// Package viewpub writes the views of full activities (wire.View) to the
// ALLOT_VIEW bucket for ingest's shedding, off the allocator's apply
// loop.
package viewpub

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// The view publisher writes the views the apply loop hands it to the
// ALLOT_VIEW bucket from its own goroutine, so that a slow, leaderless or
// frozen bucket costs the apply loop nothing (views are an optimisation).
//
//   - Latest wins: it keeps at most one pending view per activity, the
//     latest, and at most maxPending activities; beyond that a view is
//     dropped (counted) and a rebuild repairs the bucket once it answers.
//   - The bucket holds what is useful: a cleared view is put with a TTL
//     (Config.ViewClearTTL) and leaves the bucket after it, so the bucket
//     holds about one key per activity full now.
//   - Late-put protection in the bucket: every write is conditional on the
//     key's revision as the publisher last knew it (Nats-Expected-Last-
//     Subject-Sequence). A write that conflicts reads the key: a stored
//     view of a later sequence wins (the write is dropped); an earlier one
//     is overwritten at its revision; an empty key (a clear that expired)
//     is written only if MySQL says the activity is still at the view's
//     sequence. So a put of an older state never lands over a later clear
//     or view. Per key there is one write in flight at a time.
//   - A rebuild (at start and every takeover) reads the bucket's current
//     keys of this partition and, in one MySQL snapshot, the partition's
//     full activities; it queues their views, and clears the stored views
//     of activities no longer viewed. Views queued meanwhile by the apply
//     loop are newer and win.
type Publisher struct {
	d        Deps
	js       jetstream.JetStream
	m        *Metrics
	clearTTL string // the Nats-TTL of a cleared view
	stream   jetstream.Stream
	wake     chan struct{}

	mu sync.Mutex
	queueState
}

// queueState is what the publisher knows and has to write, under its mu.
type queueState struct {
	keys    *simplelru.LRU[int64, keyState]
	quiet   bool     // a removal from keys that is not an eviction
	evicted []viewOp // deletes for keys evicted from keys, to queue
	pending map[int64]viewOp
	rebuild bool
	// rebuilding says a rebuild is between its snapshot and its merge;
	// seen then holds the last state of every activity the apply loop
	// changed meanwhile.
	rebuilding bool
	seen       map[int64]seenState
}

// seenState is the last state the apply loop offered of an activity
// during a rebuild: its sequence, and whether it is viewed.
type seenState struct {
	seq    uint64
	viewed bool
}

// Deps is what a publisher works with.
type Deps struct {
	NATS *nats.Conn
	KV   jetstream.KeyValue // the view bucket
	DB   *sql.DB
	Log  *slog.Logger
	// Metrics are where it counts (nil: new ones, registered with
	// Registerer).
	Metrics    *Metrics
	Registerer prometheus.Registerer
	// Partition is the partition whose views it writes, of Partitions.
	Partition, Partitions int
	// ClearTTL is how long a cleared view stays in the bucket (0:
	// DefaultClearTTL, at least a second).
	ClearTTL time.Duration
	// Track bounds the activities tracked: four times as many as the
	// allocator caches (and as many views pending).
	Track int
	// Restore is an activity's state from its row and live signups.
	Restore func(row store.ActivityRow, seats []store.SignupRow) (*allocation.Activity, error)
	// Between runs inside a rebuild's snapshot (tests).
	Between func()
}

// keyState is what the publisher knows of one key.
type keyState struct {
	// rev is the revision of the key's last message as last known (0:
	// none, or unknown: a conflict then teaches it).
	rev uint64
	// seq is the sequence of the latest view queued or stored for it.
	seq uint64
	// live says that latest view is a full one: a later state that is not
	// viewed must clear it.
	live bool
}

// viewOp is one pending write.
type viewOp struct {
	v     wire.View
	clear bool // v is a cleared view: put with a TTL
	del   bool // a delete (the key is no longer tracked), at rev
	// rev is the revision a delete, or a write of a key not tracked (a
	// clear a rebuild queues for a stale key), is conditional on; a
	// tracked key's write goes at its keyState's rev.
	rev uint64
	// tries counts conflicts resolved for this write; after a few it is
	// dropped (another writer keeps changing the key).
	tries int
}

// viewRound bounds the writes sent together, and viewAckWait how long a
// round waits for their acknowledgements.
const (
	viewRound   = 1000
	viewAckWait = 5 * time.Second
	// viewStopGrace bounds how long a stopping allocator keeps writing
	// the views still pending.
	viewStopGrace = 2 * time.Second
	// DefaultClearTTL is Deps.ClearTTL's default.
	DefaultClearTTL = 30 * time.Second
)

// New returns a publisher; Run runs it.
func New(d Deps) (*Publisher, error) {
	// Its own JetStream context: its pending asynchronous publishes, which
	// a frozen bucket leaves unanswered, do not fill the relay's window.
	js, err := jetstream.New(d.NATS, jetstream.WithPublishAsyncMaxPending(4*viewRound),
		jetstream.WithPublishAsyncTimeout(viewAckWait))
	if err != nil {
		return nil, err
	}
	if d.Metrics == nil {
		d.Metrics = NewMetrics(d.Registerer)
	}
	ttl := d.ClearTTL
	if ttl <= 0 {
		ttl = DefaultClearTTL
	}
	p := &Publisher{
		d: d, js: js, m: d.Metrics,
		clearTTL: strconv.Itoa(max(1, int(ttl.Round(time.Second)/time.Second))) + "s",
		wake:     make(chan struct{}, 1),
	}
	p.pending = make(map[int64]viewOp)
	p.keys, err = simplelru.NewLRU(d.Track, func(id int64, ks keyState) {
		if !p.quiet && ks.live {
			// No longer tracked, it could not be cleared later: deleted.
			p.evicted = append(p.evicted, viewOp{v: wire.View{ActivityID: id}, del: true, rev: ks.rev})
		}
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// Offer queues the views of the activities a commit changed and returns
// those to tell ingest about at once. It takes the lock briefly and does
// no I/O: the apply loop never waits for the bucket.
func (p *Publisher) Offer(changed []*allocation.Activity) []wire.View {
	var notify []wire.View
	p.mu.Lock()
	for _, act := range changed {
		seq := act.NextSeq - 1
		if p.rebuilding {
			if seq >= p.seen[act.ID].seq {
				p.seen[act.ID] = seenState{seq: seq, viewed: viewed(act)}
			}
		}
		ks, tracked := p.keys.Peek(act.ID)
		switch {
		case viewed(act):
			v := viewOf(act)
			ks.seq, ks.live = seq, true
			p.keys.Add(act.ID, ks)
			p.queue(viewOp{v: v})
			notify = append(notify, v)
		case tracked && ks.live:
			v := clearedView(act)
			ks.seq, ks.live = seq, false
			p.keys.Add(act.ID, ks)
			p.queue(viewOp{v: v, clear: true})
			notify = append(notify, v)
		}
	}
	p.queueEvicted()
	p.m.viewsPending.Set(float64(len(p.pending)))
	p.mu.Unlock()
	p.signal()
	return notify
}

func (p *Publisher) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// queue makes op the pending write of its activity, under p.mu.
func (p *Publisher) queue(op viewOp) {
	id := op.v.ActivityID
	if _, ok := p.pending[id]; !ok && len(p.pending) >= p.d.Track {
		p.m.viewsDropped.WithLabelValues("queue_full").Inc()
		// What the key holds is no longer known here; the rebuild that
		// follows repairs it.
		p.quiet = true
		p.keys.Remove(id)
		p.quiet = false
		p.rebuild = true
		return
	}
	p.pending[id] = op
}

func (p *Publisher) queueEvicted() {
	for _, op := range p.evicted {
		if p.keys.Contains(op.v.ActivityID) {
			// Tracked again since (a rebuild found its key stored, or
			// queued its view): that state stands, the delete would
			// remove a view the publisher counts as stored.
			continue
		}
		if _, ok := p.pending[op.v.ActivityID]; ok {
			// A view not yet written: the delete replaces it, or the view
			// would be stored untracked.
			p.pending[op.v.ActivityID] = op
			continue
		}
		p.queue(op)
	}
	p.evicted = p.evicted[:0]
}

// RequestRebuild asks for a rebuild; it does not wait for it.
func (p *Publisher) RequestRebuild() {
	p.mu.Lock()
	p.rebuild = true
	p.mu.Unlock()
	p.signal()
}

// Forget drops the pending writes: the partition went to another
// allocator, whose rebuild writes its views from MySQL.
func (p *Publisher) Forget() {
	p.mu.Lock()
	if n := len(p.pending); n > 0 {
		p.m.viewsDropped.WithLabelValues("handover").Add(float64(n))
		clear(p.pending)
	}
	p.quiet = true
	p.keys.Purge()
	p.quiet = false
	p.m.viewsPending.Set(0)
	p.mu.Unlock()
}

// Run writes pending views until ctx ends; then it goes on for at most
// viewStopGrace while some are pending. It returns nil.
func (p *Publisher) Run(stop context.Context) error {
	ctx, cancel := context.WithCancel(context.WithoutCancel(stop))
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	stopping := false
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-stop.Done():
			t := time.NewTimer(viewStopGrace)
			defer t.Stop()
			select {
			case <-t.C:
				cancel()
			case <-ctx.Done():
			}
		case <-ctx.Done():
		}
	}()
	var retryAt time.Time
	backoff := 250 * time.Millisecond
	for ctx.Err() == nil {
		p.mu.Lock()
		n := len(p.pending)
		// A rebuild waits for the queue to drain: its writes must fit,
		// and writes must go on between rebuilds.
		rebuild := p.rebuild && !stopping && n == 0 && !time.Now().Before(retryAt)
		if rebuild {
			p.rebuild = false
		}
		p.mu.Unlock()
		if rebuild {
			if err := p.rebuildViews(ctx); err != nil {
				if ctx.Err() == nil {
					p.d.Log.Warn("rebuild views; claims go through the allocator until it succeeds", slog.Any("err", err))
				}
				p.mu.Lock()
				p.rebuild = true
				p.mu.Unlock()
				retryAt = time.Now().Add(backoff)
				backoff = min(2*backoff, 10*time.Second)
			} else {
				backoff = 250 * time.Millisecond
			}
			continue
		}
		if n > 0 {
			p.round(ctx)
			continue
		}
		if stopping {
			return nil
		}
		var timer <-chan time.Time
		p.mu.Lock()
		if p.rebuild {
			timer = time.After(time.Until(retryAt))
		}
		p.mu.Unlock()
		select {
		case <-p.wake:
		case <-timer:
		case <-stop.Done():
			stopping = true
		}
	}
	return nil
}

// PutStale writes v as a publisher that last knew its key at revision
// rev: what a late writer does. Only tests call it.
func (p *Publisher) PutStale(ctx context.Context, v wire.View, rev uint64) {
	p.mu.Lock()
	p.keys.Add(v.ActivityID, keyState{rev: rev, seq: placeOf(v), live: allocation.ViewDecides(v)})
	p.queue(viewOp{v: v})
	p.mu.Unlock()
	for {
		p.mu.Lock()
		n := len(p.pending)
		p.mu.Unlock()
		if n == 0 || ctx.Err() != nil {
			return
		}
		p.round(ctx)
	}
}

// sent is one write of a round.
type sent struct {
	op  viewOp
	rev uint64 // the revision it was conditional on
	f   jetstream.PubAckFuture
}

// round sends up to viewRound pending writes, conditional on their keys'
// revisions, and waits for their acknowledgements.
func (p *Publisher) round(ctx context.Context) {
	p.mu.Lock()
	ops := make([]sent, 0, min(len(p.pending), viewRound))
	for id, op := range p.pending {
		if len(ops) == viewRound {
			break
		}
		delete(p.pending, id)
		rev := op.rev
		if ks, ok := p.keys.Peek(id); ok && !op.del {
			rev = ks.rev
		}
		ops = append(ops, sent{op: op, rev: rev})
	}
	p.m.viewsPending.Set(float64(len(p.pending)))
	p.mu.Unlock()
	for i := range ops {
		s := &ops[i]
		msg := nats.NewMsg("$KV." + wire.ViewBucket + "." + wire.ViewKey(s.op.v.ActivityID))
		msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(s.rev, 10))
		switch {
		case s.op.del:
			msg.Header.Set("KV-Operation", "DEL")
			msg.Header.Set(jetstream.MsgTTLHeader, p.clearTTL)
		default:
			b, err := json.Marshal(s.op.v)
			if err != nil {
				continue
			}
			msg.Data = b
			if s.op.clear {
				msg.Header.Set(jetstream.MsgTTLHeader, p.clearTTL)
			}
		}
		f, err := p.js.PublishMsgAsync(msg)
		if err != nil {
			// The asynchronous window is full (a frozen bucket): tried
			// again in a later round.
			p.requeue(s.op)
			continue
		}
		s.f = f
	}
	deadline := time.NewTimer(viewAckWait)
	defer deadline.Stop()
	var conflicts []sent
	for _, s := range ops {
		if s.f == nil {
			continue
		}
		select {
		case ack := <-s.f.Ok():
			p.stored(s.op, ack.Sequence)
		case err := <-s.f.Err():
			if isConflict(err) {
				conflicts = append(conflicts, s)
				continue
			}
			if errors.Is(err, jetstream.ErrAsyncPublishTimeout) || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) {
				p.requeue(s.op)
				continue
			}
			p.m.viewsDropped.WithLabelValues("failed").Inc()
			p.d.Log.Warn("view not stored", slog.Int64("activity_id", s.op.v.ActivityID), slog.Any("err", err))
			p.mu.Lock()
			p.rebuild = true
			p.mu.Unlock()
		case <-deadline.C:
			// Unanswered: may be stored or not. Sent again (a conflict
			// sorts it out if it was stored).
			p.requeue(s.op)
		case <-ctx.Done():
			p.requeue(s.op)
		}
	}
	for _, s := range conflicts {
		if ctx.Err() != nil {
			return
		}
		p.resolve(ctx, s.op)
	}
}

func isConflict(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// requeue puts op back unless a later write of its key is pending.
func (p *Publisher) requeue(op viewOp) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.pending[op.v.ActivityID]; !ok {
		p.pending[op.v.ActivityID] = op
	}
}

// stored records a write's new revision.
func (p *Publisher) stored(op viewOp, rev uint64) {
	if op.del {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if ks, ok := p.keys.Peek(op.v.ActivityID); ok {
		ks.rev = rev
		p.keys.Add(op.v.ActivityID, ks)
	}
}

// resolve handles a write that found its key at another revision than it
// expected: it reads the key and decides (see the top of this file).
func (p *Publisher) resolve(ctx context.Context, op viewOp) {
	id := op.v.ActivityID
	if op.tries >= 5 || op.del {
		// The key keeps moving under this write, or a delete lost its
		// revision: a rebuild sets the bucket right.
		p.m.viewsDropped.WithLabelValues("stale").Inc()
		p.mu.Lock()
		p.rebuild = true
		p.mu.Unlock()
		return
	}
	op.tries++
	cur, sheddable, err := p.current(ctx, id)
	if err != nil {
		p.requeue(op)
		return
	}
	retry := false
	switch {
	case cur.present && cur.seq >= placeOf(op.v):
		// The bucket holds a later (or the same) state: it wins.
	case cur.present:
		retry = true
	case op.clear:
		// Nothing stored to clear.
	default:
		// Empty (a clear that expired, or never written): a full view goes
		// in only if it is still the activity's state.
		row, ok, err := store.GetActivityRow(ctx, p.d.DB, id)
		if err != nil {
			p.requeue(op)
			return
		}
		retry = ok && row.NextSeq-1 == placeOf(op.v)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	ks, tracked := p.keys.Peek(id)
	if tracked {
		ks.rev = cur.rev
		if !retry && cur.present && cur.seq >= ks.seq {
			ks.seq, ks.live = cur.seq, sheddable
		}
		p.keys.Add(id, ks)
	}
	if _, newer := p.pending[id]; newer {
		return // a later write goes at the revision just learnt
	}
	if !retry {
		if !(cur.present && cur.seq == placeOf(op.v)) {
			p.m.viewsDropped.WithLabelValues("stale").Inc()
		}
		return
	}
	op.rev = cur.rev
	if !tracked && !op.clear {
		// A full view is tracked, to be cleared later; a clear needs
		// no tracking (it expires).
		p.keys.Add(id, keyState{rev: cur.rev, seq: placeOf(op.v), live: true})
	}
	p.pending[id] = op
}

// stored view of a key, as read back.
type storedView struct {
	present bool   // a put (not a delete, purge or expiry marker)
	rev     uint64 // the key's last message, 0 if it has none
	seq     uint64 // the view's sequence, when present
}

// current reads the last message of id's key.
func (p *Publisher) current(ctx context.Context, id int64) (storedView, bool, error) {
	if p.stream == nil {
		st, err := p.js.Stream(ctx, bus.KeyValueStream(wire.ViewBucket))
		if err != nil {
			return storedView{}, false, err
		}
		p.stream = st
	}
	ctx, cancel := context.WithTimeout(ctx, viewAckWait)
	defer cancel()
	m, err := p.stream.GetLastMsgForSubject(ctx, "$KV."+wire.ViewBucket+"."+wire.ViewKey(id))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return storedView{}, false, nil
	}
	if err != nil {
		return storedView{}, false, err
	}
	sv := storedView{rev: m.Sequence}
	if m.Header.Get("KV-Operation") != "" || m.Header.Get(jetstream.MarkerReasonHeader) != "" {
		return sv, false, nil
	}
	var v wire.View
	if json.Unmarshal(m.Data, &v) != nil {
		// Unreadable: any write replaces it.
		return storedView{present: true, rev: m.Sequence}, false, nil
	}
	sv.present, sv.seq = true, placeOf(v)
	return sv, allocation.ViewDecides(v), nil
}

// listed is one key of this partition found in the bucket.
type listed struct {
	rev, seq  uint64
	sheddable bool
	created   time.Time
}

func (p *Publisher) clearTTLDuration() time.Duration {
	d, _ := time.ParseDuration(p.clearTTL)
	return d
}

// rebuildViews makes the bucket's views of this partition agree with
// MySQL: it reads the bucket's keys of the partition (the bucket holds
// about one per full activity), then in one snapshot the partition's full
// activities, and queues a view for each viewed one and a clear for each
// stored sheddable view of an activity no longer viewed. At start and
// whenever this allocator takes the partition: the previous owner may have
// stopped between a commit and its views.
func (p *Publisher) rebuildViews(ctx context.Context) error {
	start := time.Now()
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	p.mu.Lock()
	p.rebuilding, p.seen = true, make(map[int64]seenState)
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.rebuilding, p.seen = false, nil
		p.mu.Unlock()
	}()
	oldest := time.Now().Add(-2*p.clearTTLDuration() - 2*bus.ViewMarkerTTL - 5*time.Second)
	keys, legacy, err := p.listKeys(lctx, oldest)
	if err != nil {
		return err
	}
	rebuilt, snap, err := p.snapshotViews(ctx, keys)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.trackListed(keys)
	full := p.queueRebuilt(keys, rebuilt)
	if !full {
		p.queueClears(keys, rebuilt, snap, oldest)
	}
	for _, op := range legacy {
		if _, ok := p.pending[op.v.ActivityID]; !ok && !full {
			p.queue(op)
		}
	}
	if full {
		p.rebuild = true
		p.m.viewsDropped.WithLabelValues("queue_full").Inc()
	}
	p.queueEvicted()
	p.m.viewsPending.Set(float64(len(p.pending)))
	p.mu.Unlock()
	p.m.viewRebuilds.Inc()
	p.m.viewRebuildSecs.Observe(time.Since(start).Seconds())
	return nil
}

// listKeys lists the bucket's keys of this partition as they are now, and
// the old messages without a TTL that should have one (cleared views and
// deletes written before cleared views expired: an upgrade), written again
// with one, once.
func (p *Publisher) listKeys(lctx context.Context, oldest time.Time) (map[int64]listed, []viewOp, error) {
	keys := make(map[int64]listed)
	var legacy []viewOp
	w, err := p.d.KV.WatchAll(lctx)
	if err != nil {
		return nil, nil, err
	}
	// Stopped as soon as the current values are in: updates that follow
	// (expiry markers, other writers) would block the watcher's delivery
	// for ever if nobody read them.
	defer stopWatch(w)
	for listing := true; listing; {
		var e jetstream.KeyValueEntry
		select {
		case e = <-w.Updates():
		case <-lctx.Done():
			// A bucket that stopped answering: the watcher's channel
			// would wait for ever.
			return nil, nil, lctx.Err()
		}
		if e == nil {
			listing = false // the current values are in
			stopWatch(w)
			continue
		}
		id, err := strconv.ParseInt(strings.TrimPrefix(e.Key(), "a."), 10, 64)
		if err != nil || bus.PartitionOf(id, p.d.Partitions) != p.d.Partition {
			continue
		}
		if e.Operation() != jetstream.KeyValuePut {
			if e.Created().Before(oldest) {
				legacy = append(legacy, viewOp{v: wire.View{ActivityID: id}, del: true, rev: e.Revision()})
			}
			continue
		}
		l := listed{rev: e.Revision(), created: e.Created()}
		var v wire.View
		if json.Unmarshal(e.Value(), &v) == nil {
			l.seq, l.sheddable = placeOf(v), allocation.ViewDecides(v)
		} else {
			l.sheddable = true // unreadable: cleared below
		}
		keys[id] = l
	}
	return keys, legacy, nil
}

// snapshotViews reads, in one MySQL snapshot, the full activities of this
// partition and those whose listed view could decide a claim, and returns
// the views they get now.
func (p *Publisher) snapshotViews(ctx context.Context, keys map[int64]listed) (map[int64]wire.View, store.ViewSnapshot, error) {
	var also []int64
	for id, l := range keys {
		if l.sheddable {
			also = append(also, id)
		}
	}
	mine := func(id int64) bool { return bus.PartitionOf(id, p.d.Partitions) == p.d.Partition }
	snap, err := store.ReadViewSnapshot(ctx, p.d.DB, mine, also, wire.MaxViewHolders, p.d.Between)
	if err != nil {
		return nil, snap, err
	}
	rebuilt := make(map[int64]wire.View, len(snap.Full))
	for _, row := range snap.Full {
		if snap.Waiting[row.ID] {
			continue
		}
		if row.Confirmed > wire.MaxViewHolders {
			rebuilt[row.ID] = at(wire.View{ActivityID: row.ID, Capacity: row.Capacity, Confirmed: row.Confirmed}, row.NextSeq-1)
			continue
		}
		act, err := p.d.Restore(row, snap.Seats[row.ID])
		if err != nil {
			p.d.Log.Warn("rebuild view: skipped", slog.Int64("activity_id", row.ID), slog.Any("err", err))
			continue
		}
		if viewed(act) {
			rebuilt[row.ID] = viewOf(act)
		}
	}
	return rebuilt, snap, nil
}

// trackListed updates the keys tracked from what the bucket holds, under
// p.mu. The keys listed and not tracked stay so unless a view of theirs is
// kept: the bucket may hold more keys than are tracked (the stale views a
// rebuild clears), and tracking them all would evict the tracked keys of
// full activities, whose eviction deletes their views.
func (p *Publisher) trackListed(keys map[int64]listed) {
	for id, l := range keys {
		ks, ok := p.keys.Peek(id)
		if !ok {
			continue
		}
		if l.seq >= ks.seq {
			ks.rev, ks.seq, ks.live = l.rev, l.seq, l.sheddable
		} else {
			ks.rev = max(ks.rev, l.rev)
		}
		p.keys.Add(id, ks)
	}
}

// known is what the publisher knows of id's key: tracked, or listed.
func (p *Publisher) known(keys map[int64]listed, id int64) (keyState, bool, bool) {
	if ks, ok := p.keys.Peek(id); ok {
		return ks, true, true
	}
	l, ok := keys[id]
	return keyState{rev: l.rev, seq: l.seq, live: l.sheddable}, ok, false
}

// queueRebuilt queues the rebuilt views the bucket does not hold yet,
// under p.mu. It reports whether the queue filled up first: the rest waits
// for a later rebuild.
func (p *Publisher) queueRebuilt(keys map[int64]listed, rebuilt map[int64]wire.View) (full bool) {
	for id, v := range rebuilt {
		if len(p.pending) >= p.d.Track {
			// The rest after the queue drained: a later rebuild.
			full = true
			break
		}
		if s := p.seen[id]; s.seq >= placeOf(v) && s.seq > 0 {
			// The apply loop has a later state: it queued its view, or
			// its clear if it tracked the key. One it did not track may
			// hold a view listed here, which its state clears.
			l, listed := keys[id]
			if _, tracked := p.keys.Peek(id); !s.viewed && !tracked && listed && l.sheddable && l.seq < s.seq {
				p.queue(viewOp{v: at(wire.View{ActivityID: id}, s.seq), clear: true, rev: l.rev})
			}
			continue
		}
		ks, ok, tracked := p.known(keys, id)
		if ok && ks.seq >= placeOf(v) {
			if !tracked {
				p.keys.Add(id, ks) // stored already: tracked from now on
			}
			continue
		}
		ks.seq, ks.live = placeOf(v), true
		p.keys.Add(id, ks)
		p.queue(viewOp{v: v})
	}
	return full
}

// queueClears queues a clear for each listed view that could decide a
// claim and is not rebuilt, and a TTL for old clears without one, under
// p.mu.
func (p *Publisher) queueClears(keys map[int64]listed, rebuilt map[int64]wire.View, snap store.ViewSnapshot, oldest time.Time) {
	for id, l := range keys {
		if _, ok := rebuilt[id]; ok {
			continue
		}
		if !l.sheddable {
			if ks, _ := p.keys.Peek(id); l.created.Before(oldest) && ks.seq <= l.seq {
				// A cleared view without a TTL: put again with one, at
				// the listed revision (a clear is not tracked).
				p.quiet = true
				p.keys.Remove(id)
				p.quiet = false
				p.queue(viewOp{v: at(wire.View{ActivityID: id}, l.seq), clear: true, rev: l.rev})
			}
			continue
		}
		v := at(wire.View{ActivityID: id}, l.seq)
		if row, ok := snap.Rows[id]; ok {
			v = at(wire.View{ActivityID: id, Capacity: row.Capacity, Confirmed: row.Confirmed}, max(row.NextSeq-1, l.seq))
		}
		ks, _, tracked := p.known(keys, id)
		if ks.seq > placeOf(v) || !ks.live {
			continue // the apply loop queued a later state
		}
		if tracked {
			ks.seq, ks.live = placeOf(v), false
			p.keys.Add(id, ks)
		}
		// A key not tracked stays so: its clear goes at the listed
		// revision, and expires.
		p.queue(viewOp{v: v, clear: true, rev: ks.rev})
	}
}

// stopWatch stops w and reads what its delivery still holds, so that no
// delivery stays blocked on a full channel.
func stopWatch(w jetstream.KeyWatcher) {
	w.Stop() //nolint:errcheck
	idle := time.NewTimer(20 * time.Millisecond)
	defer idle.Stop()
	for {
		select {
		case _, ok := <-w.Updates():
			if !ok {
				return
			}
			idle.Reset(20 * time.Millisecond)
		case <-idle.C:
			return
		}
	}
}
