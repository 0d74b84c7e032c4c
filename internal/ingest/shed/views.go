// Package shed answers a claim for a full activity as soon as the
// request stream proves its answer, before the allocator applies it
// (shedding): the views of full activities (views.go, from the ALLOT_VIEW
// bucket and the result batches) and the tail of the request stream that
// proves a view still holds at a claim's sequence (tail.go). Answerer is
// the component.
package shed

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/wire"
)

// Shedding: a claim for an activity that the allocator reports full is
// published to the request stream like every other request (so it is
// durable, ordered, applied, recorded and replayed by the audit),
// and answered as soon as its answer is provably decided at its place in
// the stream, without waiting for the allocator to apply it:
//
//  1. the allocator keeps, in the ALLOT_VIEW bucket, a view of every full
//     activity without waiters: its counters, every holder, and the place
//     V (wire.Place(View.Seq, View.Index)) of the last request its state
//     covers;
//  2. the claim is published, alone or in a batch, and gets its place C
//     from the PubAck (its message's sequence, its index in it), known for
//     sure (publish.Stored.Sole: no other copy of it may be stored);
//  3. the tail (tail.go) follows the stream past C's message and finds no
//     request on the activity other than claims in (V, C].
//
// Then the state at C is the view's state (claims change nothing on a full
// activity), and the answer is the allocator's: a holder gets ALREADY_OWNED
// with the status of the seat (CONFIRMED, or HELD with the end of the hold
// in an activity with holds), anyone else SOLD_OUT. Otherwise the claim
// waits for the allocator like any other write. The allocator applies it
// later and records the same result.
//
// A hold that ends changes nothing by itself: the seat stays HELD until its
// expire request is applied, and that request, like a confirm, is a
// non-claim the tail sees. So a claim by a HELD user stored before the
// expire is ALREADY_OWNED, HELD, whatever the clock says.

// View is the decoded view of one full activity, as a claim's handler
// sees it before publishing (Answerer.Candidate).
type View struct {
	v wire.View
	// holders maps every user holding a seat to the seat
	// (allocation.ViewSeats): what allocation.ClaimOnFull decides from.
	holders map[int64]allocation.Signup
}

// viewEntry is ingest's copy of one activity's key: the highest place a
// view of it covered (cleared views included), and the sheddable view at
// that place, if it is one.
type viewEntry struct {
	place uint64
	sv    *View
}

// place is the place of the last request v covers.
func (v *View) place() uint64 { return wire.Place(v.v.Seq, v.v.Index) }

// views is ingest's copy of the ALLOT_VIEW bucket, bounded (LRU): a view
// forgotten only sends its activity's claims to the allocator.
type views struct {
	mu sync.Mutex // orders puts; reads need only the cache's own lock
	m  *lru.Cache[int64, viewEntry]
	// next holds, per activity, the channel its next installed view
	// closes (changes); nil in tests that need none.
	next *lru.Cache[int64, chan struct{}]
}

func (vs *views) get(activity int64) *View {
	e, _ := vs.m.Get(activity)
	return e.sv
}

func (vs *views) apply(e jetstream.KeyValueEntry) error {
	id, err := strconv.ParseInt(strings.TrimPrefix(e.Key(), "a."), 10, 64)
	if err != nil {
		return errors.New("bad view key " + e.Key())
	}
	if e.Operation() != jetstream.KeyValuePut {
		// A delete carries no place: drop the view, keep the place.
		vs.mu.Lock()
		if old, ok := vs.m.Peek(id); ok {
			vs.m.Add(id, viewEntry{place: old.place})
		}
		vs.mu.Unlock()
		return nil
	}
	var v wire.View
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		return err
	}
	if v.ActivityID != id {
		return errors.New("view under key " + e.Key() + " is of activity " + strconv.FormatInt(v.ActivityID, 10))
	}
	vs.put(v)
	return nil
}

// put installs v unless a view of a later state, cleared or not, is
// already installed: a late put never overrides a newer clear. A view that
// cannot decide a claim clears the activity's.
func (vs *views) put(v wire.View) {
	var sv *View
	if seats, ok := allocation.ViewSeats(v); ok {
		sv = &View{v: v, holders: seats}
	}
	vs.mu.Lock()
	defer vs.mu.Unlock()
	place := wire.Place(v.Seq, v.Index)
	if old, ok := vs.m.Peek(v.ActivityID); ok && old.place > place {
		return
	}
	vs.m.Add(v.ActivityID, viewEntry{place: place, sv: sv})
	if vs.next == nil {
		return
	}
	if ch, ok := vs.next.Peek(v.ActivityID); ok {
		close(ch)
		vs.next.Remove(v.ActivityID)
	}
}

// changes is the channel the next view of activity installed closes.
func (vs *views) changes(activity int64) <-chan struct{} {
	if vs.next == nil {
		return nil // never closes
	}
	vs.mu.Lock()
	defer vs.mu.Unlock()
	if ch, ok := vs.next.Get(activity); ok {
		return ch
	}
	ch := make(chan struct{})
	vs.next.Add(activity, ch)
	return ch
}

// watchViews keeps e.views current until stop is called; stop returns
// once the watcher's subscription is gone.
func (a *Answerer) watchViews(kv jetstream.KeyValue) (stop func(), err error) {
	ctx, cancel := context.WithCancel(context.Background())
	w, err := kv.WatchAll(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer w.Stop() //nolint:errcheck
		for {
			select {
			case <-ctx.Done():
				return
			case u, ok := <-w.Updates():
				if !ok {
					return
				}
				if u == nil { // the initial values are in
					continue
				}
				if err := a.views.apply(u); err != nil {
					a.log.Warn("view update", slog.String("key", u.Key()), slog.Any("err", err))
				}
			}
		}
	}()
	return func() { cancel(); <-done }, nil
}

// DefaultWait bounds how long a claim waits for the tail to pass it
// before it is left to the allocator.
const DefaultWait = time.Second

// Answer decides the claim published as id at place (wire.Place; the only
// copy of it this ingest may have stored) from a view, when the tail
// proves the view still holds at place (see the top of this file).
// candidate is the view seen before publishing, if any; the newest view is
// tried first. It reports whether it decided; with no view at all it
// returns at once.
func (a *Answerer) Answer(ctx context.Context, id string, activity, user int64, place uint64, candidate *View) (wire.Result, bool) {
	return a.answer(ctx, id, activity, user, place, candidate, true)
}

// Changes returns a channel that the next view of activity to arrive
// closes: a claim left to the allocator waits on it too, and tries Retry
// when it closes. It is forgotten, never closed, once ActivityCache other
// activities have been asked about since; the claim then just waits for
// the allocator.
func (a *Answerer) Changes(activity int64) <-chan struct{} { return a.views.changes(activity) }

// Retry is Answer again, from the newest view, for a claim that waits for
// the allocator after a view of its activity arrived (Changes). Its first
// Answer counted the miss, so a retry that misses is not counted again.
func (a *Answerer) Retry(ctx context.Context, id string, activity, user int64, place uint64) (wire.Result, bool) {
	return a.answer(ctx, id, activity, user, place, nil, false)
}

func (a *Answerer) answer(ctx context.Context, id string, activity, user int64, place uint64, candidate *View, count bool) (wire.Result, bool) {
	if candidate == nil && a.views.get(activity) == nil {
		return wire.Result{}, false
	}
	miss := func(reason string) (wire.Result, bool) {
		if count {
			a.m.Missed.WithLabelValues(reason).Inc()
		}
		return wire.Result{}, false
	}
	start := time.Now()
	if !a.tail.waitPast(ctx, wire.SeqOf(place), a.wait) {
		return miss("tail_behind")
	}
	a.m.TailWait.Observe(time.Since(start).Seconds())
	var sv *View
	for _, c := range []*View{a.views.get(activity), candidate} {
		if c != nil && a.tail.settled(activity, c.place(), place) {
			sv = c
			break
		}
	}
	if sv == nil {
		return miss("changed")
	}
	seat, holds := sv.holders[user]
	d, decided := allocation.ClaimOnFull(sv.v.Capacity, sv.v.Confirmed, seat, holds)
	if !decided {
		return miss("changed")
	}
	req := wire.Request{RequestID: id, Op: wire.OpClaim, ActivityID: activity, UserID: user}
	res := allocation.ResultOf(req, place, d, nil, time.Now())
	res.Shed = true
	a.answered.Add(id, res)
	a.m.Claims.WithLabelValues(string(res.Outcome)).Inc()
	return res, true
}
