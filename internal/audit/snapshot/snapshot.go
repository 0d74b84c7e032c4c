// Package snapshot is the audit's reads of MySQL, all on the one
// consistent-snapshot transaction the audit opens: the allocator's fence,
// rejected_message, processed_request (paged, one page ahead), activity,
// waitlist_bucket and activity_signup. The audit (internal/audit) compares
// what it replays against these rows.
package snapshot

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"

	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/store/waitlist"
	"github.com/allot-dev/allot/internal/wire"
)

// resultsPage is how many processed_request rows one query reads. Keyset
// pages keep the snapshot connection free between them and the memory flat.
const resultsPage = 10_000

// ReadFence returns the allocator's fence: the highest last_seq over the
// partitions (0 before anything was applied).
func ReadFence(ctx context.Context, tx *sql.Tx) (uint64, error) {
	var fence uint64
	if err := tx.QueryRowContext(ctx, "SELECT COALESCE(MAX(last_seq), 0) FROM allocator_partition").Scan(&fence); err != nil {
		return 0, fmt.Errorf("audit: read the allocator's fence: %w", err)
	}
	return fence, nil
}

// Fence is a partition's fence row: the stream sequence of the last
// message applied or refused on it and, when read (ReadFences with
// epochs), its ownership epoch (NULL: frozen by a move).
type Fence struct {
	LastSeq uint64
	Epoch   sql.NullInt64
}

// ReadFences returns every partition's fence row, by partition; with
// epochs it reads the epoch column too (migration 0012).
func ReadFences(ctx context.Context, tx *sql.Tx, epochs bool) (map[int]Fence, error) {
	query := "SELECT partition_id, last_seq, NULL FROM allocator_partition"
	if epochs {
		query = "SELECT partition_id, last_seq, epoch FROM allocator_partition"
	}
	rows, err := tx.QueryContext(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("audit: read the allocator's fences: %w", err)
	}
	defer rows.Close()
	out := make(map[int]Fence)
	for rows.Next() {
		var (
			p int
			f Fence
		)
		if err := rows.Scan(&p, &f.LastSeq, &f.Epoch); err != nil {
			return nil, fmt.Errorf("audit: read the allocator's fences: %w", err)
		}
		out[p] = f
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("audit: read the allocator's fences: %w", err)
	}
	return out, nil
}

// Rejected is a rejected_message row.
type Rejected struct {
	Subject   string
	Reason    string
	RequestID string // "" when the message named no valid request id
}

// ReadRejected reads every rejected_message row, by the place (wire.Place
// of seq and batch_index) of the message or request refused: they are
// few, since ingest never publishes anything malformed.
func ReadRejected(ctx context.Context, tx *sql.Tx) (map[uint64]Rejected, error) {
	rows, err := tx.QueryContext(ctx, "SELECT seq, batch_index, subject, reason, COALESCE(request_id, '') FROM rejected_message")
	if err != nil {
		return nil, fmt.Errorf("audit: read rejected_message: %w", err)
	}
	defer rows.Close()
	out := make(map[uint64]Rejected)
	for rows.Next() {
		var (
			seq   uint64
			index int
			r     Rejected
		)
		if err := rows.Scan(&seq, &index, &r.Subject, &r.Reason, &r.RequestID); err != nil {
			return nil, fmt.Errorf("audit: read rejected_message: %w", err)
		}
		out[wire.Place(seq, index)] = r
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("audit: read rejected_message: %w", err)
	}
	return out, nil
}

// Result holds the compared columns of a processed_request row.
type Result struct {
	RequestID string
	// Seq and Index are the request's place: its message's stream
	// sequence and its index in that message's batch (batch_index).
	Seq        uint64
	Index      int
	Op         string
	ActivityID int64
	UserID     int64
	Outcome    string
	Status     sql.NullString
	Position   sql.NullInt64
	Promoted   sql.NullString
	Capacity   sql.NullInt64
	Events     sql.NullString
	HeldUntil  sql.NullTime
	// Where a long promoted or event list continues (store.WholeValue).
	partition                 int
	promotedParts, eventParts int
}

// Place is the row's place packed as the replay orders it (wire.Place).
func (r *Result) Place() uint64 { return wire.Place(r.Seq, r.Index) }

// Results walks processed_request in place order (seq, batch_index), one
// page ahead of the replay: a goroutine reads the next page while the
// replay works.
type Results struct {
	pages <-chan []Result
	done  chan struct{}
	err   error // set by the pager before pages is closed
	page  []Result
	i     int
}

// StartResults reads the results of the messages after stream sequence
// after (of activities, when given; of partitions, when not nil) in pages
// on tx. Nothing else may use tx until the cursor is drained or Wait
// returned.
func StartResults(ctx context.Context, tx *sql.Tx, after uint64, activities []int64, partitions []int) *Results {
	pages := make(chan []Result, 2)
	c := &Results{pages: pages, done: make(chan struct{})}
	// Keyset pages on the place: after the last row's (seq, batch_index).
	query := "SELECT request_id, seq, batch_index, op, activity_id, user_id, outcome, status, `position`, promoted_user_ids, capacity, events, held_until, " +
		"partition_id, promoted_parts, event_parts " +
		"FROM processed_request WHERE (seq > ? OR seq = ? AND batch_index > ?)"
	// The table is clustered by (partition_id, seq, batch_index): with one
	// partition, as usual, naming it makes the pages a range scan of the
	// primary key.
	var parts int
	var only int64
	switch {
	case partitions != nil && len(partitions) == 0:
		query += " AND FALSE"
	case partitions != nil:
		ids := make([]int64, len(partitions))
		for i, p := range partitions {
			ids[i] = int64(p)
		}
		query += " AND partition_id IN (" + store.IntList(ids) + ")"
	case tx.QueryRowContext(ctx, "SELECT COUNT(*), COALESCE(MIN(partition_id), 0) FROM allocator_partition").Scan(&parts, &only) == nil && parts == 1:
		query += " AND partition_id = " + strconv.FormatInt(only, 10)
	}
	if len(activities) > 0 {
		query += " AND activity_id IN (" + store.IntList(activities) + ")"
	}
	query += " ORDER BY seq, batch_index LIMIT " + strconv.Itoa(resultsPage)
	// The last place of message after: every row of a later message is
	// past it.
	last := wire.Place(after+1, 0) - 1
	go func() {
		defer close(c.done)
		defer close(pages)
		for {
			page, err := readResults(ctx, tx, query, last)
			if err != nil {
				c.err = err
				return
			}
			if len(page) == 0 {
				return
			}
			select {
			case pages <- page:
			case <-ctx.Done():
				c.err = ctx.Err()
				return
			}
			if len(page) < resultsPage {
				return
			}
			last = page[len(page)-1].Place()
		}
	}()
	return c
}

func readResults(ctx context.Context, tx *sql.Tx, query string, after uint64) ([]Result, error) {
	seq, index := wire.SeqOf(after), wire.IndexOf(after)
	rows, err := tx.QueryContext(ctx, query, seq, seq, index)
	if err != nil {
		return nil, fmt.Errorf("audit: read processed_request after %s: %w", wire.FormatPlace(after), err)
	}
	defer rows.Close()
	page := make([]Result, 0, resultsPage)
	for rows.Next() {
		var r Result
		if err := rows.Scan(&r.RequestID, &r.Seq, &r.Index, &r.Op, &r.ActivityID, &r.UserID, &r.Outcome,
			&r.Status, &r.Position, &r.Promoted, &r.Capacity, &r.Events, &r.HeldUntil, &r.partition, &r.promotedParts, &r.eventParts); err != nil {
			return nil, fmt.Errorf("audit: read processed_request: %w", err)
		}
		page = append(page, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("audit: read processed_request: %w", err)
	}
	rows.Close()
	for i := range page {
		r := &page[i]
		if r.promotedParts > 0 {
			if r.Promoted.String, err = store.WholeValue(ctx, tx, r.partition, r.Seq, r.Index, store.ColPromoted, r.Promoted.String); err != nil {
				return nil, fmt.Errorf("audit: %w", err)
			}
		}
		if r.eventParts > 0 {
			if r.Events.String, err = store.WholeValue(ctx, tx, r.partition, r.Seq, r.Index, store.ColEvents, r.Events.String); err != nil {
				return nil, fmt.Errorf("audit: %w", err)
			}
		}
	}
	return page, nil
}

// Peek returns the next result without consuming it; nil at the end.
func (c *Results) Peek() (*Result, error) {
	for c.i >= len(c.page) {
		p, ok := <-c.pages
		if !ok {
			return nil, c.err
		}
		c.page, c.i = p, 0
	}
	return &c.page[c.i], nil
}

// Next consumes the result Peek returned.
func (c *Results) Next() { c.i++ }

// Wait returns once the pager goroutine has stopped using the transaction.
func (c *Results) Wait() {
	for range c.pages {
		// Unblock a pager waiting to hand over a page.
	}
	<-c.done
}

// Activity is an activity row.
type Activity struct {
	ID        int64
	Capacity  int64
	Confirmed int64 // confirmed_count
	NextSeq   uint64
	Hold      int64 // hold_ns
	Held      int64 // held_count
	Waiting   int64 // waiting_count
}

// ReadActivities reads the activity rows (of activities, when given), by
// id.
func ReadActivities(ctx context.Context, tx *sql.Tx, activities []int64) ([]Activity, error) {
	query := "SELECT id, capacity, confirmed_count, next_seq, hold_ns, held_count, waiting_count FROM activity"
	if len(activities) > 0 {
		query += " WHERE id IN (" + store.IntList(activities) + ")"
	}
	rows, err := tx.QueryContext(ctx, query+" ORDER BY id")
	if err != nil {
		return nil, fmt.Errorf("audit: read activity: %w", err)
	}
	defer rows.Close()
	var out []Activity
	for rows.Next() {
		var r Activity
		if err := rows.Scan(&r.ID, &r.Capacity, &r.Confirmed, &r.NextSeq, &r.Hold, &r.Held, &r.Waiting); err != nil {
			return nil, fmt.Errorf("audit: read activity: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("audit: read activity: %w", err)
	}
	return out, nil
}

// ReadBuckets reads the waitlist buckets (of activities, when given), by
// activity, in order.
func ReadBuckets(ctx context.Context, tx *sql.Tx, activities []int64) (map[int64][]waitlist.Bucket, error) {
	query := "SELECT activity_id, first_seq, waiting FROM waitlist_bucket"
	if len(activities) > 0 {
		query += " WHERE activity_id IN (" + store.IntList(activities) + ")"
	}
	rows, err := tx.QueryContext(ctx, query+" ORDER BY activity_id, first_seq")
	if err != nil {
		return nil, fmt.Errorf("audit: read waitlist_bucket: %w", err)
	}
	defer rows.Close()
	out := make(map[int64][]waitlist.Bucket)
	for rows.Next() {
		var (
			id int64
			b  waitlist.Bucket
		)
		if err := rows.Scan(&id, &b.FirstSeq, &b.Waiting); err != nil {
			return nil, fmt.Errorf("audit: read waitlist_bucket: %w", err)
		}
		out[id] = append(out[id], b)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("audit: read waitlist_bucket: %w", err)
	}
	return out, nil
}

// Signup is an activity_signup row: its status, queue_seq and hold
// (held_until and hold_seq, NULL on rows without one).
type Signup struct {
	Status    string
	QueueSeq  uint64
	HeldUntil sql.NullTime
	HoldSeq   sql.NullInt64
}

// EachSignup calls fn for every activity_signup row (of activities, when
// given), in (activity_id, user_id) order.
func EachSignup(ctx context.Context, tx *sql.Tx, activities []int64, fn func(activity, user int64, row Signup)) error {
	query := "SELECT activity_id, user_id, status, queue_seq, held_until, hold_seq FROM activity_signup"
	if len(activities) > 0 {
		query += " WHERE activity_id IN (" + store.IntList(activities) + ")"
	}
	rows, err := tx.QueryContext(ctx, query+" ORDER BY activity_id, user_id")
	if err != nil {
		return fmt.Errorf("audit: read activity_signup: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			activity, user int64
			r              Signup
		)
		if err := rows.Scan(&activity, &user, &r.Status, &r.QueueSeq, &r.HeldUntil, &r.HoldSeq); err != nil {
			return fmt.Errorf("audit: read activity_signup: %w", err)
		}
		fn(activity, user, r)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("audit: read activity_signup: %w", err)
	}
	return nil
}
