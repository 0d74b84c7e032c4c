// Package checkpoint takes, reads and prunes the allocator's checkpoints:
// the state of one partition's activities at its fence, copied into the
// allocator_checkpoint tables with its digest, from which the audit can
// replay once retention has removed the older requests.
package checkpoint

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/allot-dev/allot/internal/store"
)

// Checkpoint is an allocator_checkpoint row: the state of one partition's
// activities at its fence Seq, stored in allocator_checkpoint_activity and
// allocator_checkpoint_signup, and the digest of that state.
type Checkpoint struct {
	Partition  int
	Seq        uint64
	Partitions int
	StreamID   string
	Activities int64
	Signups    int64
	Digest     string
	TakenAt    time.Time
}

// Digester computes a checkpoint's digest: SHA-256 over one line per
// activity row ("a id capacity confirmed_count next_seq"), all of them in
// id order, then one line per signup row ("s activity_id user_id status
// queue_seq") in (activity_id, user_id) order. An activity with a hold or
// held seats adds " hold_ns held_count" to its line, a signup with a hold
// " held_until hold_seq" (held_until in Unix microseconds): rows without
// holds hash as before holds existed, so older checkpoints still verify.
// The allocator feeds it the rows it copies, the audit the rows it reads
// back; the same rows give the same digest on any machine.
type Digester struct {
	h   hash.Hash
	buf []byte
}

// NewDigester returns an empty digest.
func NewDigester() *Digester { return &Digester{h: sha256.New()} }

// Activity adds an activity row; every activity comes before any signup.
func (d *Digester) Activity(id, capacity, confirmed int64, nextSeq uint64, hold time.Duration, held int64) {
	b := append(d.buf[:0], "a "...)
	b = strconv.AppendInt(b, id, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, capacity, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, confirmed, 10)
	b = append(b, ' ')
	b = strconv.AppendUint(b, nextSeq, 10)
	if hold != 0 || held != 0 {
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(hold), 10)
		b = append(b, ' ')
		b = strconv.AppendInt(b, held, 10)
	}
	d.buf = append(b, '\n')
	d.h.Write(d.buf)
}

// Signup adds a signup row; heldUntil is zero and holdSeq 0 on a row
// without a hold.
func (d *Digester) Signup(activity, user int64, status string, queueSeq uint64, heldUntil time.Time, holdSeq uint64) {
	b := append(d.buf[:0], "s "...)
	b = strconv.AppendInt(b, activity, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, user, 10)
	b = append(b, ' ')
	b = append(b, status...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, queueSeq, 10)
	if !heldUntil.IsZero() || holdSeq != 0 {
		b = append(b, ' ')
		if heldUntil.IsZero() {
			b = append(b, '-')
		} else {
			b = strconv.AppendInt(b, heldUntil.UnixMicro(), 10)
		}
		b = append(b, ' ')
		b = strconv.AppendUint(b, holdSeq, 10)
	}
	d.buf = append(b, '\n')
	d.h.Write(d.buf)
}

// Sum is the digest in hex.
func (d *Digester) Sum() string { return hex.EncodeToString(d.h.Sum(nil)) }

// checkpointPage is how many rows one read or one multi-row insert of a
// checkpoint handles: small enough for any packet limit, large enough that
// round trips do not dominate.
const checkpointPage = 2000

// Take copies the state of partition's activities (those for
// which belongs is true; nil means all) at the partition's fence into the
// checkpoint tables, with its digest, in one transaction. The rows are read
// from a consistent snapshot, whose fence moved in the same transactions as
// the rows, so the state is exactly the one the fence implies; nothing is
// locked, and the allocator keeps applying meanwhile. It returns false
// when there is nothing to take: nothing applied yet, or a checkpoint at
// this fence exists already (another process took it).
func Take(ctx context.Context, db *sql.DB, partition, partitions int, belongs func(activity int64) bool) (Checkpoint, bool, error) {
	cp := Checkpoint{Partition: partition, Partitions: partitions}
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		return cp, false, fmt.Errorf("checkpoint: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit a no-op
	// The first consistent read fixes the snapshot every read below sees.
	var streamID sql.NullString
	err = tx.QueryRowContext(ctx, "SELECT last_seq, stream_id FROM allocator_partition WHERE partition_id = ?", partition).Scan(&cp.Seq, &streamID)
	if errors.Is(err, sql.ErrNoRows) || err == nil && cp.Seq == 0 {
		return cp, false, nil
	}
	if err != nil {
		return cp, false, fmt.Errorf("checkpoint: read fence: %w", err)
	}
	cp.StreamID = streamID.String
	var n int
	if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM allocator_checkpoint WHERE partition_id = ? AND seq = ?", partition, cp.Seq).Scan(&n); err != nil {
		return cp, false, fmt.Errorf("checkpoint: look up: %w", err)
	}
	if n > 0 {
		return cp, false, nil
	}
	// With several partitions the signups are read for this partition's
	// activities only (below), not the whole table once per partition.
	partitioned := belongs != nil
	if belongs == nil {
		belongs = func(int64) bool { return true }
	}
	var ids []int64
	d := NewDigester()
	ins := &rowInserter{tx: tx, prefix: "INSERT INTO allocator_checkpoint_activity (partition_id, seq, activity_id, capacity, confirmed_count, next_seq, hold_ns, held_count) VALUES "}
	var after int64
	for {
		rows, err := tx.QueryContext(ctx, "SELECT id, capacity, confirmed_count, next_seq, hold_ns, held_count FROM activity WHERE id > ? ORDER BY id LIMIT "+strconv.Itoa(checkpointPage), after)
		if err != nil {
			return cp, false, fmt.Errorf("checkpoint: read activity: %w", err)
		}
		var got int
		type act struct {
			id, capacity, confirmed int64
			next                    uint64
			hold, held              int64
		}
		var page []act
		for rows.Next() {
			var r act
			if err := rows.Scan(&r.id, &r.capacity, &r.confirmed, &r.next, &r.hold, &r.held); err != nil {
				rows.Close()
				return cp, false, fmt.Errorf("checkpoint: read activity: %w", err)
			}
			page = append(page, r)
			got++
		}
		if err := rows.Close(); err != nil {
			return cp, false, fmt.Errorf("checkpoint: read activity: %w", err)
		}
		if err := rows.Err(); err != nil {
			return cp, false, fmt.Errorf("checkpoint: read activity: %w", err)
		}
		for _, r := range page {
			after = r.id
			if !belongs(r.id) {
				continue
			}
			d.Activity(r.id, r.capacity, r.confirmed, r.next, time.Duration(r.hold), r.held)
			cp.Activities++
			if partitioned {
				ids = append(ids, r.id)
			}
			if err := ins.add(ctx, partition, cp.Seq, r.id, r.capacity, r.confirmed, r.next, r.hold, r.held); err != nil {
				return cp, false, err
			}
		}
		if got < checkpointPage {
			break
		}
	}
	if err := ins.flush(ctx); err != nil {
		return cp, false, err
	}
	ins = &rowInserter{tx: tx, prefix: "INSERT INTO allocator_checkpoint_signup (partition_id, seq, activity_id, user_id, status, queue_seq, held_until, hold_seq) VALUES "}
	// One range over every activity, or chunks of this partition's ids
	// in ascending order: either way the rows come in digest order.
	ranges := []string{""}
	if partitioned {
		ranges = ranges[:0]
		for len(ids) > 0 {
			n := min(len(ids), 500)
			ranges = append(ranges, "activity_id IN ("+store.IntList(ids[:n])+") AND ")
			ids = ids[n:]
		}
	}
	for _, where := range ranges {
		if err := copySignups(ctx, tx, ins, d, &cp, where); err != nil {
			return cp, false, err
		}
	}
	if err := ins.flush(ctx); err != nil {
		return cp, false, err
	}
	cp.Digest = d.Sum()
	cp.TakenAt = time.Now().UTC()
	if _, err := tx.ExecContext(ctx, "INSERT INTO allocator_checkpoint (partition_id, seq, partitions, stream_id, activities, signups, digest, taken_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
		partition, cp.Seq, partitions, streamID, cp.Activities, cp.Signups, cp.Digest, cp.TakenAt); err != nil {
		if isDuplicate(err) {
			return cp, false, nil // taken by another process meanwhile
		}
		return cp, false, fmt.Errorf("checkpoint: write: %w", err)
	}
	if err := tx.Commit(); err != nil {
		if isDuplicate(err) {
			return cp, false, nil
		}
		return cp, false, fmt.Errorf("checkpoint: commit: %w", err)
	}
	return cp, true, nil
}

// rowInserter writes rows in multi-row INSERTs of checkpointPage rows.
type rowInserter struct {
	tx     *sql.Tx
	prefix string
	n      int
	sql    strings.Builder
	args   []any
}

func (w *rowInserter) add(ctx context.Context, vals ...any) error {
	if w.n == 0 {
		w.sql.Reset()
		w.sql.WriteString(w.prefix)
		w.args = w.args[:0]
	} else {
		w.sql.WriteByte(',')
	}
	w.sql.WriteString("(?" + strings.Repeat(", ?", len(vals)-1) + ")")
	w.args = append(w.args, vals...)
	w.n++
	if w.n >= checkpointPage {
		return w.flush(ctx)
	}
	return nil
}

func (w *rowInserter) flush(ctx context.Context) error {
	if w.n == 0 {
		return nil
	}
	w.n = 0
	if _, err := w.tx.ExecContext(ctx, w.sql.String(), w.args...); err != nil {
		return fmt.Errorf("checkpoint: write rows: %w", err)
	}
	return nil
}

// Latest returns partition's newest checkpoint, and false when it
// has none.
func Latest(ctx context.Context, q store.DBTX, partition int) (Checkpoint, bool, error) {
	cp := Checkpoint{Partition: partition}
	var streamID sql.NullString
	err := q.QueryRowContext(ctx, "SELECT seq, partitions, stream_id, activities, signups, digest, taken_at FROM allocator_checkpoint "+
		"WHERE partition_id = ? ORDER BY seq DESC LIMIT 1", partition).
		Scan(&cp.Seq, &cp.Partitions, &streamID, &cp.Activities, &cp.Signups, &cp.Digest, &cp.TakenAt)
	if errors.Is(err, sql.ErrNoRows) {
		return cp, false, nil
	}
	if err != nil {
		return cp, false, fmt.Errorf("checkpoint: read latest: %w", err)
	}
	cp.StreamID = streamID.String
	return cp, true, nil
}

// Prune deletes partition's checkpoints below seq keepFrom
// (those the request stream can no longer be replayed from, since it starts
// after them), except the newest, and returns how many it deleted. The
// headers go first, in one statement: rows without a header are no
// checkpoint, and a prune cut short leaves only rows the next one removes,
// in chunks that keep each transaction small.
func Prune(ctx context.Context, db *sql.DB, partition int, keepFrom uint64) (int64, error) {
	var newest uint64
	if err := db.QueryRowContext(ctx, "SELECT COALESCE(MAX(seq), 0) FROM allocator_checkpoint WHERE partition_id = ?", partition).Scan(&newest); err != nil {
		return 0, fmt.Errorf("checkpoint: prune: %w", err)
	}
	keepFrom = min(keepFrom, newest)
	res, err := db.ExecContext(ctx, "DELETE FROM allocator_checkpoint WHERE partition_id = ? AND seq < ?", partition, keepFrom)
	if err != nil {
		return 0, fmt.Errorf("checkpoint: prune: %w", err)
	}
	deleted, _ := res.RowsAffected()
	for _, table := range []string{"allocator_checkpoint_activity", "allocator_checkpoint_signup"} {
		for {
			res, err := db.ExecContext(ctx, "DELETE FROM "+table+" WHERE partition_id = ? AND seq < ? LIMIT 10000", partition, keepFrom)
			if err != nil {
				return deleted, fmt.Errorf("checkpoint: prune %s: %w", table, err)
			}
			if n, _ := res.RowsAffected(); n < 10000 {
				break
			}
		}
	}
	return deleted, nil
}

// isDuplicate reports a duplicate-key error (1062).
func isDuplicate(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1062
}

// copySignups copies the activity_signup rows matching where (a condition
// ending in AND, or empty) in (activity_id, user_id) order, a page at a
// time, into the checkpoint and its digest.
func copySignups(ctx context.Context, tx *sql.Tx, ins *rowInserter, d *Digester, cp *Checkpoint, where string) error {
	type signup struct {
		act, user int64
		status    string
		queueSeq  uint64
		until     sql.NullTime
		holdSeq   sql.NullInt64
	}
	var afterAct, afterUser int64
	for {
		rows, err := tx.QueryContext(ctx, "SELECT activity_id, user_id, status, queue_seq, held_until, hold_seq FROM activity_signup WHERE "+where+
			"(activity_id > ? OR (activity_id = ? AND user_id > ?)) ORDER BY activity_id, user_id LIMIT "+strconv.Itoa(checkpointPage),
			afterAct, afterAct, afterUser)
		if err != nil {
			return fmt.Errorf("checkpoint: read activity_signup: %w", err)
		}
		var page []signup
		for rows.Next() {
			var r signup
			if err := rows.Scan(&r.act, &r.user, &r.status, &r.queueSeq, &r.until, &r.holdSeq); err != nil {
				rows.Close()
				return fmt.Errorf("checkpoint: read activity_signup: %w", err)
			}
			page = append(page, r)
		}
		if err := rows.Close(); err != nil {
			return fmt.Errorf("checkpoint: read activity_signup: %w", err)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("checkpoint: read activity_signup: %w", err)
		}
		for _, r := range page {
			afterAct, afterUser = r.act, r.user
			var until time.Time
			var untilArg any
			if r.until.Valid {
				until = r.until.Time.UTC()
				untilArg = until
			}
			var holdArg any
			if r.holdSeq.Valid {
				holdArg = r.holdSeq.Int64
			}
			d.Signup(r.act, r.user, r.status, r.queueSeq, until, uint64(r.holdSeq.Int64))
			cp.Signups++
			if err := ins.add(ctx, cp.Partition, cp.Seq, r.act, r.user, r.status, r.queueSeq, untilArg, holdArg); err != nil {
				return err
			}
		}
		if len(page) < checkpointPage {
			return nil
		}
	}
}
