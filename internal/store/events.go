package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// OutboxRow is a processed request whose events are still to be relayed.
// Events is the first piece of its event list; EventParts more pieces are
// in processed_request_part (OutboxPiece). Seq and Index are the
// request's place.
type OutboxRow struct {
	Seq        uint64
	Index      int
	RequestID  string
	ActivityID int64
	Events     string
	EventParts int
	AppliedAt  time.Time
}

// RelayCursor is how far the relay of a partition has got: every event of
// the requests up to the place (Seq, Index), and the pieces before Piece of
// the first request after it (a request whose event list is stored in
// pieces is relayed one piece at a time).
type RelayCursor struct {
	Seq   uint64
	Index int
	Piece int
}

// EnsureRelay creates the relay cursor of partition p if it is missing,
// unless p's fence row here is frozen (a partition moved away leaves it
// so): an allocator routed here by a stale map leaves no row behind.
func EnsureRelay(ctx context.Context, q DBTX, p int) error {
	if _, err := q.ExecContext(ctx, "INSERT INTO event_relay (partition_id, last_seq) SELECT ?, 0 FROM DUAL "+
		"WHERE NOT EXISTS (SELECT 1 FROM allocator_partition WHERE partition_id = ? AND epoch IS NULL) "+
		"ON DUPLICATE KEY UPDATE partition_id = partition_id", p, p); err != nil {
		return fmt.Errorf("ensure relay %d: %w", p, err)
	}
	return nil
}

// ReadRelay returns the relay cursor of partition p. It takes no lock: the
// relay publishes without holding one, and moves the cursor with
// AdvanceRelay, which refuses to move it from anywhere but where it read it.
func ReadRelay(ctx context.Context, q DBTX, p int) (RelayCursor, error) {
	var c RelayCursor
	err := q.QueryRowContext(ctx, "SELECT last_seq, last_index, next_piece FROM event_relay WHERE partition_id = ?", p).Scan(&c.Seq, &c.Index, &c.Piece)
	if errors.Is(err, sql.ErrNoRows) {
		return c, fmt.Errorf("read relay %d: no cursor row (EnsureRelay first)", p)
	}
	if err != nil {
		return c, fmt.Errorf("read relay %d: %w", p, err)
	}
	return c, nil
}

// AdvanceRelay moves the relay cursor of partition p from from to to, and
// reports false when it was not at from any more (another relay moved it:
// both published the same events with the same ids, which the stream's
// duplicate window and consumers' dedupe by event_id absorb).
func AdvanceRelay(ctx context.Context, q DBTX, p int, from, to RelayCursor) (bool, error) {
	res, err := q.ExecContext(ctx, "UPDATE event_relay SET last_seq = ?, last_index = ?, next_piece = ? "+
		"WHERE partition_id = ? AND last_seq = ? AND last_index = ? AND next_piece = ?",
		to.Seq, to.Index, to.Piece, p, from.Seq, from.Index, from.Piece)
	if err != nil {
		return false, fmt.Errorf("advance relay %d: %w", p, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("advance relay %d: %w", p, err)
	}
	return n == 1, nil
}

// PendingOutbox returns up to limit processed requests of partition p after
// the place of the cursor after (its Piece aside), in place order, and the
// last place it looked at (a cursor with Piece 0; after itself when it
// found nothing). Rows without events are skipped but still move the
// cursor. A partition's rows commit in place order (one fenced writer), so
// nothing below the cursor can appear later. It stops early once it holds
// maxBytes of events.
func PendingOutbox(ctx context.Context, q DBTX, p int, after RelayCursor, limit, maxBytes int) ([]OutboxRow, RelayCursor, error) {
	rows, err := q.QueryContext(ctx, "SELECT seq, batch_index, request_id, activity_id, events, event_parts, applied_at FROM processed_request "+
		"WHERE partition_id = ? AND (seq > ? OR seq = ? AND batch_index > ?) ORDER BY seq, batch_index LIMIT ?",
		p, after.Seq, after.Seq, after.Index, limit)
	if err != nil {
		return nil, after, fmt.Errorf("pending outbox: %w", err)
	}
	defer rows.Close()
	var (
		out   []OutboxRow
		bytes int
	)
	last := after
	for bytes < maxBytes && rows.Next() {
		var (
			r      OutboxRow
			events sql.NullString
		)
		if err := rows.Scan(&r.Seq, &r.Index, &r.RequestID, &r.ActivityID, &events, &r.EventParts, &r.AppliedAt); err != nil {
			return nil, after, fmt.Errorf("pending outbox: %w", err)
		}
		last = RelayCursor{Seq: r.Seq, Index: r.Index}
		if events.Valid && events.String != "" {
			r.Events = events.String
			r.AppliedAt = r.AppliedAt.UTC()
			out = append(out, r)
			bytes += len(r.Events)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, after, fmt.Errorf("pending outbox: %w", err)
	}
	return out, last, nil
}

// OutboxPiece returns piece n (1, 2, …) of the event list of the request at
// (p, seq, index), and the index of its first event.
func OutboxPiece(ctx context.Context, q DBTX, p int, seq uint64, index, n int) (string, int, error) {
	var (
		data  string
		first int
	)
	err := q.QueryRowContext(ctx, "SELECT data, first_event FROM processed_request_part WHERE partition_id = ? AND seq = ? AND batch_index = ? AND col = ? AND piece = ?",
		p, seq, index, ColEvents, n).Scan(&data, &first)
	if err != nil {
		return "", 0, fmt.Errorf("outbox piece %d of seq %d#%d: %w", n, seq, index, err)
	}
	return data, first, nil
}

// SkipOutbox records that the relay of partition p could not read (all
// of) the events of the request at (seq, index), and why.
func SkipOutbox(ctx context.Context, q DBTX, p int, seq uint64, index int, requestID, reason string) error {
	if _, err := q.ExecContext(ctx, "INSERT INTO outbox_skipped (partition_id, seq, batch_index, request_id, reason, skipped_at) VALUES (?, ?, ?, ?, ?, ?) "+
		"ON DUPLICATE KEY UPDATE reason = VALUES(reason)", p, seq, index, requestID, truncate(reason, 1000), time.Now().UTC()); err != nil {
		return fmt.Errorf("record skipped outbox entry %d#%d: %w", seq, index, err)
	}
	return nil
}

// OutboxBacklog counts processed requests of partition p whose events are
// not yet relayed.
func OutboxBacklog(ctx context.Context, q DBTX, p int) (int64, error) {
	var n int64
	err := q.QueryRowContext(ctx, "SELECT COUNT(*) FROM processed_request pr JOIN event_relay er ON er.partition_id = pr.partition_id "+
		"WHERE pr.partition_id = ? AND pr.events IS NOT NULL AND (pr.seq > er.last_seq OR pr.seq = er.last_seq AND pr.batch_index > er.last_index)", p).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("outbox backlog: %w", err)
	}
	return n, nil
}
