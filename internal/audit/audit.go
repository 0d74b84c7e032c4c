// Package audit replays the request stream ALLOT_REQUESTS through the same
// pure domain the allocator uses (internal/allocation) and compares what the
// replay decides with what MySQL recorded: each result in processed_request,
// each refused message in rejected_message, and the final activity and
// activity_signup rows. The replay is the reference; MySQL is what is checked.
//
// # Snapshot
//
// MySQL is read in one read-only REPEATABLE READ transaction, whose snapshot
// starts with the allocator's fence (the highest allocator_partition.last_seq).
// The stream's last sequence L is read after that, so every message up to the
// fence is in the stream. Messages in (fence, L] are pending: counted, never
// divergences. Messages stored after L are not read. The allocator may keep
// running while the audit runs.
//
// # Replay
//
// The state is rebuilt from the first message: the stream must still start at
// sequence 1 with no deleted messages, otherwise Run fails with
// ErrIncompleteStream. A message carries one request or a batch (header
// wire.BatchHeader, read with the message); wire.DecodeMessage expands it
// into its requests, each at its place (seq, index): wire.Place packs the
// pair, and results, rejections and divergences name it ("seq" or
// "seq#index", wire.FormatPlace). Each request up to the fence is handled the
// way the allocator handles it, in place order:
//
//  1. its message is malformed as a whole (wire.DecodeMessage fails): one
//     malformed request at (seq, 0); nothing in the message applies.
//     rejected_message must hold (seq, 0), processed_request nothing of seq.
//     A request of a batch that is malformed by itself (or on the wrong
//     subject) is refused alone: rejected_message must hold (seq, index),
//     and the batch's other requests apply.
//  2. its request_id already has a result in the replay (an Idempotency-Key
//     repeat, or the same request in a later batch or message): skipped, as
//     a request id applies once however many messages carry it. Its place
//     must have neither a result nor a rejected_message row.
//  3. allocation.Apply returns an error: counted as malformed, like 1.
//  4. otherwise the decision, turned into a wire.Result exactly as the
//     allocator records it, must equal the processed_request row at the same
//     place: request_id, op, activity_id, user_id, outcome, status,
//     position, promoted_user_ids and capacity (applied_at is not compared),
//     and rejected_message must not hold the place.
//
// A request the domain accepts but rejected_message holds without a result
// (the allocator refused it, e.g. on a store error) is one divergence, and
// the replay then leaves it unapplied as the allocator did. Otherwise the
// replay never adopts what MySQL says: a wrong decision by the allocator
// changes the allocator's later decisions, so one fault can show up as
// several divergences; the earliest one is the cause.
//
// After the replay, each audited activity's row (capacity, confirmed_count,
// next_seq) and each of its activity_signup rows (status, queue_seq;
// CANCELLED rows too, since the replay keeps every user's last row) must
// equal the replay's. A divergence on such a row names the request that last
// changed it in the replay. Rows the replay never produced (an activity,
// signup, result or rejected_message row with no message behind it) are
// divergences as well.
//
// # Filters
//
// Config.Activities reads only the subjects alloc.req.<id> of those
// activities (activities are independent, so nothing is lost) and checks only
// their rows: results by activity_id, rejected messages by subject.
//
// Config.FromSeq and Config.FromTime open a window: messages before it are
// replayed to build the state but not compared. Everything that carries a
// place (results, rejected messages, activity and signup rows, through the
// request that last changed them) is compared only from the window's first
// message; rows the replay never produced are reported
// whatever the window, since no request explains them. With FromTime the
// window starts at the first message stored at or after that time.
//
// Config.Partitions reads only those partitions' subjects and checks only
// their rows (results by partition_id, refused messages by subject,
// activity and signup rows by the activity's partition): the rest of the
// database is left alone. Each message is pending past its own partition's
// fence.
//
// # Shards
//
// With Deps.Shards (ALLOT_MYSQL_SHARDS), Run reads the partition → shard
// map and audits every shard in a snapshot of its own, concurrently: the
// partitions the map puts on it, as above, and every row there of an
// activity whose partition is on another shard (KindMisplaced). A shard
// that cannot be audited (it does not answer, or a move of one of its
// partitions is under way) is an error wrapping ErrShard, returned with
// the report of every shard; Report.Shards holds each shard's report.
package audit

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/audit/snapshot"
	"github.com/allot-dev/allot/internal/wire"
)

// ErrIncompleteStream is returned by Run when the request stream no longer
// holds every message from sequence 1 up to the allocator's fence (messages
// removed by limits, deleted, or a purged or recreated stream): the state
// cannot be rebuilt, so nothing could be compared honestly.
var ErrIncompleteStream = errors.New("audit: the request stream is incomplete")

// Report is what an audit found. The counts cover the whole replay up to the
// fence; Compared and the divergences are limited to the window.
type Report struct {
	// ActivitiesChecked is the number of activities whose rows were compared:
	// the Activities option, or else every activity the replay or MySQL knows.
	ActivitiesChecked int `json:"activities_checked"`
	// Replayed is the number of requests up to the fence that were read:
	// every request of every message, a message malformed as a whole
	// counting as one.
	Replayed int `json:"requests_replayed"`
	// Messages is the number of messages up to the fence that were read
	// (a batch is one message carrying many requests).
	Messages int `json:"messages_replayed"`
	// Compared is the number of applied requests in the window whose result
	// was compared with processed_request.
	Compared int `json:"compared"`
	// Skipped is the number of repeats of an already applied request_id.
	Skipped int `json:"skipped_duplicates"`
	// Malformed is the number of requests refused by wire.DecodeMessage or
	// allocation.Apply (a message malformed as a whole counting as one):
	// the allocator must have recorded them as rejected.
	Malformed int `json:"malformed"`
	// Pending is the number of messages stored after the allocator's fence.
	Pending int `json:"pending"`
	// LastSeq is the stream's last sequence when the audit started.
	LastSeq uint64 `json:"last_seq"`
	// Fence is the allocator's fence: the last stream sequence applied.
	Fence uint64 `json:"fence"`
	// WindowStart is the first sequence compared (0 when nothing was).
	WindowStart uint64 `json:"window_start_seq"`
	// VerifiedFrom and VerifiedTo are the range of stream sequences whose
	// decisions were replayed and compared (VerifiedFrom 0: none).
	VerifiedFrom uint64 `json:"verified_from_seq"`
	VerifiedTo   uint64 `json:"verified_to_seq"`
	// Checkpoints are the checkpoints the audit started from
	// (FromCheckpoint), one per partition that has one.
	Checkpoints []CheckpointUsed `json:"checkpoints,omitempty"`
	// OK is true when there is no divergence (and, with shards, every
	// shard was audited).
	OK bool `json:"ok"`
	// Divergences lists every mismatch, in the order found (with shards,
	// shard by shard, each naming its shard).
	Divergences []Divergence `json:"divergences"`
	// Shards, in an audit of several shards, is each shard's report; the
	// counts above are their sums (LastSeq and Fence the highest).
	Shards []ShardReport `json:"shards,omitempty"`
}

// Kind classifies a divergence.
type Kind string

// Kinds of divergence.
const (
	// KindResult: a processed_request column differs from the replay.
	KindResult Kind = "result"
	// KindResultMissing: an applied request has no processed_request row.
	KindResultMissing Kind = "result_missing"
	// KindResultUnexpected: a processed_request row at a place that must
	// have none (malformed, repeat, pending, or no request at all).
	KindResultUnexpected Kind = "result_unexpected"
	// KindNotRejected: a malformed message has no rejected_message row.
	KindNotRejected Kind = "malformed_not_rejected"
	// KindRejectedUnexpected: a rejected_message row for a request the
	// replay applies or skips, or for no request at all.
	KindRejectedUnexpected Kind = "rejected_unexpected"
	// KindActivity: an activity column differs from the replay.
	KindActivity Kind = "activity"
	// KindActivityMissing: the replay has an activity MySQL lacks.
	KindActivityMissing Kind = "activity_missing"
	// KindActivityUnexpected: MySQL has an activity the replay never opened.
	KindActivityUnexpected Kind = "activity_unexpected"
	// KindSignup: an activity_signup column differs from the replay.
	KindSignup Kind = "signup"
	// KindSignupMissing: the replay has a signup row MySQL lacks.
	KindSignupMissing Kind = "signup_missing"
	// KindSignupUnexpected: MySQL has a signup row the replay never made.
	KindSignupUnexpected Kind = "signup_unexpected"
)

// Divergence is one mismatch between the replay and MySQL.
type Divergence struct {
	// Seq and Index are the place of the request concerned (the stream
	// sequence of its message and its index in that message's batch, 0
	// for a single request): the request itself, or the one that last
	// changed the row. Seq 0 when no request is. String writes them as
	// wire.FormatPlace does: "seq" or "seq#index".
	Seq   uint64 `json:"seq"`
	Index int    `json:"index"`
	// RequestID is that request's id; empty when there is none or the
	// message could not be decoded.
	RequestID string `json:"request_id"`
	// Shard is the shard whose rows diverge, in an audit of several.
	Shard      string `json:"shard,omitempty"`
	Kind       Kind   `json:"kind"`
	ActivityID int64  `json:"activity_id,omitempty"`
	UserID     int64  `json:"user_id,omitempty"`
	// Field is the column that differs, for the field kinds.
	Field    string `json:"field,omitempty"`
	Expected string `json:"expected"`
	Actual   string `json:"actual"`
	// Detail explains what the comparison could not, e.g. a decode error.
	Detail string `json:"detail,omitempty"`
}

// Place is the divergence's place packed as wire.Place.
func (d Divergence) Place() uint64 { return wire.Place(d.Seq, d.Index) }

// Run audits MySQL against the request stream (deps.JS) and returns what it
// found: the one database deps.DB, or, with deps.Shards, every shard
// (shards.go). An error means the audit could not be carried out (bad
// options, NATS or MySQL unreachable, an incomplete stream); divergences
// are not errors, they are in the Report. A shard that could not be
// audited is an error wrapping ErrShard, returned with the report of
// every shard.
func Run(ctx context.Context, cfg Config, deps Deps) (Report, error) {
	if deps.Shards != nil || deps.Unreachable != nil {
		return runShards(ctx, cfg, deps)
	}
	return runOne(ctx, cfg, deps, deps.DB, scope{parts: partSet(cfg.Partitions)})
}

// runOne audits the partitions of sc (all, or some) against db.
func runOne(ctx context.Context, cfg Config, deps Deps, db *sql.DB, sc scope) (Report, error) {
	js := deps.JS
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return Report{}, fmt.Errorf("audit: begin mysql snapshot: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only: nothing to keep

	a := newAuditor(cfg, deps, sc)
	from := uint64(0)
	// The fences first: they start the snapshot, and every message they
	// cover was stored before the stream's last sequence is read below.
	fences, err := snapshot.ReadFences(ctx, tx, sc.shard != nil)
	if err != nil {
		return Report{}, err
	}
	if err := a.setFences(fences); err != nil {
		return Report{}, err
	}
	var st stream
	if cfg.FromCheckpoint {
		st, err = a.openFromCheckpoint(ctx, tx, db, js)
	} else {
		st, err = openStream(ctx, js, a.fence)
	}
	if err != nil {
		return Report{}, err
	}
	a.run.last, a.run.partitions = st.last, st.partitions
	if err := a.checkPartitions(); err != nil {
		return Report{}, err
	}
	if a.rejected, err = snapshot.ReadRejected(ctx, tx); err != nil {
		return Report{}, err
	}
	a.narrowRejected()
	a.ids.refusedAt = make(map[string]uint64)
	a.rejectedSeqs = make(map[uint64]bool, len(a.rejected))
	for place, r := range a.rejected {
		a.rejectedSeqs[wire.SeqOf(place)] = true
		if at, ok := a.ids.refusedAt[r.RequestID]; r.RequestID != "" && (!ok || place < at) {
			a.ids.refusedAt[r.RequestID] = place
		}
	}
	if a.cp != nil {
		a.dropCoveredRejections()
		from = a.cp.min
	}

	if cfg.FromSeq > 0 {
		from = cfg.FromSeq - 1
	}
	pagerCtx, cancelPager := context.WithCancel(ctx)
	a.check.results = snapshot.StartResults(pagerCtx, tx, from, a.run.activities, a.run.partList)
	defer func() {
		cancelPager()
		a.check.results.Wait()
	}()

	if err := a.replay(ctx, st); err != nil {
		return Report{}, err
	}
	if err := a.drainResults(); err != nil {
		return Report{}, err
	}
	a.leftoverRejected()
	if err := a.compareRows(ctx, tx); err != nil {
		return Report{}, err
	}
	if err := a.misplaced(ctx, tx); err != nil {
		return Report{}, err
	}
	return a.report(), nil
}

// newAuditor prepares the replay state for cfg.
func newAuditor(cfg Config, deps Deps, sc scope) *auditor {
	a := &auditor{
		run: auditRun{cfg: cfg, activities: cfg.activities(), progress: deps.Progress, apply: deps.Test.apply(),
			parts: sc.parts, partList: sc.list(), shard: sc.shard},
		winStart: math.MaxUint64,
		acts:     make(map[int64]*allocation.Activity),
		actLast:  make(map[int64]change),
		signups:  make(map[signupKey]*signupTrack),
		ids:      requestIDs{seen: make(map[string]uint64)},
	}
	switch {
	case cfg.FromSeq > 0:
		a.winStart = cfg.FromSeq
	case cfg.FromTime.IsZero():
		a.winStart = 1
	}
	if len(a.run.activities) > 0 {
		a.subjects = make(map[string]bool, len(a.run.activities))
		for _, id := range a.run.activities {
			a.subjects[activityKey(id)] = true
		}
	}
	return a
}
