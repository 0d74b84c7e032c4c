package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/allot-dev/allot/internal/wire"
)

// ActivityState is the public state of one activity.
type ActivityState struct {
	ID        int64 `json:"activity_id"`
	Capacity  int64 `json:"capacity"`
	Confirmed int64 `json:"confirmed"` // seats taken, held ones included
	Held      int64 `json:"held"`
	Waiting   int64 `json:"waiting"`
	Remaining int64 `json:"remaining"`
	// Hold is the activity's hold as a Go duration, "" when it has none.
	Hold string `json:"hold,omitempty"`
}

// SignupState is one user's signup in one activity.
type SignupState struct {
	ActivityID int64       `json:"activity_id"`
	UserID     int64       `json:"user_id"`
	Status     wire.Status `json:"status"`
	Position   *int64      `json:"position"`
	HeldUntil  *time.Time  `json:"held_until,omitempty"`
}

const resultColumns = "request_id, seq, batch_index, op, activity_id, user_id, outcome, status, `position`, promoted_user_ids, capacity, applied_at, reason, held_until"

// GetResult reads the recorded result of requestID: its processed_request
// row (a promoted list stored in pieces included), or, for a request the
// allocator refused, a REJECTED result built from its rejected_message row.
func GetResult(ctx context.Context, q DBTX, requestID string) (wire.Result, bool, error) {
	row := q.QueryRowContext(ctx, "SELECT "+resultColumns+", partition_id, promoted_parts FROM processed_request WHERE request_id = ?", requestID)
	r, err := scanResult(ctx, q, row)
	if errors.Is(err, sql.ErrNoRows) {
		return getRejected(ctx, q, requestID)
	}
	if err != nil {
		return wire.Result{}, false, fmt.Errorf("get result %s: %w", requestID, err)
	}
	return r, true, nil
}

// getRejected reads the first rejection of requestID as a REJECTED result.
func getRejected(ctx context.Context, q DBTX, requestID string) (wire.Result, bool, error) {
	r := wire.Result{RequestID: requestID, State: wire.StateDone, Outcome: wire.OutcomeRejected}
	var (
		op             sql.NullString
		activity, user sql.NullInt64
	)
	err := q.QueryRowContext(ctx, "SELECT seq, batch_index, op, activity_id, user_id, reason, rejected_at FROM rejected_message"+
		" WHERE request_id = ? ORDER BY seq, batch_index LIMIT 1", requestID).Scan(&r.Seq, &r.Index, &op, &activity, &user, &r.Reason, &r.AppliedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return wire.Result{}, false, nil
	}
	if err != nil {
		return wire.Result{}, false, fmt.Errorf("get rejection of %s: %w", requestID, err)
	}
	r.Op, r.ActivityID, r.UserID = wire.Op(op.String), activity.Int64, user.Int64
	r.AppliedAt = r.AppliedAt.UTC()
	return r, true, nil
}

type scanner interface{ Scan(dest ...any) error }

func scanResult(ctx context.Context, q DBTX, row scanner) (wire.Result, error) {
	var (
		r         wire.Result
		status    sql.NullString
		position  sql.NullInt64
		promoted  sql.NullString
		capacity  sql.NullInt64
		reason    sql.NullString
		until     sql.NullTime
		partition int
		parts     int
	)
	err := row.Scan(&r.RequestID, &r.Seq, &r.Index, &r.Op, &r.ActivityID, &r.UserID, &r.Outcome,
		&status, &position, &promoted, &capacity, &r.AppliedAt, &reason, &until, &partition, &parts)
	if err != nil {
		return r, err
	}
	if parts > 0 {
		if promoted.String, err = WholeValue(ctx, q, partition, r.Seq, r.Index, ColPromoted, promoted.String); err != nil {
			return r, err
		}
	}
	r.State = wire.StateDone
	r.AppliedAt = r.AppliedAt.UTC()
	if until.Valid {
		t := until.Time.UTC()
		r.HeldUntil = &t
	}
	r.Reason = reason.String
	if status.Valid {
		st := wire.Status(status.String)
		r.Status = &st
	}
	if position.Valid {
		r.Position = &position.Int64
	}
	if capacity.Valid {
		r.Capacity = &capacity.Int64
	}
	if err := setPromoted(&r, promoted.String); err != nil {
		return r, err
	}
	return r, nil
}

// GetActivity reads the state of activity id: one primary-key read, the
// counters kept with the signups (waiting_count included), whatever the
// waitlist's length.
func GetActivity(ctx context.Context, q DBTX, id int64) (ActivityState, bool, error) {
	var s ActivityState
	var hold int64
	err := q.QueryRowContext(ctx,
		"SELECT id, capacity, confirmed_count, held_count, hold_ns, waiting_count FROM activity WHERE id = ?", id).
		Scan(&s.ID, &s.Capacity, &s.Confirmed, &s.Held, &hold, &s.Waiting)
	if hold > 0 {
		s.Hold = time.Duration(hold).String()
	}
	if errors.Is(err, sql.ErrNoRows) {
		return s, false, nil
	}
	if err != nil {
		return s, false, fmt.Errorf("get activity %d: %w", id, err)
	}
	s.Remaining = s.Capacity - s.Confirmed
	return s, true, nil
}

// GetSignup reads user's signup in activity, with the 1-based waitlist
// position when it is WAITING. Found is false when the user never signed up.
//
// The position is read from the waitlist buckets (internal/store/waitlist,
// waitlist.BucketSize): the counts of the buckets before the user's own plus
// the user's rank in its own, a range scan of at most BucketSize rows, so
// its cost does not grow with the line ahead. Both statements are one snapshot: the first names the
// user's bucket, the second counts only if the user still waits at the
// same queue_seq in that same bucket, else the read starts over.
func GetSignup(ctx context.Context, q DBTX, activity, user int64) (SignupState, bool, error) {
	for range 8 {
		s, found, again, err := getSignup(ctx, q, activity, user)
		if !again {
			return s, found, err
		}
	}
	// The waitlist kept changing under the reads: count the slow way, in
	// one statement.
	return GetSignupByCount(ctx, q, activity, user)
}

func getSignup(ctx context.Context, q DBTX, activity, user int64) (s SignupState, found, again bool, err error) {
	s = SignupState{ActivityID: activity, UserID: user}
	var (
		until  sql.NullTime
		seq    uint64
		bucket sql.NullInt64
	)
	err = q.QueryRowContext(ctx,
		"SELECT s.status, s.held_until, s.queue_seq, (SELECT MAX(b.first_seq) FROM waitlist_bucket b "+
			"WHERE b.activity_id = s.activity_id AND b.first_seq <= s.queue_seq) FROM activity_signup s "+
			"WHERE s.activity_id = ? AND s.user_id = ?", activity, user).
		Scan(&s.Status, &until, &seq, &bucket)
	if errors.Is(err, sql.ErrNoRows) {
		return s, false, false, nil
	}
	if err != nil {
		return s, false, false, fmt.Errorf("get signup %d/%d: %w", activity, user, err)
	}
	if until.Valid {
		t := until.Time.UTC()
		s.HeldUntil = &t
	}
	if s.Status != wire.StatusWaiting {
		return s, true, false, nil
	}
	if !bucket.Valid {
		// No bucket covers the waiter: rows written without them. The
		// audit and the invariants report it; the answer stays exact.
		s, found, err := GetSignupByCount(ctx, q, activity, user)
		return s, found, false, err
	}
	first := uint64(bucket.Int64)
	var pos sql.NullInt64
	err = q.QueryRowContext(ctx, "SELECT CASE WHEN EXISTS (SELECT 1 FROM activity_signup WHERE activity_id = ? AND user_id = ? "+
		"AND status = 'WAITING' AND queue_seq = ?) AND EXISTS (SELECT 1 FROM waitlist_bucket WHERE activity_id = ? AND first_seq = ?) "+
		"AND NOT EXISTS (SELECT 1 FROM waitlist_bucket WHERE activity_id = ? AND first_seq > ? AND first_seq <= ?) THEN "+
		"(SELECT COALESCE(SUM(waiting), 0) FROM waitlist_bucket WHERE activity_id = ? AND first_seq < ?) + "+
		"(SELECT COUNT(*) FROM activity_signup WHERE activity_id = ? AND status = 'WAITING' AND queue_seq >= ? AND queue_seq <= ?) END",
		activity, user, seq, activity, first, activity, first, seq, activity, first, activity, first, seq).Scan(&pos)
	if err != nil {
		return s, false, false, fmt.Errorf("get position %d/%d: %w", activity, user, err)
	}
	if !pos.Valid {
		return s, false, true, nil // moved between the two statements
	}
	p := pos.Int64
	s.Position = &p
	return s, true, false, nil
}

// GetSignupByCount is GetSignup counting the whole line ahead in one
// statement (what every read did before the buckets): the fallback for
// waiters without buckets, and the benchmark's comparison.
func GetSignupByCount(ctx context.Context, q DBTX, activity, user int64) (SignupState, bool, error) {
	s := SignupState{ActivityID: activity, UserID: user}
	var ahead int64
	var until sql.NullTime
	err := q.QueryRowContext(ctx,
		"SELECT s.status, s.held_until, (SELECT COUNT(*) FROM activity_signup w WHERE w.activity_id = s.activity_id "+
			"AND w.status = 'WAITING' AND w.queue_seq < s.queue_seq) FROM activity_signup s "+
			"WHERE s.activity_id = ? AND s.user_id = ?", activity, user).
		Scan(&s.Status, &until, &ahead)
	if until.Valid {
		t := until.Time.UTC()
		s.HeldUntil = &t
	}
	if errors.Is(err, sql.ErrNoRows) {
		return s, false, nil
	}
	if err != nil {
		return s, false, fmt.Errorf("get signup %d/%d: %w", activity, user, err)
	}
	if s.Status == wire.StatusWaiting {
		pos := ahead + 1
		s.Position = &pos
	}
	return s, true, nil
}

// GetActivityRow reads one activity row without locking it.
func GetActivityRow(ctx context.Context, q DBTX, id int64) (ActivityRow, bool, error) {
	r, err := scanActivity(q.QueryRowContext(ctx, "SELECT "+activityColumns+" FROM activity WHERE id = ?", id))
	if errors.Is(err, sql.ErrNoRows) {
		return r, false, nil
	}
	if err != nil {
		return r, false, fmt.Errorf("get activity %d: %w", id, err)
	}
	return r, true, nil
}

// WholeValue returns the long value col ("p": promoted_user_ids, "e":
// events) of the processed_request row at (partition, seq, index) whose
// first piece is head, with the pieces stored in processed_request_part
// after it.
func WholeValue(ctx context.Context, q DBTX, partition int, seq uint64, index int, col, head string) (string, error) {
	rows, err := q.QueryContext(ctx, "SELECT data FROM processed_request_part WHERE partition_id = ? AND seq = ? AND batch_index = ? AND col = ? ORDER BY piece",
		partition, seq, index, col)
	if err != nil {
		return "", fmt.Errorf("read pieces of seq %d: %w", seq, err)
	}
	defer rows.Close()
	var b strings.Builder
	b.WriteString(head)
	for rows.Next() {
		var piece string
		if err := rows.Scan(&piece); err != nil {
			return "", fmt.Errorf("read pieces of seq %d: %w", seq, err)
		}
		if col == ColEvents {
			b.WriteByte(';')
		}
		b.WriteString(piece)
	}
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("read pieces of seq %d: %w", seq, err)
	}
	return b.String(), nil
}

// GetResults reads the recorded results of many requests at once, as
// GetResult reads one: the ones found are in the map.
func GetResults(ctx context.Context, q DBTX, ids []string) (map[string]wire.Result, error) {
	out := make(map[string]wire.Result, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	in := "(?" + strings.Repeat(",?", len(ids)-1) + ")"
	rows, err := q.QueryContext(ctx, "SELECT "+resultColumns+", partition_id, promoted_parts FROM processed_request WHERE request_id IN "+in, args...)
	if err != nil {
		return nil, fmt.Errorf("get results: %w", err)
	}
	for rows.Next() {
		r, err := scanResult(ctx, q, rows)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("get results: %w", err)
		}
		out[r.RequestID] = r
	}
	if err := rows.Close(); err != nil {
		return nil, fmt.Errorf("get results: %w", err)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("get results: %w", err)
	}
	if len(out) == len(ids) {
		return out, nil
	}
	// The rest may have been refused: the first rejection of each.
	rows, err = q.QueryContext(ctx, "SELECT request_id, seq, batch_index, op, activity_id, user_id, reason, rejected_at FROM rejected_message"+
		" WHERE request_id IN "+in+" ORDER BY seq DESC, batch_index DESC", args...)
	if err != nil {
		return nil, fmt.Errorf("get rejections: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		r := wire.Result{State: wire.StateDone, Outcome: wire.OutcomeRejected}
		var (
			op             sql.NullString
			activity, user sql.NullInt64
		)
		if err := rows.Scan(&r.RequestID, &r.Seq, &r.Index, &op, &activity, &user, &r.Reason, &r.AppliedAt); err != nil {
			return nil, fmt.Errorf("get rejections: %w", err)
		}
		if _, done := out[r.RequestID]; done && out[r.RequestID].Outcome != wire.OutcomeRejected {
			continue
		}
		r.Op, r.ActivityID, r.UserID = wire.Op(op.String), activity.Int64, user.Int64
		r.AppliedAt = r.AppliedAt.UTC()
		out[r.RequestID] = r // descending: the first rejection is written last
	}
	return out, rows.Err()
}
