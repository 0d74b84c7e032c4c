package audit

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/store/checkpoint"
	"github.com/allot-dev/allot/internal/wire"
)

// ErrNoCheckpoint is returned by Run with Config.FromCheckpoint when a
// partition has no checkpoint the request stream still reaches back to:
// nothing can be verified from there honestly.
var ErrNoCheckpoint = errors.New("audit: no usable checkpoint")

// KindCheckpoint: a checkpoint's rows do not match its digest, or break
// the invariants (docs/architecture.md); the replay from it is then suspect too.
const KindCheckpoint Kind = "checkpoint"

// CheckpointUsed is a checkpoint an audit started from.
type CheckpointUsed struct {
	// Shard is the shard it was read on, in an audit of several.
	Shard      string    `json:"shard,omitempty"`
	Partition  int       `json:"partition"`
	Seq        uint64    `json:"seq"`
	TakenAt    time.Time `json:"taken_at"`
	Activities int64     `json:"activities"`
	Signups    int64     `json:"signups"`
	// DigestOK is true when the checkpoint's rows hash to its digest.
	DigestOK bool `json:"digest_ok"`
}

// fromCheckpoint is the state of an audit that starts from checkpoints
// (Config.FromCheckpoint): per partition, the sequence its state is taken
// at; messages up to it are not replayed.
type fromCheckpoint struct {
	ctx context.Context
	// db reads processed_request outside the snapshot, for request ids
	// applied before a checkpoint (rows there never change).
	db         *sql.DB
	partitions int
	start      []uint64 // by partition: the checkpoint's seq, 0 for none
	min        uint64   // the lowest of start: the replay begins after it
	used       []CheckpointUsed
}

// covers says whether the message at seq on subject is part of its
// partition's checkpoint, and so is not replayed.
func (f *fromCheckpoint) covers(seq uint64, subject string) bool {
	if seq <= f.min {
		return true
	}
	p := 0
	if f.partitions > 1 {
		rest, _ := strings.CutPrefix(subject, wire.RequestSubjectPrefix)
		tok, _, _ := strings.Cut(rest, ".")
		n, err := strconv.Atoi(tok)
		if err != nil || n < 0 || n >= f.partitions {
			return false
		}
		p = n
	}
	return seq <= f.start[p]
}

// appliedBefore returns the place requestID was applied at, when that is
// before place: a repeat of a request the checkpoint covers, which the
// replay never saw.
func (f *fromCheckpoint) appliedBefore(requestID string, place uint64) (uint64, bool, error) {
	var (
		seq   uint64
		index int
	)
	err := f.db.QueryRowContext(f.ctx, "SELECT seq, batch_index FROM processed_request WHERE request_id = ? AND (seq < ? OR seq = ? AND batch_index < ?) "+
		"ORDER BY seq, batch_index LIMIT 1", requestID, wire.SeqOf(place), wire.SeqOf(place), wire.IndexOf(place)).Scan(&seq, &index)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("audit: look up request %s: %w", requestID, err)
	}
	return wire.Place(seq, index), true, nil
}

// dropCoveredRejections forgets the rejected_message rows at or before
// the lowest checkpoint: no message before it is read.
func (a *auditor) dropCoveredRejections() {
	for place := range a.rejected {
		if wire.SeqOf(place) <= a.cp.min {
			delete(a.rejected, place)
		}
	}
}

// skipCovered passes over a message its checkpoint covers: the results and
// rejections of its requests, if any, are part of what the checkpoint
// vouches for.
func (a *auditor) skipCovered(seq uint64) error {
	// Rows before the message are reported as resultAt does; the
	// message's own are consumed.
	if _, err := a.resultAt(wire.Place(seq, 0)); err != nil {
		return err
	}
	for {
		r, err := a.check.results.Peek()
		if err != nil {
			return err
		}
		if r == nil || r.Seq != seq {
			break
		}
		a.check.results.Next()
	}
	if a.rejectedSeqs[seq] {
		for place := range a.rejected {
			if wire.SeqOf(place) == seq {
				delete(a.rejected, place)
			}
		}
	}
	return nil
}

// openFromCheckpoint reads the request stream's bounds, picks each
// partition's oldest checkpoint the stream still reaches back to (the
// longest range that can be verified), checks its digest and loads its
// state as the replay's starting point. A partition without a checkpoint
// starts from nothing, which needs the stream to start at sequence 1.
func (a *auditor) openFromCheckpoint(ctx context.Context, tx *sql.Tx, db *sql.DB, js jetstream.JetStream) (stream, error) {
	s, err := js.Stream(ctx, wire.RequestStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return stream{}, fmt.Errorf("%w: stream %s does not exist on this NATS server (wrong ALLOT_NATS_URL?)", ErrIncompleteStream, wire.RequestStream)
	}
	if err != nil {
		return stream{}, fmt.Errorf("%w: stream %s: %w", bus.ErrUnavailable, wire.RequestStream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return stream{}, fmt.Errorf("%w: stream %s info: %w", bus.ErrUnavailable, wire.RequestStream, err)
	}
	state := info.State
	switch {
	case state.NumDeleted > 0:
		return stream{}, fmt.Errorf("%w: %s has %d deleted messages, so the state cannot be replayed",
			ErrIncompleteStream, wire.RequestStream, state.NumDeleted)
	case a.fence > state.LastSeq:
		return stream{}, fmt.Errorf("%w: the allocator's fence %d is beyond %s's last sequence %d (purged or recreated stream?)",
			ErrIncompleteStream, a.fence, wire.RequestStream, state.LastSeq)
	}
	st := stream{js: js, last: state.LastSeq, partitions: max(bus.PartitionsOf(info.Config), 1)}
	// A checkpoint at seq S is usable when every message after S is
	// still stored: S+1 >= the stream's first sequence.
	need := uint64(0)
	if state.FirstSeq > 1 {
		need = state.FirstSeq - 1
	}
	f := &fromCheckpoint{ctx: ctx, db: db, partitions: st.partitions, start: make([]uint64, st.partitions), min: ^uint64(0)}
	for p := range st.partitions {
		if !a.partAudited(p) {
			continue
		}
		var cp checkpoint.Checkpoint
		err := tx.QueryRowContext(ctx, "SELECT seq, partitions, activities, signups, digest, taken_at FROM allocator_checkpoint "+
			"WHERE partition_id = ? AND seq >= ? ORDER BY seq LIMIT 1", p, need).
			Scan(&cp.Seq, &cp.Partitions, &cp.Activities, &cp.Signups, &cp.Digest, &cp.TakenAt)
		switch {
		case errors.Is(err, sql.ErrNoRows) && need == 0:
			f.min = 0 // from the beginning, as a full audit would
			continue
		case errors.Is(err, sql.ErrNoRows):
			// A quiet partition: the allocator takes no new checkpoint
			// while its fence stands still, so its newest one (or none,
			// if it never applied anything) may be older than where the
			// stream starts. It still holds when nothing of the partition
			// was applied or rejected since: the state at need is the same.
			older, found, quiet, err := quietCheckpoint(ctx, tx, p, st.partitions, need)
			if err != nil {
				return stream{}, err
			}
			if !quiet {
				return stream{}, fmt.Errorf("%w: partition %d has no checkpoint at or after seq %d, where %s now starts (seq %d); "+
					"the allocator takes one every ALLOT_CHECKPOINT_INTERVAL", ErrNoCheckpoint, p, need, wire.RequestStream, state.FirstSeq)
			}
			if found {
				if older.Partitions != st.partitions {
					return stream{}, fmt.Errorf("%w: the checkpoint of partition %d at seq %d was taken with %d partitions, the stream has %d",
						ErrNoCheckpoint, p, older.Seq, older.Partitions, st.partitions)
				}
				older.Partition = p
				ok, err := a.loadCheckpoint(ctx, tx, older, need) // the state at need
				if err != nil {
					return stream{}, err
				}
				f.used = append(f.used, CheckpointUsed{Partition: p, Seq: older.Seq, TakenAt: older.TakenAt.UTC(),
					Activities: older.Activities, Signups: older.Signups, DigestOK: ok})
			}
			f.start[p] = need
			f.min = min(f.min, need)
			continue
		case err != nil:
			return stream{}, fmt.Errorf("audit: read allocator_checkpoint: %w", err)
		}
		if cp.Partitions != st.partitions {
			return stream{}, fmt.Errorf("%w: the checkpoint of partition %d at seq %d was taken with %d partitions, the stream has %d",
				ErrNoCheckpoint, p, cp.Seq, cp.Partitions, st.partitions)
		}
		cp.Partition = p
		ok, err := a.loadCheckpoint(ctx, tx, cp, cp.Seq)
		if err != nil {
			return stream{}, err
		}
		f.start[p] = cp.Seq
		f.min = min(f.min, cp.Seq)
		f.used = append(f.used, CheckpointUsed{Partition: p, Seq: cp.Seq, TakenAt: cp.TakenAt.UTC(),
			Activities: cp.Activities, Signups: cp.Signups, DigestOK: ok})
	}
	if f.min == ^uint64(0) {
		f.min = 0
	}
	a.cp = f
	// Rows the checkpoints hold were last changed at their seq: compared
	// from the lowest one on. Results and rejections are read after it.
	a.winStart = max(f.min, 1)
	return st, nil
}

// loadCheckpoint reads a checkpoint's rows, checks them against its digest
// and its counts, and makes them the replay's state of the partition's
// activities, as if the requests before it had been replayed. It reports
// whether the digest matched; a mismatch is a divergence. Its rows stand
// for the state at sequence at: its own, or a later one up to which the
// partition was quiet.
func (a *auditor) loadCheckpoint(ctx context.Context, tx *sql.Tx, cp checkpoint.Checkpoint, at uint64) (bool, error) {
	by := change{place: wire.Place(at, 0)}
	d := checkpoint.NewDigester()
	type actRow struct {
		capacity, confirmed int64
		next                uint64
		hold, held          int64
	}
	acts := make(map[int64]actRow)
	var order []int64
	rows, err := tx.QueryContext(ctx, "SELECT activity_id, capacity, confirmed_count, next_seq, hold_ns, held_count FROM allocator_checkpoint_activity "+
		"WHERE partition_id = ? AND seq = ? ORDER BY activity_id", cp.Partition, cp.Seq)
	if err != nil {
		return false, fmt.Errorf("audit: read checkpoint activities: %w", err)
	}
	for rows.Next() {
		var id int64
		var r actRow
		if err := rows.Scan(&id, &r.capacity, &r.confirmed, &r.next, &r.hold, &r.held); err != nil {
			rows.Close()
			return false, fmt.Errorf("audit: read checkpoint activities: %w", err)
		}
		d.Activity(id, r.capacity, r.confirmed, r.next, time.Duration(r.hold), r.held)
		acts[id] = r
		order = append(order, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, fmt.Errorf("audit: read checkpoint activities: %w", err)
	}
	live := make(map[int64][]allocation.Signup)
	var signups int64
	rows, err = tx.QueryContext(ctx, "SELECT activity_id, user_id, status, queue_seq, held_until, hold_seq FROM allocator_checkpoint_signup "+
		"WHERE partition_id = ? AND seq = ? ORDER BY activity_id, user_id", cp.Partition, cp.Seq)
	if err != nil {
		return false, fmt.Errorf("audit: read checkpoint signups: %w", err)
	}
	for rows.Next() {
		var (
			act, user int64
			status    string
			queueSeq  uint64
			heldUntil sql.NullTime
			holdSeq   sql.NullInt64
		)
		if err := rows.Scan(&act, &user, &status, &queueSeq, &heldUntil, &holdSeq); err != nil {
			rows.Close()
			return false, fmt.Errorf("audit: read checkpoint signups: %w", err)
		}
		var until time.Time
		if heldUntil.Valid {
			until = heldUntil.Time.UTC()
		}
		d.Signup(act, user, status, queueSeq, until, uint64(holdSeq.Int64))
		signups++
		if !a.audited(act) {
			continue
		}
		// The row as the checkpoint has it, hold included: what the
		// audit expects in MySQL unless a later request changes it.
		a.signups[signupKey{act, user}] = &signupTrack{status: status, queueSeq: queueSeq,
			heldUntil: until, holdSeq: uint64(holdSeq.Int64), by: by}
		if st := wire.Status(status); st == wire.StatusConfirmed || st == wire.StatusHeld || st == wire.StatusWaiting {
			live[act] = append(live[act], allocation.Signup{UserID: user, Status: st, QueueSeq: queueSeq,
				HeldUntil: until, HoldSeq: uint64(holdSeq.Int64)})
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, fmt.Errorf("audit: read checkpoint signups: %w", err)
	}
	where := fmt.Sprintf("checkpoint of partition %d at seq %d", cp.Partition, cp.Seq)
	ok := true
	if got := d.Sum(); got != cp.Digest || int64(len(order)) != cp.Activities || signups != cp.Signups {
		ok = false
		a.diverge(Divergence{
			Seq: cp.Seq, Kind: KindCheckpoint, Field: "digest",
			Expected: fmt.Sprintf("%s (%d activities, %d signups)", cp.Digest, cp.Activities, cp.Signups),
			Actual:   fmt.Sprintf("%s (%d activities, %d signups)", got, len(order), signups),
			Detail:   "the " + where + " was changed after it was taken; the replay from it is suspect",
		})
	}
	for _, id := range order {
		if !a.audited(id) {
			continue
		}
		r := acts[id]
		act, err := allocation.Restore(id, r.capacity, r.confirmed, r.next, time.Duration(r.hold), live[id])
		if err == nil && act.Held != r.held {
			err = fmt.Errorf("%w: activity %d: held_count %d but %d HELD rows", allocation.ErrCorruptState, id, r.held, act.Held)
		}
		if err != nil {
			ok = false
			a.diverge(Divergence{
				Seq: cp.Seq, Kind: KindCheckpoint, ActivityID: id,
				Expected: "a state that keeps the invariants", Actual: err.Error(),
				Detail: "in the " + where,
			})
			continue
		}
		a.acts[id] = act
		a.actLast[id] = by
		// The second opinion starts from the same state; it judges every
		// decision after the checkpoint on its own.
		a.ref.Seed(act)
	}
	return ok, nil
}

// audited says whether activity is among the audited ones (Activities).
func (a *auditor) audited(activity int64) bool {
	return a.subjects == nil || a.subjects[activityKey(activity)]
}

// verifiedRange is the range of stream sequences whose decisions the
// audit checked: from the window's start (after the checkpoints, with
// FromCheckpoint) to the allocator's fence.
func (a *auditor) verifiedRange() (from, to uint64) {
	from = a.winStart
	if a.cp != nil {
		from = a.cp.min + 1
	}
	if from == ^uint64(0) || from > a.fence {
		return 0, a.fence
	}
	return max(from, 1), a.fence
}

// quietCheckpoint finds partition p's newest checkpoint below need (found
// false: it has none) and reports whether the partition is quiet since it:
// no result of the partition and no rejected message after the checkpoint
// up to need, so the checkpoint's state (or the empty state) is the state
// at need. Rejections are told by their subject's partition token (with
// one partition, any one makes it not quiet).
func quietCheckpoint(ctx context.Context, tx *sql.Tx, p, partitions int, need uint64) (cp checkpoint.Checkpoint, found, quiet bool, err error) {
	err = tx.QueryRowContext(ctx, "SELECT seq, partitions, activities, signups, digest, taken_at FROM allocator_checkpoint "+
		"WHERE partition_id = ? AND seq < ? ORDER BY seq DESC LIMIT 1", p, need).
		Scan(&cp.Seq, &cp.Partitions, &cp.Activities, &cp.Signups, &cp.Digest, &cp.TakenAt)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		cp.Seq = 0
	case err != nil:
		return cp, false, false, fmt.Errorf("audit: read allocator_checkpoint: %w", err)
	default:
		found = true
	}
	var n int
	subject := "%"
	if partitions > 1 {
		subject = wire.RequestSubjectPrefix + strconv.Itoa(p) + ".%"
	}
	if err := tx.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM processed_request WHERE partition_id = ? AND seq > ? AND seq <= ?)"+
		" + (SELECT COUNT(*) FROM rejected_message WHERE seq > ? AND seq <= ? AND subject LIKE ?)", p, cp.Seq, need, cp.Seq, need, subject).Scan(&n); err != nil {
		return cp, found, false, fmt.Errorf("audit: look for changes since the checkpoint of partition %d: %w", p, err)
	}
	return cp, found, n == 0, nil
}
