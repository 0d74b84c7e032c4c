package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// OutboxRow is a processed request whose events are still to be relayed.
type OutboxRow struct {
	Seq        uint64
	RequestID  string
	ActivityID int64
	Events     string
	AppliedAt  time.Time
}

// EnsureRelay creates the relay cursor of partition p if it is missing.
func EnsureRelay(ctx context.Context, q DBTX, p int) error {
	if _, err := q.ExecContext(ctx, "INSERT IGNORE INTO event_relay (partition_id, last_seq) VALUES (?, 0)", p); err != nil {
		return fmt.Errorf("ensure relay %d: %w", p, err)
	}
	return nil
}

// LockRelay locks the relay cursor of partition p, so one relay at a time
// publishes a partition's events, and returns it.
func LockRelay(ctx context.Context, tx *sql.Tx, p int) (uint64, error) {
	var last uint64
	err := tx.QueryRowContext(ctx, "SELECT last_seq FROM event_relay WHERE partition_id = ? FOR UPDATE", p).Scan(&last)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("lock relay %d: no cursor row (EnsureRelay first)", p)
	}
	if err != nil {
		return 0, fmt.Errorf("lock relay %d: %w", p, err)
	}
	return last, nil
}

// PendingOutbox returns up to limit processed requests of partition p after
// seq, in seq order, and the last seq it looked at. Rows without events are
// skipped but still move the cursor. A partition's rows commit in seq order
// (one fenced writer), so nothing below the cursor can appear later.
func PendingOutbox(ctx context.Context, tx *sql.Tx, p int, after uint64, limit int) ([]OutboxRow, uint64, error) {
	rows, err := tx.QueryContext(ctx, "SELECT seq, request_id, activity_id, events, applied_at FROM processed_request "+
		"WHERE partition_id = ? AND seq > ? ORDER BY seq LIMIT ?", p, after, limit)
	if err != nil {
		return nil, after, fmt.Errorf("pending outbox: %w", err)
	}
	defer rows.Close()
	var out []OutboxRow
	last := after
	for rows.Next() {
		var (
			r      OutboxRow
			events sql.NullString
		)
		if err := rows.Scan(&r.Seq, &r.RequestID, &r.ActivityID, &events, &r.AppliedAt); err != nil {
			return nil, after, fmt.Errorf("pending outbox: %w", err)
		}
		last = r.Seq
		if events.Valid && events.String != "" {
			r.Events = events.String
			r.AppliedAt = r.AppliedAt.UTC()
			out = append(out, r)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, after, fmt.Errorf("pending outbox: %w", err)
	}
	return out, last, nil
}

// SetRelay moves the relay cursor of partition p.
func SetRelay(ctx context.Context, tx *sql.Tx, p int, last uint64) error {
	if _, err := tx.ExecContext(ctx, "UPDATE event_relay SET last_seq = ? WHERE partition_id = ?", last, p); err != nil {
		return fmt.Errorf("set relay %d: %w", p, err)
	}
	return nil
}

// OutboxBacklog counts processed requests of partition p whose events are
// not yet relayed.
func OutboxBacklog(ctx context.Context, q DBTX, p int) (int64, error) {
	var n int64
	err := q.QueryRowContext(ctx, "SELECT COUNT(*) FROM processed_request WHERE partition_id = ? AND events IS NOT NULL AND seq > "+
		"(SELECT last_seq FROM event_relay WHERE partition_id = ?)", p, p).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("outbox backlog: %w", err)
	}
	return n, nil
}
