package allocator

import (
	"fmt"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// The store ↔ allocation mapping: every conversion between MySQL's rows
// (package store) and the domain's state (package allocation) is here.

// activityOf is the live state of an activity from its row and its live
// signups (the rows in MySQL), checked against the domain's invariants.
func activityOf(row store.ActivityRow, live []store.SignupRow) (*allocation.Activity, error) {
	act, err := allocation.Restore(row.ID, row.Capacity, row.Confirmed, row.NextSeq, row.Hold, signupsOf(live))
	if err != nil {
		return nil, fmt.Errorf("activity %d in mysql breaks an invariant: %w", row.ID, err)
	}
	return act, nil
}

// signupsOf is the domain's signups of live rows.
func signupsOf(live []store.SignupRow) []allocation.Signup {
	out := make([]allocation.Signup, len(live))
	for i, s := range live {
		out[i] = allocation.Signup{UserID: s.UserID, Status: s.Status, QueueSeq: s.QueueSeq, HeldUntil: s.HeldUntil, HoldSeq: s.HoldSeq}
	}
	return out
}

// matchesRow reports whether a cached state is still the one row holds.
func matchesRow(act *allocation.Activity, row store.ActivityRow) bool {
	return act.NextSeq == row.NextSeq && act.Capacity == row.Capacity && act.Confirmed == row.Confirmed &&
		act.Hold == row.Hold && act.Held == row.Held && act.Waiting() == row.Waiting
}

// activityRow is the row that stores act.
func activityRow(act *allocation.Activity) store.ActivityRow {
	return store.ActivityRow{ID: act.ID, Capacity: act.Capacity, Confirmed: act.Confirmed, NextSeq: act.NextSeq,
		Hold: act.Hold, Held: act.Held, Waiting: act.Waiting()}
}

// signupRow is the row that stores s, a signup of activity.
func signupRow(activity int64, s allocation.Signup) store.SignupRow {
	return store.SignupRow{ActivityID: activity, UserID: s.UserID, Status: s.Status, QueueSeq: s.QueueSeq,
		HeldUntil: s.HeldUntil, HoldSeq: s.HoldSeq}
}

// resultRow is the row that records res (and the events its decision
// caused: the outbox) in partition.
func resultRow(res wire.Result, partition int, events []allocation.Event) store.ResultRow {
	return store.ResultRow{Result: res, Partition: partition, Events: store.EncodeEvents(events)}
}

// waiterSeqs are the queue_seqs of act's WAITING signups: its waitlist
// buckets' content.
func waiterSeqs(act *allocation.Activity) []uint64 {
	var seqs []uint64
	for _, s := range act.Live() {
		if s.Status == wire.StatusWaiting {
			seqs = append(seqs, s.QueueSeq)
		}
	}
	return seqs
}
