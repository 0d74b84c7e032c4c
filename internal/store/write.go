package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-sql-driver/mysql"

	"github.com/allot-dev/allot/internal/wire"
)

// maxRowsPerStatement keeps multi-row statements well below the server's
// max_allowed_packet and placeholder limits.
const maxRowsPerStatement = 1000

// ActivityRow is a row of the activity table.
type ActivityRow struct {
	ID        int64
	Capacity  int64
	Confirmed int64 // seats taken: CONFIRMED and HELD signups
	NextSeq   uint64
	Hold      time.Duration
	Held      int64
	Waiting   int64 // WAITING signups (waiting_count)
}

// SignupRow is a row of activity_signup.
type SignupRow struct {
	ActivityID int64
	UserID     int64
	Status     wire.Status
	QueueSeq   uint64
	// HeldUntil and HoldSeq are set exactly on HELD rows.
	HeldUntil time.Time
	HoldSeq   uint64
}

// RejectedRow is a message the allocator refused: malformed, or data MySQL
// would not take. Request holds what could be decoded of it (a zero
// RequestID when nothing could), so that a poll of its id answers REJECTED.
type RejectedRow struct {
	// Seq and Index are the refused request's place: its message's stream
	// sequence and its index in the message's batch (0 for a single
	// request, and for a message refused whole).
	Seq     uint64
	Index   int
	Subject string
	Reason  string
	Request wire.Request
}

// ResultRow is a processed_request row: the result, the partition that
// applied it, and the events it caused (EncodeEvents, outbox.go), which make the
// row the transactional outbox as well.
type ResultRow struct {
	wire.Result
	Partition int
	Events    string
}

// EnsurePartition creates the fence row of partition p if it is missing,
// at epoch 1: a partition that was never moved starts on its shard from
// nothing. At any other epoch (past 1: the partition was moved, and its
// row is written by the move with its state, never here; 0: the map no
// longer puts it on this shard) a missing row is ErrNotMoved, and nothing
// is created.
func EnsurePartition(ctx context.Context, q DBTX, p int, epoch uint64) error {
	if epoch != 1 {
		var n int
		if err := q.QueryRowContext(ctx, "SELECT COUNT(*) FROM allocator_partition WHERE partition_id = ?", p).Scan(&n); err != nil {
			return fmt.Errorf("ensure partition %d: %w", p, err)
		}
		if n == 0 {
			return fmt.Errorf("partition %d at epoch %d: %w", p, epoch, ErrNotMoved)
		}
		return nil
	}
	_, err := q.ExecContext(ctx, "INSERT INTO allocator_partition (partition_id, last_seq, epoch) VALUES (?, 0, 1) "+
		"ON DUPLICATE KEY UPDATE partition_id = partition_id", p)
	if err != nil {
		return fmt.Errorf("ensure partition %d: %w", p, err)
	}
	return nil
}

// ErrNotMoved means the shard map names a shard for a partition at an
// epoch past 1 whose fence row that shard does not hold: its state has
// not been moved there (yet).
var ErrNotMoved = errors.New("the shard holds no fence row for a partition the map says was moved there")

// ErrEpoch means the partition's fence row is not at the epoch the caller
// holds from the shard map: the partition was moved (or is being moved)
// and the caller's map, or the shard it was sent to, is stale. The
// transaction must commit nothing.
var ErrEpoch = errors.New("the partition's fence is at another epoch than the shard map's")

// SetEpoch moves partition p's fence row from epoch from to epoch to, only
// if it is at from (compare-and-set); to 0 freezes it (NULL: no epoch
// matches it). It reports whether the row was at from. A move freezes the
// old shard's row, and an operator may raise one; both wait for the row
// lock of a transaction in flight, so none commits across the change.
func SetEpoch(ctx context.Context, q DBTX, p int, from, to uint64) (bool, error) {
	res, err := q.ExecContext(ctx, "UPDATE allocator_partition SET epoch = NULLIF(?, 0) WHERE partition_id = ? AND epoch = ?", to, p, from)
	if err != nil {
		return false, fmt.Errorf("set epoch of partition %d: %w", p, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("set epoch of partition %d: %w", p, err)
	}
	return n == 1, nil
}

// Thaw sets partition p's frozen fence row (epoch NULL) to epoch, and
// reports whether it was frozen: a move undone gives the partition back to
// its shard.
func Thaw(ctx context.Context, q DBTX, p int, epoch uint64) (bool, error) {
	res, err := q.ExecContext(ctx, "UPDATE allocator_partition SET epoch = ? WHERE partition_id = ? AND epoch IS NULL", epoch, p)
	if err != nil {
		return false, fmt.Errorf("thaw partition %d: %w", p, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("thaw partition %d: %w", p, err)
	}
	return n == 1, nil
}

// ErrNoFence means a shard holds no fence row for the partition.
var ErrNoFence = errors.New("the shard holds no fence row for the partition")

// PartitionEpoch is the epoch partition p's fence row is at: 0 when it is
// frozen (NULL), ErrNoFence when there is no row.
func PartitionEpoch(ctx context.Context, q DBTX, p int) (uint64, error) {
	var at sql.NullInt64
	err := q.QueryRowContext(ctx, "SELECT epoch FROM allocator_partition WHERE partition_id = ?", p).Scan(&at)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("partition %d: %w", p, ErrNoFence)
	}
	if err != nil {
		return 0, fmt.Errorf("read the epoch of partition %d: %w", p, err)
	}
	if !at.Valid {
		return 0, nil
	}
	return uint64(at.Int64), nil
}

// ErrStreamReplaced means the request stream is not the one MySQL's fence
// counts in: it was deleted and created anew (a wiped NATS store, say).
// Applying from it would skip new requests as if applied, so the allocator
// refuses to start.
var ErrStreamReplaced = errors.New("the request stream was replaced since MySQL last applied from it")

// BindPartition ties the fence of partition p to the stream identified by
// streamID, whose last sequence is streamLast, or checks that it is already
// tied to it. A fence beyond the stream's end cannot be tied to it.
func BindPartition(ctx context.Context, q DBTX, p int, streamID string, streamLast uint64) error {
	if _, err := q.ExecContext(ctx, "UPDATE allocator_partition SET stream_id = ? WHERE partition_id = ? AND stream_id IS NULL AND last_seq <= ?",
		streamID, p, streamLast); err != nil {
		return fmt.Errorf("bind partition %d: %w", p, err)
	}
	var bound sql.NullString
	var last uint64
	if err := q.QueryRowContext(ctx, "SELECT stream_id, last_seq FROM allocator_partition WHERE partition_id = ?", p).Scan(&bound, &last); err != nil {
		return fmt.Errorf("bind partition %d: %w", p, err)
	}
	if !bound.Valid {
		return fmt.Errorf("%w: partition %d's fence (seq %d) is beyond the stream's last sequence %d; "+
			"restore the stream it came from, or start over with an empty database", ErrStreamReplaced, p, last, streamLast)
	}
	if bound.String != streamID {
		return fmt.Errorf("%w: partition %d's fence (seq %d) belongs to the stream created %s, this one was created %s; "+
			"restore that stream, or start over with an empty database", ErrStreamReplaced, p, last, bound.String, streamID)
	}
	return nil
}

// LockPartition locks the fence row of partition p and returns its last
// applied sequence, if the row is at epoch (the shard map's epoch for p):
// else ErrEpoch, and the caller's transaction must commit nothing. The
// epoch is read in the same statement, so the check costs no round trip.
func LockPartition(ctx context.Context, tx *sql.Tx, p int, epoch uint64) (uint64, error) {
	var (
		last uint64
		at   sql.NullInt64
	)
	err := tx.QueryRowContext(ctx, "SELECT last_seq, epoch FROM allocator_partition WHERE partition_id = ? FOR UPDATE", p).Scan(&last, &at)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("lock partition %d: no fence row (EnsurePartition first)", p)
	}
	if err != nil {
		return 0, fmt.Errorf("lock partition %d: %w", p, err)
	}
	if !at.Valid || uint64(at.Int64) != epoch {
		have := "frozen (NULL)"
		if at.Valid {
			have = fmt.Sprint(at.Int64)
		}
		return 0, fmt.Errorf("lock partition %d: fence row at epoch %s, the shard map says %d: %w", p, have, epoch, ErrEpoch)
	}
	return last, nil
}

// SetPartition advances the fence of partition p.
func SetPartition(ctx context.Context, tx *sql.Tx, p int, last uint64) error {
	if _, err := tx.ExecContext(ctx, "UPDATE allocator_partition SET last_seq = ? WHERE partition_id = ?", last, p); err != nil {
		return fmt.Errorf("set partition %d: %w", p, err)
	}
	return nil
}

// RefusedRequests maps those of ids that rejected_message records (stored
// and refused) to the first place (wire.Place) they were refused at.
func RefusedRequests(ctx context.Context, tx *sql.Tx, ids []string) (map[string]uint64, error) {
	at := make(map[string]uint64)
	for chunk := range chunks(len(ids)) {
		part := ids[chunk.lo:chunk.hi]
		args := make([]any, len(part))
		for i, id := range part {
			args[i] = id
		}
		rows, err := tx.QueryContext(ctx, "SELECT request_id, MIN(seq * 65536 + batch_index) FROM rejected_message WHERE request_id IN ("+placeholders(len(part), 1)+") GROUP BY request_id", args...)
		if err != nil {
			return nil, fmt.Errorf("refused requests: %w", err)
		}
		for rows.Next() {
			var (
				id  string
				seq uint64
			)
			if err := rows.Scan(&id, &seq); err != nil {
				rows.Close()
				return nil, fmt.Errorf("refused requests: %w", err)
			}
			at[id] = seq
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("refused requests: %w", err)
		}
	}
	return at, nil
}

// Processed returns which of ids already have a recorded result.
func Processed(ctx context.Context, tx *sql.Tx, ids []string) (map[string]bool, error) {
	done := make(map[string]bool)
	for chunk := range chunks(len(ids)) {
		part := ids[chunk.lo:chunk.hi]
		args := make([]any, len(part))
		for i, id := range part {
			args[i] = id
		}
		rows, err := tx.QueryContext(ctx, "SELECT request_id FROM processed_request WHERE request_id IN ("+placeholders(len(part), 1)+")", args...)
		if err != nil {
			return nil, fmt.Errorf("processed: %w", err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return nil, fmt.Errorf("processed: %w", err)
			}
			done[id] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("processed: %w", err)
		}
	}
	return done, nil
}

// LockActivities locks the rows of ids in ascending id order (so that two
// transactions over several activities never deadlock) and returns them.
func LockActivities(ctx context.Context, tx *sql.Tx, ids []int64) (map[int64]ActivityRow, error) {
	out := make(map[int64]ActivityRow, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	rows, err := tx.QueryContext(ctx, "SELECT "+activityColumns+" FROM activity WHERE id IN ("+
		placeholders(len(ids), 1)+") ORDER BY id FOR UPDATE", args...)
	if err != nil {
		return nil, fmt.Errorf("lock activities: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		r, err := scanActivity(rows)
		if err != nil {
			return nil, fmt.Errorf("lock activities: %w", err)
		}
		out[r.ID] = r
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("lock activities: %w", err)
	}
	return out, nil
}

// activityColumns are the activity columns scanActivity reads.
const activityColumns = "id, capacity, confirmed_count, next_seq, hold_ns, held_count, waiting_count"

func scanActivity(row scanner) (ActivityRow, error) {
	var r ActivityRow
	var hold int64
	err := row.Scan(&r.ID, &r.Capacity, &r.Confirmed, &r.NextSeq, &hold, &r.Held, &r.Waiting)
	r.Hold = time.Duration(hold)
	return r, err
}

// LiveSignups reads the CONFIRMED, HELD and WAITING signups of an activity.
func LiveSignups(ctx context.Context, q DBTX, activity int64) ([]SignupRow, error) {
	rows, err := q.QueryContext(ctx, "SELECT user_id, status, queue_seq, held_until, hold_seq FROM activity_signup "+
		"WHERE activity_id = ? AND status IN ('CONFIRMED', 'HELD', 'WAITING')", activity)
	if err != nil {
		return nil, fmt.Errorf("live signups %d: %w", activity, err)
	}
	defer rows.Close()
	var out []SignupRow
	for rows.Next() {
		r := SignupRow{ActivityID: activity}
		var (
			until sql.NullTime
			hold  sql.NullInt64
		)
		if err := rows.Scan(&r.UserID, &r.Status, &r.QueueSeq, &until, &hold); err != nil {
			return nil, fmt.Errorf("live signups %d: %w", activity, err)
		}
		if until.Valid {
			r.HeldUntil = until.Time.UTC()
		}
		r.HoldSeq = uint64(hold.Int64)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("live signups %d: %w", activity, err)
	}
	return out, nil
}

// UpsertActivities writes the final state of each activity of a batch. The
// CHECK constraints still guard every row.
func UpsertActivities(ctx context.Context, tx *sql.Tx, rows []ActivityRow) error {
	return insertRows(ctx, tx, "INSERT INTO activity ("+activityColumns+") VALUES ",
		" ON DUPLICATE KEY UPDATE capacity = VALUES(capacity), confirmed_count = VALUES(confirmed_count), next_seq = VALUES(next_seq),"+
			" hold_ns = VALUES(hold_ns), held_count = VALUES(held_count), waiting_count = VALUES(waiting_count)",
		7, len(rows), func(i int, args []any) []any {
			r := rows[i]
			return append(args, r.ID, r.Capacity, r.Confirmed, r.NextSeq, int64(r.Hold), r.Held, r.Waiting)
		})
}

// UpsertSignups writes the final state of each signup a batch changed; the
// UNIQUE keys still guard one row per user and one user per queue_seq.
func UpsertSignups(ctx context.Context, tx *sql.Tx, rows []SignupRow) error {
	return insertRows(ctx, tx, "INSERT INTO activity_signup (activity_id, user_id, status, queue_seq, held_until, hold_seq) VALUES ",
		" ON DUPLICATE KEY UPDATE status = VALUES(status), queue_seq = VALUES(queue_seq), held_until = VALUES(held_until), hold_seq = VALUES(hold_seq)",
		6, len(rows), func(i int, args []any) []any {
			r := rows[i]
			var until, hold any
			if r.Status == wire.StatusHeld {
				until, hold = r.HeldUntil.UTC(), r.HoldSeq
			}
			return append(args, r.ActivityID, r.UserID, r.Status, r.QueueSeq, until, hold)
		})
}

// ErrDuplicateRequest means a batch holds a request whose result is already
// recorded: InsertResults refused to record it twice. The caller rolls back
// and applies the batch again with an explicit check (Processed).
var ErrDuplicateRequest = errors.New("a request in the batch was already applied")

// InsertResults records the results of a batch. The unique key on
// request_id refuses a second result for a request; a batch that runs into
// it fails with ErrDuplicateRequest, so the common case needs no lookup
// before the insert.
//
// A result of any size is recorded whole: a promoted list or an event list
// longer than pieceMax bytes (0: the default, derived from the server's
// max_allowed_packet) keeps its first piece in the row and the rest in
// processed_request_part, every statement sized to fit in a packet.
func InsertResults(ctx context.Context, tx *sql.Tx, rs []ResultRow, pieceMax int) error {
	n := pieceBytes(pieceMax)
	type head struct {
		promoted, events   string
		promotedN, eventsN int
	}
	heads := make([]head, len(rs))
	var parts []partRow
	for i, r := range rs {
		h := head{events: r.Events, promoted: promotedColumn(r.Result)}
		if len(h.promoted) > n {
			pieces := splitBytes(h.promoted, n)
			h.promoted, h.promotedN = pieces[0], len(pieces)-1
			for k, p := range pieces[1:] {
				parts = append(parts, partRow{r.Partition, r.Seq, r.Index, ColPromoted, k + 1, 0, p})
			}
		}
		if len(h.events) > n {
			pieces, first := splitEvents(h.events, n)
			h.events, h.eventsN = pieces[0], len(pieces)-1
			for k, p := range pieces[1:] {
				parts = append(parts, partRow{r.Partition, r.Seq, r.Index, ColEvents, k + 1, first[k+1], p})
			}
		}
		heads[i] = h
	}
	// Most results (a join's, a claim's) leave six columns at their
	// defaults; they are written without them, which MySQL does in less
	// time, the others with every column.
	var plain, full []int
	for i, r := range rs {
		h := heads[i]
		if h.promoted == "" && r.Capacity == nil && wire.CutReason(r.Reason) == "" && r.HeldUntil == nil && h.promotedN == 0 && h.eventsN == 0 {
			plain = append(plain, i)
		} else {
			full = append(full, i)
		}
	}
	err := insertRows(ctx, tx, "INSERT INTO processed_request (request_id, seq, batch_index, op, activity_id, user_id, outcome, status, `position`, applied_at,"+
		" partition_id, events) VALUES ", "",
		12, len(plain), func(i int, args []any) []any {
			r, h := rs[plain[i]], heads[plain[i]]
			return append(args, r.RequestID, r.Seq, r.Index, r.Op, r.ActivityID, r.UserID, r.Outcome,
				nullString(r.Status), nullInt(r.Position), r.AppliedAt, r.Partition, nullIfEmpty(h.events))
		})
	if err == nil {
		err = insertRows(ctx, tx, "INSERT INTO processed_request ("+resultColumns+
			", partition_id, events, promoted_parts, event_parts) VALUES ", "",
			18, len(full), func(i int, args []any) []any {
				r, h := rs[full[i]], heads[full[i]]
				var until any
				if r.HeldUntil != nil {
					until = r.HeldUntil.UTC()
				}
				return append(args, r.RequestID, r.Seq, r.Index, r.Op, r.ActivityID, r.UserID, r.Outcome,
					nullString(r.Status), nullInt(r.Position), nullIfEmpty(h.promoted), nullInt(r.Capacity), r.AppliedAt,
					nullIfEmpty(wire.CutReason(r.Reason)), until, r.Partition, nullIfEmpty(h.events), h.promotedN, h.eventsN)
			})
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == errDuplicateEntry && strings.Contains(me.Message, "uk_processed_request") {
		return ErrDuplicateRequest
	}
	if err != nil {
		return err
	}
	return insertRows(ctx, tx, "INSERT INTO processed_request_part (partition_id, seq, batch_index, col, piece, first_event, data) VALUES ", "",
		7, len(parts), func(i int, args []any) []any {
			p := parts[i]
			return append(args, p.partition, p.seq, p.index, p.col, p.piece, p.firstEvent, p.data)
		})
}

// errDuplicateEntry is MySQL's "duplicate entry for key".
const errDuplicateEntry = 1062

// The values of processed_request_part.col: which long value a piece is of.
const (
	ColPromoted = "p"
	ColEvents   = "e"
)

// partRow is a processed_request_part row.
type partRow struct {
	partition  int
	seq        uint64
	index      int
	col        string
	piece      int
	firstEvent int
	data       string
}

// InsertRejected records refused requests (or messages refused whole), each
// at its place.
func InsertRejected(ctx context.Context, tx *sql.Tx, rs []RejectedRow, at time.Time) error {
	// The fence moves with the rejection, so a message is rejected once;
	// the no-op update only keeps a repeat harmless.
	return insertRows(ctx, tx, "INSERT INTO rejected_message (seq, batch_index, subject, reason, rejected_at, request_id, op, activity_id, user_id) VALUES ",
		" ON DUPLICATE KEY UPDATE seq = seq",
		9, len(rs), func(i int, args []any) []any {
			r := rs[i]
			var id, op, activity, user any
			if q := r.Request; ValidRequestID(q.RequestID) {
				id, op, activity, user = q.RequestID, rejectedOp(q.Op), q.ActivityID, q.UserID
			}
			return append(args, r.Seq, r.Index, truncate(r.Subject, 255), RejectedReason(r.Reason), wire.Instant(at), id, op, activity, user)
		})
}

// RejectedReason is reason as rejected_message keeps it.
func RejectedReason(reason string) string { return wire.CutReason(reason) }

// ValidRequestID reports whether id fits the request_id columns: a
// canonical uuid, the only form ingest issues. A rejection is recorded with
// the request's identity only then.
func ValidRequestID(id string) bool {
	if len(id) != 36 {
		return false
	}
	for i := range len(id) {
		c := id[i]
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return false
			}
		case '0' <= c && c <= '9', 'a' <= c && c <= 'f':
		default:
			return false
		}
	}
	return true
}

// InsertRows is insertRows, for the tables the store's subpackages write
// (the waitlist buckets).
func InsertRows(ctx context.Context, tx *sql.Tx, prefix, suffix string, cols, n int, row func(i int, args []any) []any) error {
	return insertRows(ctx, tx, prefix, suffix, cols, n, row)
}

// ExecChunks runs prefix + placeholders + suffix over args, cols values a
// row, in statements of at most maxRowsPerStatement rows.
func ExecChunks(ctx context.Context, tx *sql.Tx, prefix, suffix string, cols int, args []any) error {
	for c := range chunks(len(args) / cols) {
		if _, err := tx.ExecContext(ctx, prefix+placeholders(c.hi-c.lo, cols)+suffix, args[cols*c.lo:cols*c.hi]...); err != nil {
			return err
		}
	}
	return nil
}

// insertRows runs prefix + (?,..),(?,..) + suffix in chunks.
func insertRows(ctx context.Context, tx *sql.Tx, prefix, suffix string, cols, n int, row func(i int, args []any) []any) error {
	return insertRowsAffected(ctx, tx, prefix, suffix, cols, n, row, nil)
}

// insertRowsAffected is insertRows that adds the rows affected to *affected.
// A statement holds at most maxRowsPerStatement rows and, at worst,
// statementBytes bytes, so it fits in the server's max_allowed_packet
// however long the rows' values are.
func insertRowsAffected(ctx context.Context, tx *sql.Tx, prefix, suffix string, cols, n int, row func(i int, args []any) []any, affected *int64) error {
	budget := statementBytes() - len(prefix) - len(suffix)
	args := make([]any, 0, min(n, maxRowsPerStatement)*cols)
	rows, size := 0, 0
	flush := func(args []any) error {
		res, err := tx.ExecContext(ctx, prefix+placeholders(rows, cols)+suffix, args...)
		if err != nil {
			return fmt.Errorf("%s…: %w", strings.TrimSpace(prefix[:min(len(prefix), 40)]), err)
		}
		if affected != nil {
			n, err := res.RowsAffected()
			if err != nil {
				return fmt.Errorf("rows affected: %w", err)
			}
			*affected += n
		}
		return nil
	}
	for i := range n {
		start := len(args)
		args = row(i, args)
		b := 2 * cols // "(?,?)," around the values
		for _, v := range args[start:] {
			b += argBytes(v)
		}
		if rows > 0 && (rows == maxRowsPerStatement || size+b > budget) {
			if err := flush(args[:start]); err != nil {
				return err
			}
			args = append(args[:0], args[start:]...)
			rows, size = 0, 0
		}
		rows++
		size += b
	}
	if rows == 0 {
		return nil
	}
	return flush(args)
}

type span struct{ lo, hi int }

func chunks(n int) func(yield func(span) bool) {
	return func(yield func(span) bool) {
		for lo := 0; lo < n; lo += maxRowsPerStatement {
			if !yield(span{lo, min(lo+maxRowsPerStatement, n)}) {
				return
			}
		}
	}
}

// placeholders returns "(?,?),(?,?)" for rows rows of cols columns, or
// "?,?,?" when cols is 1.
func placeholders(rows, cols int) string {
	var b strings.Builder
	group := "(" + strings.TrimSuffix(strings.Repeat("?,", cols), ",") + ")"
	if cols == 1 {
		group = "?"
	}
	b.Grow(rows * (len(group) + 1))
	for i := 0; i < rows; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(group)
	}
	return b.String()
}

func nullString[T ~string](s *T) any {
	if s == nil {
		return nil
	}
	return string(*s)
}

func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func nullInt(n *int64) any {
	if n == nil {
		return nil
	}
	return *n
}

// truncate cuts s to at most n characters of valid UTF-8: a strict
// server refuses a string cut inside a character.
func truncate(s string, n int) string {
	s = strings.ToValidUTF8(s, "?")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n])
}
