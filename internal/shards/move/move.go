// Package move moves one partition's MySQL state from the shard the map
// names to another, online: `allotctl shards move -partition P -to SHARD`.
// The steps (docs/shards.md): freeze the partition on its old shard (its
// fence row at no epoch), copy its rows from one consistent snapshot to
// the new shard in bounded chunks, verify the copy (counts and checksums
// per table, and the audit of its activities there), write its fence row
// there at the next epoch, flip the map (compare-and-set), let the
// allocators pick it up there, and delete its rows from the old shard.
// Every step is idempotent and found again from durable state (the map,
// the fence rows and the move's record, key move.<P> of the map's
// bucket), so a move interrupted anywhere is finished by running it again,
// or undone (Undo) before the flip. A run holds the record with a lease it
// renews (lease.go): a second run while it is live is refused
// (ErrLeased), one after it ended unrenewed takes the move over.
package move

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/store"
)

// ErrUsage is what the errors of a move that cannot be asked for are
// (errors.Is): a bad partition, an unknown shard, the shard the partition
// is on already, another target than the move under way.
var ErrUsage = errors.New("move: bad usage")

type usageError string

func (e usageError) Error() string        { return string(e) }
func (e usageError) Is(target error) bool { return target == ErrUsage }

// The steps, as printed and as Options.After names them.
const (
	StepFreeze = "freeze"
	StepCopy   = "copy"
	StepVerify = "verify"
	StepFence  = "fence"
	StepFlip   = "flip"
	StepResume = "resume"
	StepClean  = "clean"
	StepUndo   = "undo"
)

// Options say what to move and with what.
type Options struct {
	Partition  int
	Partitions int    // of the request stream
	To         string // the shard to move to (not for Undo)
	// Undo gives back to its old shard a partition whose move has not
	// flipped the map yet.
	Undo  bool
	Pools shards.Pools       // every configured shard
	KV    jetstream.KeyValue // the map's bucket, shards.Bucket
	JS    jetstream.JetStream
	Out   io.Writer // a line per step
	// Settle bounds how long the resume step waits to see the partition
	// applied on its new shard before the old rows go (0: it looks once).
	Settle time.Duration
	// After, when set, runs after each step done; an error stops the
	// move there, as a kill would (tests).
	After func(step string) error
	// Lease is how long the run holds the move's record without renewing
	// it (DefaultLease when 0); it renews it every third of that. A
	// second run while the lease is live is refused (ErrLeased); a run
	// after it ended unrenewed (the first was killed) takes over.
	Lease time.Duration
	// Owner names the run in the record and in a refusal (default: its
	// pid and host).
	Owner string
}

// record is the move's record, key shards.MoveKey(P): where from, where
// to, the epoch it started from (the new one is Epoch+1) and its state.
type record struct {
	From     string    `json:"from"`
	To       string    `json:"to"`
	Epoch    uint64    `json:"epoch"`
	State    string    `json:"state"` // moving, flipping, undoing
	FrozenAt time.Time `json:"frozen_at,omitzero"`
	FlipAt   time.Time `json:"flipped_at,omitzero"`
	// Owner and LeaseUntil are the lease of the run that holds the
	// record: none when Owner is empty or LeaseUntil has passed.
	Owner      string    `json:"owner,omitempty"`
	LeaseUntil time.Time `json:"lease_until,omitzero"`

	rev uint64
}

const (
	stateMoving   = "moving"
	stateFlipping = "flipping"
	stateUndoing  = "undoing"
)

// mover runs one move.
type mover struct {
	o    Options
	from *sql.DB
	to   *sql.DB

	// mu guards the record's writes, the lease's renewal among them:
	// rec.rev, rec.LeaseUntil and rec.Owner are read and written under
	// it, the other fields written under it.
	mu      sync.Mutex
	rec     record
	deleted bool // the record is gone: the move is done or undone
}

// Run moves (or undoes the move of) o.Partition; see the package comment.
func Run(ctx context.Context, o Options) error {
	if o.Partitions < 1 || o.Partition < 0 || o.Partition >= o.Partitions {
		return usageError(fmt.Sprintf("partition %d is not one of the request stream's %d (0 to %d)", o.Partition, o.Partitions, o.Partitions-1))
	}
	if !o.Undo {
		if _, ok := o.Pools[o.To]; !ok {
			return usageError(fmt.Sprintf("shard %q is not one of ALLOT_MYSQL_SHARDS (%v)", o.To, o.Pools.Names()))
		}
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	m := &mover{o: o}
	pl, err := shards.Get(ctx, o.KV, o.Partition)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return usageError(fmt.Sprintf("partition %d has no entry in the shard map: run `allotctl setup`, which seeds it", o.Partition))
	}
	if err != nil {
		return err
	}
	have, err := m.readRecord(ctx)
	if err != nil {
		return err
	}
	if have {
		if err := m.leased(time.Now()); err != nil {
			return err
		}
	}
	if o.Undo {
		if !have {
			return m.undo(ctx, pl, have)
		}
		if err := m.take(ctx, false); err != nil {
			return err
		}
		return m.holding(ctx, func(ctx context.Context) error { return m.undo(ctx, pl, have) })
	}
	if !have {
		if pl.Shard == o.To {
			return usageError(fmt.Sprintf("partition %d is on shard %s already", o.Partition, o.To))
		}
		m.rec = record{From: pl.Shard, To: o.To, Epoch: pl.Epoch, State: stateMoving}
	} else {
		switch {
		case m.rec.To != o.To:
			return usageError(fmt.Sprintf("partition %d is being moved from %s to %s: run the move with -to %s to finish it, or -undo", o.Partition, m.rec.From, m.rec.To, m.rec.To))
		case m.rec.State == stateUndoing:
			return usageError(fmt.Sprintf("the move of partition %d to %s is being undone: run it with -undo to finish the undo", o.Partition, m.rec.To))
		}
	}
	if err := m.take(ctx, !have); err != nil {
		return err
	}
	if have {
		fmt.Fprintf(o.Out, "resume  the move of partition %d from %s to %s (state %s)\n", o.Partition, m.rec.From, m.rec.To, m.rec.State)
	}
	return m.holding(ctx, func(ctx context.Context) error { return m.run(ctx, pl) })
}

// run moves the partition, the record created or taken over.
func (m *mover) run(ctx context.Context, pl shards.Placement) error {
	o := m.o
	var err error
	if m.from, err = m.pool(m.rec.From); err != nil {
		return err
	}
	if m.to, err = m.pool(m.rec.To); err != nil {
		return err
	}
	flipped := pl.Shard == m.rec.To && pl.Epoch == m.rec.Epoch+1
	if !flipped && (pl.Shard != m.rec.From || pl.Epoch != m.rec.Epoch) {
		return fmt.Errorf("the shard map puts partition %d on %s at epoch %d, not where its move started (%s at %d): someone else changed it; look, then delete key %s of bucket %s",
			o.Partition, pl.Shard, pl.Epoch, m.rec.From, m.rec.Epoch, shards.MoveKey(o.Partition), shards.Bucket)
	}
	if !flipped {
		if err := m.beforeFlip(ctx, pl); err != nil {
			return err
		}
	}
	return m.afterFlip(ctx)
}

// beforeFlip runs the steps up to the flip, each from where it stands.
func (m *mover) beforeFlip(ctx context.Context, pl shards.Placement) error {
	var (
		fence uint64
		src   map[string]sums
		ids   []int64
	)
	err := m.step(ctx, StepFreeze, func(ctx context.Context) (detail string, err error) {
		fence, detail, err = m.freeze(ctx)
		return detail, err
	})
	if err != nil {
		return err
	}
	if err := m.step(ctx, StepCopy, func(ctx context.Context) (detail string, err error) {
		src, ids, detail, err = m.copy(ctx)
		return detail, err
	}); err != nil {
		return err
	}
	if err := m.step(ctx, StepVerify, func(ctx context.Context) (string, error) {
		return m.verify(ctx, src, ids, fence)
	}); err != nil {
		return err
	}
	if err := m.step(ctx, StepFence, m.fence); err != nil {
		return err
	}
	return m.step(ctx, StepFlip, func(ctx context.Context) (string, error) { return m.flip(ctx, pl) })
}

// afterFlip waits for the allocators on the new shard and cleans the old.
func (m *mover) afterFlip(ctx context.Context) error {
	if err := m.step(ctx, StepResume, m.resume); err != nil {
		return err
	}
	if err := m.step(ctx, StepClean, m.clean); err != nil {
		return err
	}
	if !m.rec.FrozenAt.IsZero() && !m.rec.FlipAt.IsZero() {
		fmt.Fprintf(m.o.Out, "done    partition %d on %s at epoch %d; it was frozen for %s\n", m.o.Partition, m.rec.To, m.rec.Epoch+1,
			m.rec.FlipAt.Sub(m.rec.FrozenAt).Round(time.Millisecond))
	}
	return nil
}

// step runs one step, prints it with its time, and runs the After hook.
func (m *mover) step(ctx context.Context, name string, fn func(context.Context) (string, error)) error {
	start := time.Now()
	detail, err := fn(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	fmt.Fprintf(m.o.Out, "%-7s %s (%s)\n", name, detail, time.Since(start).Round(time.Millisecond))
	if m.o.After != nil {
		return m.o.After(name)
	}
	return nil
}

func (m *mover) pool(name string) (*sql.DB, error) {
	db, ok := m.o.Pools[name]
	if !ok {
		return nil, fmt.Errorf("shard %q of the move of partition %d is not one of ALLOT_MYSQL_SHARDS (%v): configure it", name, m.o.Partition, m.o.Pools.Names())
	}
	return db, nil
}

// freeze sets the partition's fence row on the old shard to no epoch,
// once the transaction in flight has committed (it waits for its row
// lock); no transaction of the partition commits there after it. It
// returns the fence the partition is frozen at.
func (m *mover) freeze(ctx context.Context) (uint64, string, error) {
	p, e := m.o.Partition, m.rec.Epoch
	if m.rec.FrozenAt.IsZero() {
		if err := m.updateRecord(ctx, func(r *record) { r.FrozenAt = time.Now().UTC() }); err != nil {
			return 0, "", err
		}
	}
	froze, err := store.SetEpoch(ctx, m.from, p, e, 0)
	if err != nil {
		return 0, "", err
	}
	at, err := store.PartitionEpoch(ctx, m.from, p)
	if errors.Is(err, store.ErrNoFence) && e == 1 {
		// Never applied there: a frozen row keeps an allocator from
		// starting it meanwhile.
		if _, err := m.from.ExecContext(ctx, "INSERT IGNORE INTO allocator_partition (partition_id, last_seq, epoch) VALUES (?, 0, NULL)", p); err != nil {
			return 0, "", fmt.Errorf("freeze partition %d: %w", p, err)
		}
		if _, err := store.SetEpoch(ctx, m.from, p, e, 0); err != nil {
			return 0, "", err
		}
		at, err = store.PartitionEpoch(ctx, m.from, p)
	}
	if err != nil {
		return 0, "", err
	}
	if at != 0 {
		return 0, "", fmt.Errorf("partition %d's fence row on %s is at epoch %d, the map's is %d: look at who raised it", p, m.rec.From, at, e)
	}
	var fence uint64
	if err := m.from.QueryRowContext(ctx, "SELECT last_seq FROM allocator_partition WHERE partition_id = ?", p).Scan(&fence); err != nil {
		return 0, "", fmt.Errorf("read partition %d's fence: %w", p, err)
	}
	how := "frozen"
	if !froze {
		how = "was frozen already"
	}
	return fence, fmt.Sprintf("partition %d %s on %s at fence %d (epoch %d)", p, how, m.rec.From, fence, e), nil
}

// copy copies the partition's rows from one consistent snapshot of the
// old shard to the new one, unless the new one holds an equal copy
// already (a move resumed after its copy); it returns the snapshot's
// counts and checksums per table and the partition's activities.
func (m *mover) copy(ctx context.Context) (map[string]sums, []int64, string, error) {
	// The columns first, outside the snapshot: the schema does not change
	// under a move, and the dictionary is read on plain connections.
	cols := map[string][]string{}
	for _, t := range tables {
		c, err := columns(ctx, m.from, t.name)
		if err != nil {
			return nil, nil, "", fmt.Errorf("shard %s: %w", m.rec.From, err)
		}
		dc, err := columns(ctx, m.to, t.name)
		if err != nil {
			return nil, nil, "", fmt.Errorf("shard %s: %w", m.rec.To, err)
		}
		if fmt.Sprint(c) != fmt.Sprint(dc) {
			return nil, nil, "", fmt.Errorf("table %s has columns %v on %s and %v on %s: run the same migrations on both (allocator -migrate-only)", t.name, c, m.rec.From, dc, m.rec.To)
		}
		cols[t.name] = c
	}
	tx, err := m.from.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return nil, nil, "", fmt.Errorf("begin a snapshot on %s: %w", m.rec.From, err)
	}
	defer tx.Rollback() //nolint:errcheck // read only
	// The first read fixes the snapshot.
	ids, err := activityIDs(ctx, tx, m.o.Partition, m.o.Partitions)
	if err != nil {
		return nil, nil, "", err
	}
	src := scope{p: m.o.Partition, partitions: m.o.Partitions, ids: ids}
	out := map[string]sums{}
	for _, t := range tables {
		if out[t.name], err = src.checksum(ctx, tx, t, cols[t.name]); err != nil {
			return nil, nil, "", err
		}
	}
	// Nothing below may run beside another move of the partition, nor
	// after its flip: the record and the map say neither happened.
	if err := m.updateRecord(ctx, nil); err != nil {
		return nil, nil, "", err
	}
	if pl, err := shards.Get(ctx, m.o.KV, m.o.Partition); err != nil || pl.Shard != m.rec.From || pl.Epoch != m.rec.Epoch {
		return nil, nil, "", fmt.Errorf("the shard map no longer puts partition %d on %s at epoch %d (%+v, %v): run the move again", m.o.Partition, m.rec.From, m.rec.Epoch, pl.Entry, err)
	}
	// A fence row the fence step wrote there goes back to frozen: the
	// copy compares, and is written, frozen.
	if _, err := store.SetEpoch(ctx, m.to, m.o.Partition, m.rec.Epoch+1, 0); err != nil {
		return nil, nil, "", err
	}
	if at, err := store.PartitionEpoch(ctx, m.to, m.o.Partition); err == nil && at != 0 {
		return nil, nil, "", fmt.Errorf("partition %d's fence row on %s is at epoch %d, live: not a copy of this move's; look before moving it there", m.o.Partition, m.rec.To, at)
	} else if err != nil && !errors.Is(err, store.ErrNoFence) {
		return nil, nil, "", err
	}
	dst, err := m.scopeOn(ctx, m.to, ids)
	if err != nil {
		return nil, nil, "", err
	}
	if same, _ := m.compare(ctx, dst, out); same {
		return out, ids, fmt.Sprintf("%s holds the copy already (%d activities)", m.rec.To, len(ids)), nil
	}
	if _, err := m.clear(ctx, m.to, dst, false); err != nil {
		return nil, nil, "", err
	}
	var rows int64
	for _, t := range tables {
		n, err := src.copyTable(ctx, tx, m.to, t, cols[t.name])
		if err != nil {
			return nil, nil, "", err
		}
		rows += n
	}
	return out, ids, fmt.Sprintf("%d rows of %d activities from %s to %s", rows, len(ids), m.rec.From, m.rec.To), nil
}

// scopeOn is the partition's rows on db: its activities there, and ids.
func (m *mover) scopeOn(ctx context.Context, db *sql.DB, ids []int64) (scope, error) {
	have, err := activityIDs(ctx, db, m.o.Partition, m.o.Partitions)
	if err != nil {
		return scope{}, err
	}
	seen := map[int64]bool{}
	var all []int64
	for _, id := range append(have, ids...) {
		if !seen[id] {
			seen[id] = true
			all = append(all, id)
		}
	}
	slices.Sort(all)
	return scope{p: m.o.Partition, partitions: m.o.Partitions, ids: all}, nil
}

// compare reports whether the rows of s on the new shard count and sum as
// want, and the first table that does not.
func (m *mover) compare(ctx context.Context, s scope, want map[string]sums) (bool, string) {
	for _, t := range tables {
		c, err := columns(ctx, m.to, t.name)
		if err != nil {
			return false, err.Error()
		}
		got, err := s.checksum(ctx, m.to, t, c)
		if err != nil {
			return false, err.Error()
		}
		if got != want[t.name] {
			return false, fmt.Sprintf("%s: %d rows (sum %s) on %s, %d rows (sum %s) in the snapshot of %s",
				t.name, got.Rows, got.Sum, m.rec.To, want[t.name].Rows, want[t.name].Sum, m.rec.From)
		}
	}
	return true, ""
}

// clear deletes the rows of s on db (but the fence row, with keepFence),
// the activity rows last (they name the activities of the rest), and
// returns how many.
func (m *mover) clear(ctx context.Context, db *sql.DB, s scope, keepFence bool) (int64, error) {
	var n int64
	for i := len(tables) - 1; i >= 0; i-- {
		t := tables[i]
		if t.name == "activity" || keepFence && t.name == "allocator_partition" {
			continue
		}
		k, err := s.clearTable(ctx, db, t)
		n += k
		if err != nil {
			return n, err
		}
	}
	k, err := s.clearTable(ctx, db, tables[2])
	return n + k, err
}

// verify checks the copy against the snapshot's counts and checksums,
// then audits the partition on the new shard: its activities, results,
// refusals, fence and checkpoints against the replay up to its own
// (frozen) fence. Any divergence fails the move before the flip.
func (m *mover) verify(ctx context.Context, src map[string]sums, ids []int64, fence uint64) (string, error) {
	dst, err := m.scopeOn(ctx, m.to, ids)
	if err != nil {
		return "", err
	}
	if same, why := m.compare(ctx, dst, src); !same {
		return "", fmt.Errorf("the copy on %s differs from %s: %s; run the move again (it copies anew) or -undo", m.rec.To, m.rec.From, why)
	}
	detail := fmt.Sprintf("%d tables equal in counts and checksums", len(tables))
	if len(ids) == 0 {
		return detail + "; no activity to audit", nil
	}
	cfg := audit.Config{Partitions: []int{m.o.Partition}}
	rep, err := audit.Run(ctx, cfg, audit.Deps{DB: m.to, JS: m.o.JS})
	if errors.Is(err, audit.ErrIncompleteStream) {
		cfg.FromCheckpoint = true
		rep, err = audit.Run(ctx, cfg, audit.Deps{DB: m.to, JS: m.o.JS})
	}
	if err != nil {
		return "", fmt.Errorf("audit of partition %d on %s: %w", m.o.Partition, m.rec.To, err)
	}
	if len(rep.Divergences) > 0 {
		d := rep.Divergences[0]
		return "", fmt.Errorf("the audit of partition %d on %s found %d divergence(s), the first %s of activity %d at seq %d: %s, want %s; nothing was flipped: -undo, then look",
			m.o.Partition, m.rec.To, len(rep.Divergences), d.Kind, d.ActivityID, d.Seq, d.Actual, d.Expected)
	}
	return detail + fmt.Sprintf("; audit of %d activities clean up to the fence %d", rep.ActivitiesChecked, fence), nil
}

// fence writes the partition's fence row on the new shard at the next
// epoch: the copy's row, frozen, takes it.
func (m *mover) fence(ctx context.Context) (string, error) {
	p, next := m.o.Partition, m.rec.Epoch+1
	if _, err := store.Thaw(ctx, m.to, p, next); err != nil {
		return "", err
	}
	at, err := store.PartitionEpoch(ctx, m.to, p)
	if err != nil {
		return "", err
	}
	if at != next {
		return "", fmt.Errorf("partition %d's fence row on %s is at epoch %d, not %d: run the move again (it copies anew) or -undo", p, m.rec.To, at, next)
	}
	return fmt.Sprintf("partition %d's fence row on %s at epoch %d", p, m.rec.To, next), nil
}

// flip puts the partition on the new shard at the next epoch in the map
// (compare-and-set from the revision read at the start). The record says
// flipping first: from then on the move is finished, never undone.
func (m *mover) flip(ctx context.Context, pl shards.Placement) (string, error) {
	if err := m.updateRecord(ctx, func(r *record) { r.State = stateFlipping }); err != nil {
		return "", err
	}
	next := shards.Entry{Shard: m.rec.To, Epoch: m.rec.Epoch + 1}
	if _, err := shards.Update(ctx, m.o.KV, m.o.Partition, next, pl.Revision); err != nil {
		return "", err
	}
	if err := m.updateRecord(ctx, func(r *record) { r.FlipAt = time.Now().UTC() }); err != nil {
		return "", err
	}
	return fmt.Sprintf("the map puts partition %d on %s at epoch %d", m.o.Partition, next.Shard, next.Epoch), nil
}

// resume waits, up to Settle, for the partition's fence on the new shard
// to pass where it was frozen: an allocator applies it there. An idle
// partition shows nothing; the allocators follow the map anyway.
func (m *mover) resume(ctx context.Context) (string, error) {
	p := m.o.Partition
	if m.rec.FlipAt.IsZero() { // flipped, but killed before it was recorded
		if err := m.updateRecord(ctx, func(r *record) { r.FlipAt = time.Now().UTC() }); err != nil {
			return "", err
		}
	}
	var from uint64
	if err := m.to.QueryRowContext(ctx, "SELECT last_seq FROM allocator_partition WHERE partition_id = ?", p).Scan(&from); err != nil {
		return "", fmt.Errorf("read partition %d's fence on %s: %w", p, m.rec.To, err)
	}
	settle := max(m.o.Settle, 0)
	deadline := time.Now().Add(settle)
	for {
		var at uint64
		err := m.to.QueryRowContext(ctx, "SELECT last_seq FROM allocator_partition WHERE partition_id = ?", p).Scan(&at)
		if err == nil && at > from {
			return fmt.Sprintf("partition %d applied on %s: fence %d → %d", p, m.rec.To, from, at), nil
		}
		if time.Now().After(deadline) {
			return fmt.Sprintf("partition %d on %s at fence %d: nothing applied there within %s (no request since the freeze?)", p, m.rec.To, from, settle), nil
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// clean deletes the partition's rows from the old shard but its fence
// row, which stays frozen (epoch NULL) and at 0, a tombstone: an allocator
// still routed there by a stale map finds no epoch to commit at and, its
// row being there, creates none (at epoch 1 it would, and apply the whole
// partition again there). Then the record goes: the move is done.
func (m *mover) clean(ctx context.Context) (string, error) {
	p := m.o.Partition
	if _, err := m.from.ExecContext(ctx, "INSERT INTO allocator_partition (partition_id, last_seq, epoch) VALUES (?, 0, NULL) "+
		"ON DUPLICATE KEY UPDATE last_seq = IF(epoch IS NULL, 0, last_seq)", p); err != nil {
		return "", fmt.Errorf("leave partition %d's fence tombstone on %s: %w", p, m.rec.From, err)
	}
	if at, err := store.PartitionEpoch(ctx, m.from, p); err != nil || at != 0 {
		return "", fmt.Errorf("partition %d's fence row on %s is not frozen (epoch %d, %v): look at who thawed it", p, m.rec.From, at, err)
	}
	s, err := m.scopeOn(ctx, m.from, nil)
	if err != nil {
		return "", err
	}
	n, err := m.clear(ctx, m.from, s, true)
	if err != nil {
		return "", err
	}
	if err := m.deleteRecord(ctx); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d rows of partition %d deleted from %s (its fence row stays there, frozen at 0)", n, p, m.rec.From), nil
}

// undo gives the partition back to its old shard before the flip: its
// fence row there thawed at its epoch, its rows on the new shard deleted,
// the record deleted.
func (m *mover) undo(ctx context.Context, pl shards.Placement, have bool) error {
	p := m.o.Partition
	if !have {
		db, err := m.pool(pl.Shard)
		if err != nil {
			return err
		}
		thawed, err := store.Thaw(ctx, db, p, pl.Epoch)
		if err != nil {
			return err
		}
		if thawed {
			fmt.Fprintf(m.o.Out, "%-7s partition %d thawed on %s at epoch %d\n", StepUndo, p, pl.Shard, pl.Epoch)
		} else {
			fmt.Fprintf(m.o.Out, "%-7s no move of partition %d to undo (on %s at epoch %d)\n", StepUndo, p, pl.Shard, pl.Epoch)
		}
		return nil
	}
	if pl.Shard == m.rec.To && pl.Epoch == m.rec.Epoch+1 || m.rec.State == stateFlipping {
		return usageError(fmt.Sprintf("the move of partition %d from %s to %s has flipped the map: run it again to finish it, then move it back with -to %s", p, m.rec.From, m.rec.To, m.rec.From))
	}
	if pl.Shard != m.rec.From || pl.Epoch != m.rec.Epoch {
		return fmt.Errorf("the shard map puts partition %d on %s at epoch %d, not where its move started (%s at %d): someone else changed it; look, then delete key %s of bucket %s",
			p, pl.Shard, pl.Epoch, m.rec.From, m.rec.Epoch, shards.MoveKey(p), shards.Bucket)
	}
	var err error
	if m.from, err = m.pool(m.rec.From); err != nil {
		return err
	}
	if m.to, err = m.pool(m.rec.To); err != nil {
		return err
	}
	return m.step(ctx, StepUndo, func(ctx context.Context) (string, error) {
		if err := m.updateRecord(ctx, func(r *record) { r.State = stateUndoing }); err != nil {
			return "", err
		}
		if _, err := store.Thaw(ctx, m.from, p, m.rec.Epoch); err != nil {
			return "", err
		}
		if at, err := store.PartitionEpoch(ctx, m.from, p); errors.Is(err, store.ErrNoFence) && m.rec.Epoch == 1 {
			// Never applied there, and not frozen yet: an allocator creates it.
		} else if err != nil || at != m.rec.Epoch {
			return "", fmt.Errorf("partition %d's fence row on %s is not at epoch %d after the thaw (%d, %v)", p, m.rec.From, m.rec.Epoch, at, err)
		}
		// The fence step may have set the copy's row: frozen again first.
		if _, err := store.SetEpoch(ctx, m.to, p, m.rec.Epoch+1, 0); err != nil {
			return "", err
		}
		s, err := m.scopeOn(ctx, m.to, nil)
		if err != nil {
			return "", err
		}
		n, err := m.clear(ctx, m.to, s, false)
		if err != nil {
			return "", err
		}
		if err := m.deleteRecord(ctx); err != nil {
			return "", err
		}
		frozen := ""
		if !m.rec.FrozenAt.IsZero() {
			frozen = fmt.Sprintf("; it was frozen for %s", time.Since(m.rec.FrozenAt).Round(time.Millisecond))
		}
		return fmt.Sprintf("partition %d back on %s at epoch %d, %d copied rows deleted from %s%s", p, m.rec.From, m.rec.Epoch, n, m.rec.To, frozen), nil
	})
}

// readRecord reads the move's record into m.rec; false when there is none.
func (m *mover) readRecord(ctx context.Context) (bool, error) {
	e, err := m.o.KV.Get(ctx, shards.MoveKey(m.o.Partition))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s %s: %w", shards.Bucket, shards.MoveKey(m.o.Partition), err)
	}
	m.rec = record{}
	if err := json.Unmarshal(e.Value(), &m.rec); err != nil || m.rec.From == "" || m.rec.To == "" {
		return false, fmt.Errorf("bucket %s key %s holds %q, not a move record: delete it", shards.Bucket, shards.MoveKey(m.o.Partition), e.Value())
	}
	m.rec.rev = e.Revision()
	return true, nil
}

// errRecordChanged is a compare-and-set of the record that lost.
func (m *mover) errRecordChanged(err error) error {
	return fmt.Errorf("the record of partition %d's move changed meanwhile (another allotctl moving it?): run the move again once that one has stopped: %w", m.o.Partition, err)
}

func (m *mover) createRecord(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, _ := json.Marshal(m.rec)
	rev, err := m.o.KV.Create(ctx, shards.MoveKey(m.o.Partition), v)
	if err != nil {
		return m.errRecordChanged(err)
	}
	m.rec.rev = rev
	return nil
}

// updateRecord changes the record with change (nil: as it is, which
// checks that no other run changed it) by compare-and-set; it renews the
// lease while at it.
func (m *mover) updateRecord(ctx context.Context, change func(*record)) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.rec
	if change != nil {
		change(&m.rec)
	}
	if m.rec.Owner != "" {
		m.rec.LeaseUntil = time.Now().Add(m.lease()).UTC()
	}
	if err := m.writeLocked(ctx); err != nil {
		m.rec = old
		return m.errRecordChanged(err)
	}
	return nil
}

// writeLocked writes the record from the revision it was read or last
// written at; m.mu is held.
func (m *mover) writeLocked(ctx context.Context) error {
	v, _ := json.Marshal(m.rec)
	rev, err := m.o.KV.Update(ctx, shards.MoveKey(m.o.Partition), v, m.rec.rev)
	if err != nil {
		return err
	}
	m.rec.rev = rev
	return nil
}

func (m *mover) deleteRecord(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	err := m.o.KV.Delete(ctx, shards.MoveKey(m.o.Partition), jetstream.LastRevision(m.rec.rev))
	if err != nil {
		return m.errRecordChanged(err)
	}
	m.deleted = true
	return nil
}
