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
	v.Complete = true
	v.Holders = make([]int64, 0, act.Confirmed)
	for _, s := range act.Live() {
		v.Holders = append(v.Holders, s.UserID)
	}
	return v
}

// publishViews refreshes the views of the activities a commit changed: a
// viewed one gets its current view, one that no longer is loses its key.
// Best effort after commit: a view that is missing only costs ingest a trip
// through the stream; a stale one is repaired at the next change or start.
func (a *Allocator) publishViews(ctx context.Context, changed []*allocation.Activity) {
	if a.views == nil || len(changed) == 0 {
		return
	}
	// Writes to the bucket go out as asynchronous publishes on its subjects
	// (what kv.Put and kv.Delete send), all acknowledged together: one round
	// trip per batch, not one per activity.
	var (
		notify  []wire.View
		futures []jetstream.PubAckFuture
		full    []int64
		cleared []int64
	)
	send := func(key string, data []byte, del bool) {
		msg := nats.NewMsg("$KV." + wire.ViewBucket + "." + key)
		msg.Data = data
		if del {
			msg.Header.Set("KV-Operation", "DEL")
		}
		f, err := a.js.PublishMsgAsync(msg)
		if err != nil {
			a.log.WarnContext(ctx, "publish view", slog.String("key", key), slog.Any("err", err))
			return
		}
		futures = append(futures, f)
	}
	for _, act := range changed {
		if !viewed(act) {
			if a.viewFull[act.ID] {
				// Complete=false: ingest drops its copy.
				notify = append(notify, wire.View{ActivityID: act.ID, Capacity: act.Capacity, Confirmed: act.Confirmed, Seq: act.NextSeq - 1})
				send(wire.ViewKey(act.ID), nil, true)
				cleared = append(cleared, act.ID)
			}
			continue
		}
		v := viewOf(act)
		b, err := json.Marshal(v)
		if err != nil {
			continue
		}
		notify = append(notify, v)
		send(wire.ViewKey(act.ID), b, false)
		full = append(full, act.ID)
	}
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
		for _, id := range full {
			a.viewFull[id] = true
		}
		for _, id := range cleared {
			delete(a.viewFull, id)
		}
	}
	if len(notify) > 0 {
		// Before the results: ingest applies these first, so no client that
		// has seen a result is answered from an older view.
		if b, err := json.Marshal(wire.ResultBatch{Views: notify}); err == nil {
			a.nc.Publish(wire.ResultSubject, b) //nolint:errcheck // the bucket is the durable copy
		}
	}
}

// repairViews makes every view in the bucket agree with MySQL, for the
// views a crash between commit and publishViews left stale.
func (a *Allocator) repairViews(ctx context.Context) error {
	keys, err := a.views.ListKeys(ctx)
	if err != nil {
		return err
	}
	var acts []*allocation.Activity
	for key := range keys.Keys() {
		id, err := strconv.ParseInt(strings.TrimPrefix(key, "a."), 10, 64)
		if err != nil || bus.PartitionOf(id, a.cfg.Partitions) != a.cfg.Partition {
			continue
		}
		row, ok, err := store.GetActivityRow(ctx, a.db, id)
		if err != nil {
			return err
		}
		if !ok {
			a.views.Delete(ctx, key) //nolint:errcheck
			continue
		}
		live, err := store.LiveSignups(ctx, a.db, id)
		if err != nil {
			return err
		}
		act, err := allocation.Restore(id, row.Capacity, row.Confirmed, row.NextSeq, toSignups(live))
		if err != nil {
			return err
		}
		a.viewFull[id] = true
		acts = append(acts, act)
	}
	a.publishViews(ctx, acts)
	return nil
}

func toSignups(live []store.SignupRow) []allocation.Signup {
	out := make([]allocation.Signup, len(live))
	for i, s := range live {
		out[i] = allocation.Signup{UserID: s.UserID, Status: s.Status, QueueSeq: s.QueueSeq}
	}
	return out
}
