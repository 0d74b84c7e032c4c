package store

import (
	"context"
	"database/sql"
	"fmt"
)

// ClaimOutbox locks up to limit unsent events in id order, skipping rows
// another relay holds, so two relays never publish the same row at once.
// Run it at READ COMMITTED so it takes no gap locks that would block the
// allocator's inserts.
func ClaimOutbox(ctx context.Context, tx *sql.Tx, limit int) ([]OutboxRow, error) {
	rows, err := tx.QueryContext(ctx, "SELECT id, event_id, subject, payload FROM outbox ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED", limit)
	if err != nil {
		return nil, fmt.Errorf("claim outbox: %w", err)
	}
	defer rows.Close()
	var out []OutboxRow
	for rows.Next() {
		var r OutboxRow
		if err := rows.Scan(&r.ID, &r.EventID, &r.Subject, &r.Payload); err != nil {
			return nil, fmt.Errorf("claim outbox: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim outbox: %w", err)
	}
	return out, nil
}

// DeleteOutbox removes relayed events.
func DeleteOutbox(ctx context.Context, tx *sql.Tx, rs []OutboxRow) error {
	for c := range chunks(len(rs)) {
		args := make([]any, 0, c.hi-c.lo)
		for _, r := range rs[c.lo:c.hi] {
			args = append(args, r.ID)
		}
		if _, err := tx.ExecContext(ctx, "DELETE FROM outbox WHERE id IN ("+placeholders(len(args), 1)+")", args...); err != nil {
			return fmt.Errorf("delete outbox: %w", err)
		}
	}
	return nil
}

// OutboxBacklog counts events not yet relayed.
func OutboxBacklog(ctx context.Context, q DBTX) (int64, error) {
	var n int64
	if err := q.QueryRowContext(ctx, "SELECT COUNT(*) FROM outbox").Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox backlog: %w", err)
	}
	return n, nil
}
