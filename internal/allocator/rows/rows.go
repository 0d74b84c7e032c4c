// Package rows is the allocator's mapping between MySQL's rows (package
// store) and the domain's state (package allocation).
package rows

import (
	"fmt"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// Activity is the live state of an activity from its row and its live
// signups (the rows in MySQL), checked against the domain's invariants.
func Activity(row store.ActivityRow, live []store.SignupRow) (*allocation.Activity, error) {
	act, err := allocation.Restore(row.ID, row.Capacity, row.Confirmed, row.NextSeq, row.Hold, signups(live))
	if err != nil {
		return nil, fmt.Errorf("activity %d in mysql breaks an invariant: %w", row.ID, err)
	}
	return act, nil
}

// signups is the domain's signups of live rows.
func signups(live []store.SignupRow) []allocation.Signup {
	out := make([]allocation.Signup, len(live))
	for i, s := range live {
		out[i] = allocation.Signup{UserID: s.UserID, Status: s.Status, QueueSeq: s.QueueSeq, HeldUntil: s.HeldUntil, HoldSeq: s.HoldSeq}
	}
	return out
}

// Matches reports whether a cached state is still the one row holds.
func Matches(act *allocation.Activity, row store.ActivityRow) bool {
	return act.NextSeq == row.NextSeq && act.Capacity == row.Capacity && act.Confirmed == row.Confirmed &&
		act.Hold == row.Hold && act.Held == row.Held && act.Waiting() == row.Waiting
}

// ActivityRow is the row that stores act.
func ActivityRow(act *allocation.Activity) store.ActivityRow {
	return store.ActivityRow{ID: act.ID, Capacity: act.Capacity, Confirmed: act.Confirmed, NextSeq: act.NextSeq,
		Hold: act.Hold, Held: act.Held, Waiting: act.Waiting()}
}

// SignupRow is the row that stores s, a signup of activity.
func SignupRow(activity int64, s allocation.Signup) store.SignupRow {
	return store.SignupRow{ActivityID: activity, UserID: s.UserID, Status: s.Status, QueueSeq: s.QueueSeq,
		HeldUntil: s.HeldUntil, HoldSeq: s.HoldSeq}
}

// ResultRow is the row that records res (and the events its decision
// caused: the outbox) in partition.
func ResultRow(res wire.Result, partition int, events []allocation.Event) store.ResultRow {
	return store.ResultRow{Result: res, Partition: partition, Events: store.EncodeEvents(events)}
}

// WaiterSeqs are the queue_seqs of act's WAITING signups: its waitlist
// buckets' content.
func WaiterSeqs(act *allocation.Activity) []uint64 {
	var seqs []uint64
	for _, s := range act.Live() {
		if s.Status == wire.StatusWaiting {
			seqs = append(seqs, s.QueueSeq)
		}
	}
	return seqs
}
