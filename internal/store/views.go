package store

import (
	"context"
	"database/sql"
	"fmt"
)

// ViewSnapshot is what a takeover needs to rebuild its views, read in one
// consistent snapshot: every full activity, whether it has waiters, the
// seats of those without, and the rows of the activities asked about.
type ViewSnapshot struct {
	// Full holds the full activities that keep ok; Waiting says which of
	// them have waiters; Seats holds the CONFIRMED and HELD signups of the
	// ones without waiters that have at most maxSeats seats.
	Full    []ActivityRow
	Waiting map[int64]bool
	Seats   map[int64][]SignupRow
	// Rows holds the rows of the activities of also (absent: no row).
	Rows map[int64]ActivityRow
}

// viewChunk bounds the ids of one IN list.
const viewChunk = 500

// ReadViewSnapshot reads a ViewSnapshot in one read-only REPEATABLE READ
// transaction: each statement sees the same snapshot, so a view built from
// it describes exactly the state at its activity's next_seq - 1. keep picks
// the full activities wanted (a partition's), also names activities whose
// rows are wanted whether full or not. between, when set, runs after the
// activity rows are read and before the signups (tests commit there).
func ReadViewSnapshot(ctx context.Context, db *sql.DB, keep func(id int64) bool, also []int64, maxSeats int64, between func()) (ViewSnapshot, error) {
	snap := ViewSnapshot{Waiting: map[int64]bool{}, Seats: map[int64][]SignupRow{}, Rows: map[int64]ActivityRow{}}
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return snap, fmt.Errorf("view snapshot: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // read only
	rows, err := tx.QueryContext(ctx, "SELECT "+activityColumns+" FROM activity WHERE is_full = 1")
	if err != nil {
		return snap, fmt.Errorf("view snapshot: full activities: %w", err)
	}
	for rows.Next() {
		r, err := scanActivity(rows)
		if err != nil {
			rows.Close()
			return snap, fmt.Errorf("view snapshot: full activities: %w", err)
		}
		if keep(r.ID) {
			snap.Full = append(snap.Full, r)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return snap, fmt.Errorf("view snapshot: full activities: %w", err)
	}
	for lo := 0; lo < len(also); lo += viewChunk {
		ids := also[lo:min(lo+viewChunk, len(also))]
		rows, err := tx.QueryContext(ctx, "SELECT "+activityColumns+" FROM activity WHERE id IN ("+placeholders(len(ids), 1)+")", anyIDs(ids)...)
		if err != nil {
			return snap, fmt.Errorf("view snapshot: activities: %w", err)
		}
		for rows.Next() {
			r, err := scanActivity(rows)
			if err != nil {
				rows.Close()
				return snap, fmt.Errorf("view snapshot: activities: %w", err)
			}
			snap.Rows[r.ID] = r
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return snap, fmt.Errorf("view snapshot: activities: %w", err)
		}
	}
	if between != nil {
		between()
	}
	full := make([]int64, len(snap.Full))
	for i, r := range snap.Full {
		full[i] = r.ID
	}
	// Which have waiters: one index probe each (idx_waiting), however long
	// the line.
	for lo := 0; lo < len(full); lo += viewChunk {
		ids := full[lo:min(lo+viewChunk, len(full))]
		rows, err := tx.QueryContext(ctx, "SELECT a.id FROM activity a WHERE a.id IN ("+placeholders(len(ids), 1)+
			") AND EXISTS (SELECT 1 FROM activity_signup w WHERE w.activity_id = a.id AND w.status = 'WAITING')", anyIDs(ids)...)
		if err != nil {
			return snap, fmt.Errorf("view snapshot: waiters: %w", err)
		}
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return snap, fmt.Errorf("view snapshot: waiters: %w", err)
			}
			snap.Waiting[id] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return snap, fmt.Errorf("view snapshot: waiters: %w", err)
		}
	}
	var listed []int64
	for _, r := range snap.Full {
		if !snap.Waiting[r.ID] && r.Confirmed <= maxSeats {
			listed = append(listed, r.ID)
		}
	}
	for lo := 0; lo < len(listed); lo += viewChunk {
		ids := listed[lo:min(lo+viewChunk, len(listed))]
		rows, err := tx.QueryContext(ctx, "SELECT activity_id, user_id, status, queue_seq, held_until, hold_seq FROM activity_signup "+
			"WHERE activity_id IN ("+placeholders(len(ids), 1)+") AND status IN ('CONFIRMED', 'HELD')", anyIDs(ids)...)
		if err != nil {
			return snap, fmt.Errorf("view snapshot: seats: %w", err)
		}
		for rows.Next() {
			var (
				r     SignupRow
				until sql.NullTime
				hold  sql.NullInt64
			)
			if err := rows.Scan(&r.ActivityID, &r.UserID, &r.Status, &r.QueueSeq, &until, &hold); err != nil {
				rows.Close()
				return snap, fmt.Errorf("view snapshot: seats: %w", err)
			}
			if until.Valid {
				r.HeldUntil = until.Time.UTC()
			}
			r.HoldSeq = uint64(hold.Int64)
			snap.Seats[r.ActivityID] = append(snap.Seats[r.ActivityID], r)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return snap, fmt.Errorf("view snapshot: seats: %w", err)
		}
	}
	return snap, tx.Commit()
}

func anyIDs(ids []int64) []any {
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}
