package allocator

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// viewOf is the view of a full activity.
func viewOf(act *allocation.Activity) wire.View {
	v := wire.View{ActivityID: act.ID, Capacity: act.Capacity, Confirmed: act.Confirmed, Seq: act.NextSeq - 1}
	if act.Confirmed+act.Waiting() > wire.MaxViewHolders {
		return v
	}
	v.Complete = true
	for _, s := range act.Live() { // ordered by queue_seq: waiters come out head first
		if s.Status == wire.StatusConfirmed {
			v.Holders = append(v.Holders, s.UserID)
		} else {
			v.Waiters = append(v.Waiters, s.UserID)
		}
	}
	return v
}

// publishViews refreshes the views of the activities a commit changed: a
// full one gets its current view, one that is no longer full loses its key.
// Best effort after commit: a view that is missing only costs ingest a trip
// through the stream; a stale one is repaired at the next change or start.
func (a *Allocator) publishViews(ctx context.Context, changed []*allocation.Activity) {
	if a.views == nil {
		return
	}
	var notify []wire.View
	for _, act := range changed {
		key := wire.ViewKey(act.ID)
		if act.Confirmed < act.Capacity {
			if a.viewFull[act.ID] {
				notify = append(notify, wire.View{ActivityID: act.ID, Capacity: act.Capacity, Confirmed: act.Confirmed, Seq: act.NextSeq - 1})
				if err := a.views.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
					a.log.WarnContext(ctx, "delete view", slog.Int64("activity_id", act.ID), slog.Any("err", err))
					continue
				}
				delete(a.viewFull, act.ID)
			}
			continue
		}
		v := viewOf(act)
		notify = append(notify, v)
		b, err := json.Marshal(v)
		if err == nil {
			_, err = a.views.Put(ctx, key, b)
		}
		if err != nil {
			a.log.WarnContext(ctx, "put view", slog.Int64("activity_id", act.ID), slog.Any("err", err))
			continue
		}
		a.viewFull[act.ID] = true
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
		if err != nil {
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
