package allocator

import (
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// viewed reports whether act gets a view: full, and nobody waiting.
func viewed(act *allocation.Activity) bool {
	return act.Confirmed >= act.Capacity && act.Waiting() == 0
}

// viewOf is the view of a viewed activity.
func viewOf(act *allocation.Activity) wire.View {
	v := wire.View{ActivityID: act.ID, Capacity: act.Capacity, Confirmed: act.Confirmed, Seq: act.NextSeq - 1}
	if act.Confirmed > wire.MaxViewHolders {
		return v
	}
	// A claim by a HELD user is answered ALREADY_OWNED with status HELD
	// and held_until, so the HELD users are listed apart, with their
	// holds' ends, in a view an ingest without holds does not shed from.
	v.Holders = make([]int64, 0, act.Confirmed-act.Held)
	for _, s := range act.Live() {
		if s.Status == wire.StatusHeld {
			v.Held = append(v.Held, wire.HeldSeat{UserID: s.UserID, HeldUntil: s.HeldUntil})
			continue
		}
		v.Holders = append(v.Holders, s.UserID)
	}
	if len(v.Held) > 0 {
		v.HoldsListed = true
	} else {
		v.Complete = true
	}
	return v
}

// publishViews refreshes the views of the activities a commit changed: a
// viewed one gets its current view, one that no longer is gets a cleared
// view (a put with Complete=false and the sequence it covers, so that an
// older view arriving late at an ingest is ignored there).
//
// Views are an optimisation, never the proof: ingest answers a claim early
// only after seeing, in the request stream itself, that nothing that could
// change the answer was stored between the view's sequence and the claim's.
// So a view that is missing or stale costs a trip through the allocator,
// never a wrong answer. It is still kept fresh: viewFull says which keys
// may hold a sheddable view, and rebuildViews, run whenever this allocator
// takes the partition, recomputes them all from MySQL.
func (a *Allocator) publishViews(ctx context.Context, changed []*allocation.Activity) {
	if a.views == nil || len(changed) == 0 && len(a.viewDropped) == 0 {
		return
	}
	// Writes to the bucket go out as asynchronous publishes on its subjects
	// (what kv.Put sends), all acknowledged together: one round trip per
	// batch, not one per activity.
	var (
		notify  []wire.View
		futures []jetstream.PubAckFuture
		cleared []int64
	)
	send := func(v wire.View) bool {
		b, err := json.Marshal(v)
		if err != nil {
			return false
		}
		msg := nats.NewMsg("$KV." + wire.ViewBucket + "." + wire.ViewKey(v.ActivityID))
		msg.Data = b
		f, err := a.js.PublishMsgAsync(msg)
		if err != nil {
			a.log.WarnContext(ctx, "publish view", slog.Int64("activity_id", v.ActivityID), slog.Any("err", err))
			return false
		}
		futures = append(futures, f)
		notify = append(notify, v)
		return true
	}
	for _, act := range changed {
		if viewed(act) {
			// Marked before the PubAck: a put that times out may still be
			// stored, and must be cleared at the next change.
			a.viewFull.Add(act.ID, struct{}{})
			send(viewOf(act))
			continue
		}
		if a.viewFull.Contains(act.ID) && send(clearedView(act)) {
			cleared = append(cleared, act.ID)
		}
	}
	// Views this allocator stopped tracking are deleted: it could not
	// clear them later. A delete carries no sequence; ingest keeps the one
	// it has.
	for _, id := range a.viewDropped {
		if a.viewFull.Contains(id) {
			continue
		}
		msg := nats.NewMsg("$KV." + wire.ViewBucket + "." + wire.ViewKey(id))
		msg.Header.Set("KV-Operation", "DEL")
		if f, err := a.js.PublishMsgAsync(msg); err == nil {
			futures = append(futures, f)
		}
	}
	a.viewDropped = a.viewDropped[:0]
	ok := true
	timeout := time.After(5 * time.Second)
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			ok = false
			a.log.WarnContext(ctx, "view not stored", slog.Any("err", err))
		case <-timeout:
			ok = false
		}
		if !ok {
			break
		}
	}
	if ok {
		a.viewClearing = true // a clear is not a drop: no delete follows
		for _, id := range cleared {
			a.viewFull.Remove(id)
		}
		a.viewClearing = false
	}
	if len(notify) > 0 {
		// Before the results: ingest applies these first.
		if b, err := json.Marshal(wire.ResultBatch{Views: notify}); err == nil {
			a.nc.Publish(wire.ResultSubject, b) //nolint:errcheck // the bucket is the durable copy
		}
	}
}

// clearedView is the view that replaces a full activity's once it is not.
func clearedView(act *allocation.Activity) wire.View {
	return wire.View{ActivityID: act.ID, Capacity: act.Capacity, Confirmed: act.Confirmed, Seq: act.NextSeq - 1}
}

// rebuildViews makes every sheddable view of this partition's activities
// in the bucket agree with MySQL: at start, and whenever this allocator
// takes the partition over, since the previous owner may have stopped
// between a commit and its views, or left views this allocator never
// published and so would never clear. It reads the bucket's current
// values; cleared views need no repair (nothing is shed from them).
func (a *Allocator) rebuildViews(ctx context.Context) error {
	w, err := a.views.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return err
	}
	defer w.Stop() //nolint:errcheck
	var ids []int64
	for e := range w.Updates() {
		if e == nil {
			break // the current values are in
		}
		var v wire.View
		if json.Unmarshal(e.Value(), &v) != nil || !v.Sheddable() {
			continue
		}
		id, err := strconv.ParseInt(strings.TrimPrefix(e.Key(), "a."), 10, 64)
		if err != nil || bus.PartitionOf(id, a.cfg.Partitions) != a.cfg.Partition {
			continue
		}
		ids = append(ids, id)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var acts []*allocation.Activity
	for _, id := range ids {
		row, ok, err := store.GetActivityRow(ctx, a.db, id)
		if err != nil {
			return err
		}
		if !ok {
			// A view of an activity MySQL does not have (a database
			// started over under an old bucket): never shed from it.
			a.views.Delete(ctx, wire.ViewKey(id)) //nolint:errcheck
			continue
		}
		live, err := store.LiveSignups(ctx, a.db, id)
		if err != nil {
			return err
		}
		act, err := allocation.Restore(id, row.Capacity, row.Confirmed, row.NextSeq, row.Hold, toSignups(live))
		if err != nil {
			// The row and the signups were read apart, and a commit of
			// the previous owner fell between them. Tracked, the view is
			// cleared or renewed at the activity's next change.
			a.log.WarnContext(ctx, "rebuild view: skipped", slog.Int64("activity_id", id), slog.Any("err", err))
			a.viewFull.Add(id, struct{}{})
			continue
		}
		a.viewFull.Add(id, struct{}{})
		acts = append(acts, act)
	}
	a.publishViews(ctx, acts)
	a.m.viewRebuilds.Inc()
	return nil
}

func toSignups(live []store.SignupRow) []allocation.Signup {
	out := make([]allocation.Signup, len(live))
	for i, s := range live {
		out[i] = allocation.Signup{UserID: s.UserID, Status: s.Status, QueueSeq: s.QueueSeq, HeldUntil: s.HeldUntil, HoldSeq: s.HoldSeq}
	}
	return out
}
