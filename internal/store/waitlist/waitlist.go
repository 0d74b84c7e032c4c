// Package waitlist keeps the waitlist index of the store: an activity's
// waiters cut into buckets (waitlist_bucket rows), which the allocator
// writes in the transaction of its signups, and the cached position reads
// that use them (Positions).
package waitlist

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// BucketSize bounds the waiters of one waitlist bucket.
//
// An activity's waitlist is cut into buckets: runs of consecutive waiters
// (in queue_seq order), each a waitlist_bucket row (activity_id, first_seq,
// waiting) that covers the queue_seqs from its first_seq up to the next
// bucket's. A waiter's position is the sum of the counts of the buckets
// before its own plus its rank within its own bucket (a range scan of at
// most BucketSize WAITING rows), so no read walks the line ahead of it. The
// allocator keeps the rows in the same transaction as the signups:
//
//   - a join appends to the last bucket while it has fewer than BucketSize
//     waiters, else starts a new bucket at its queue_seq (always the
//     highest of the activity);
//   - a waiter that leaves (promoted, cancelled) takes one off its bucket;
//     an emptied bucket is deleted, and two neighbours that fit in one
//     bucket are merged, so any two neighbours hold more than BucketSize
//     waiters and an activity with n waiters has at most 2n/BucketSize+1
//     buckets, whatever order they leave in.
//
// A position read therefore costs at most 2n/BucketSize+1 bucket rows plus
// BucketSize signup rows: about 2,000 + 1,024 for a million waiters.
const BucketSize = 1024

// Bucket is one waitlist_bucket row of an activity.
type Bucket struct {
	FirstSeq uint64
	Waiting  int64
}

// Waitlist is an activity's buckets, as the allocator maintains them
// between loads: the changes since the last Flush are written by it.
type Waitlist struct {
	b     []Bucket // by FirstSeq
	dirty map[uint64]bool
	// rewrite is set when every row of the activity is to be replaced
	// (the buckets were rebuilt from the signups).
	rewrite bool
	// departed is set when a waiter left since the last Flush (or the
	// buckets were rebuilt): the flush bumps the activity's
	// waitlist_version, which tells position caches that the counts ahead
	// of some waiters changed (a join, at the end, changes none).
	departed bool
	// max is the bucket size; 0: BucketSize (tests choose smaller ones, to
	// see many buckets in short lines).
	max int64
}

// New is the empty waitlist of a new activity, with buckets of
// size waiters at most (0: BucketSize).
func New(size int64) *Waitlist { return &Waitlist{max: size} }

// Of is the waitlist of buckets bs (in order), as read.
func Of(bs []Bucket) *Waitlist { return &Waitlist{b: slices.Clone(bs)} }

// Buckets returns a copy of the buckets, in order.
func (w *Waitlist) Buckets() []Bucket { return slices.Clone(w.b) }

// Waiting is the number of waiters in all buckets.
func (w *Waitlist) Waiting() int64 {
	var n int64
	for _, b := range w.b {
		n += b.Waiting
	}
	return n
}

func (w *Waitlist) touch(seq uint64) {
	if w.dirty == nil {
		w.dirty = make(map[uint64]bool)
	}
	w.dirty[seq] = true
}

// ErrOrder means a waitlist change does not fit the buckets: a join
// below the last bucket, or a waiter that leaves from before the first.
// The caller rebuilds the buckets from the signups.
var ErrOrder = errors.New("waitlist buckets do not fit the change")

// Join adds the waiter at queue_seq seq, which must be above every
// queue_seq of the activity.
func (w *Waitlist) Join(seq uint64) error {
	n := len(w.b)
	switch {
	case n > 0 && seq <= w.b[n-1].FirstSeq:
		return fmt.Errorf("%w: join at %d, last bucket starts at %d", ErrOrder, seq, w.b[n-1].FirstSeq)
	case n > 0 && w.b[n-1].Waiting < w.size():
		w.b[n-1].Waiting++
		w.touch(w.b[n-1].FirstSeq)
	default:
		w.b = append(w.b, Bucket{FirstSeq: seq, Waiting: 1})
		w.touch(seq)
	}
	return nil
}

// Leave takes the waiter at queue_seq seq off its bucket.
func (w *Waitlist) Leave(seq uint64) error {
	i, found := slices.BinarySearchFunc(w.b, seq, func(b Bucket, s uint64) int { return cmp.Compare(b.FirstSeq, s) })
	if !found {
		i-- // the bucket starting before seq
	}
	if i < 0 || w.b[i].Waiting <= 0 {
		return fmt.Errorf("%w: no bucket holds a waiter at %d", ErrOrder, seq)
	}
	w.b[i].Waiting--
	w.touch(w.b[i].FirstSeq)
	w.departed = true
	// Every pair of neighbours held more than a bucket's worth before;
	// only the pairs around bucket i may not any more.
	if w.b[i].Waiting == 0 {
		w.b = slices.Delete(w.b, i, i+1)
		w.merge(i - 1) // the neighbours that met
		return nil
	}
	w.merge(i)     // bucket i and the one after it
	w.merge(i - 1) // the one before it and bucket i
	return nil
}

// merge merges bucket i+1 into bucket i when both fit in one.
func (w *Waitlist) merge(i int) {
	if i < 0 || i+1 >= len(w.b) || w.b[i].Waiting+w.b[i+1].Waiting > w.size() {
		return
	}
	w.b[i].Waiting += w.b[i+1].Waiting
	w.touch(w.b[i].FirstSeq)
	w.touch(w.b[i+1].FirstSeq)
	w.b = slices.Delete(w.b, i+1, i+2)
}

func (w *Waitlist) size() int64 {
	if w.max > 0 {
		return w.max
	}
	return BucketSize
}

// Build cuts waiters (queue_seqs in any order) into full buckets
// of size (0: BucketSize): what the migration's backfill and a repair
// write.
func Build(waiters []uint64, size int64) *Waitlist {
	seqs := slices.Clone(waiters)
	slices.Sort(seqs)
	w := &Waitlist{rewrite: true, max: size}
	n := int(w.size())
	for lo := 0; lo < len(seqs); lo += n {
		hi := min(lo+n, len(seqs))
		w.b = append(w.b, Bucket{FirstSeq: seqs[lo], Waiting: int64(hi - lo)})
	}
	return w
}

// Fits reports whether the buckets describe exactly waiters (queue_seqs in
// any order): every waiter in a bucket, each bucket's count right and
// within 1..BucketSize.
func (w *Waitlist) Fits(waiters []uint64) bool {
	seqs := slices.Clone(waiters)
	slices.Sort(seqs)
	j := 0
	for i, b := range w.b {
		if b.Waiting < 1 || b.Waiting > w.size() || (i > 0 && b.FirstSeq <= w.b[i-1].FirstSeq) {
			return false
		}
		if j < len(seqs) && seqs[j] < b.FirstSeq {
			return false // a waiter before this bucket, in none
		}
		var n int64
		for j < len(seqs) && (i+1 == len(w.b) || seqs[j] < w.b[i+1].FirstSeq) {
			n++
			j++
		}
		if n != b.Waiting {
			return false
		}
	}
	return j == len(seqs)
}

// Load reads activity's buckets, of size at most (0: BucketSize).
func Load(ctx context.Context, q store.DBTX, activity int64, size int64) (*Waitlist, error) {
	rows, err := q.QueryContext(ctx, "SELECT first_seq, waiting FROM waitlist_bucket WHERE activity_id = ? ORDER BY first_seq", activity)
	if err != nil {
		return nil, fmt.Errorf("waitlist buckets of %d: %w", activity, err)
	}
	defer rows.Close()
	w := &Waitlist{max: size}
	for rows.Next() {
		var b Bucket
		if err := rows.Scan(&b.FirstSeq, &b.Waiting); err != nil {
			return nil, fmt.Errorf("waitlist buckets of %d: %w", activity, err)
		}
		w.b = append(w.b, b)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("waitlist buckets of %d: %w", activity, err)
	}
	return w, nil
}

// Flush writes activity's bucket changes since the last flush.
func Flush(ctx context.Context, tx *sql.Tx, activity int64, w *Waitlist) error {
	return FlushAll(ctx, tx, map[int64]*Waitlist{activity: w})
}

// FlushAll writes the bucket changes of many activities since their
// last flush, in a few statements for all of them (a batch over a
// thousand activities must not cost a thousand statements).
func FlushAll(ctx context.Context, tx *sql.Tx, waits map[int64]*Waitlist) error {
	type row struct {
		activity int64
		b        Bucket
	}
	var (
		rewrite []any
		bump    []any // activities whose waitlist_version goes up
		put     []row
		gone    []any // activity, first_seq pairs
	)
	for _, id := range slices.Sorted(maps.Keys(waits)) {
		w := waits[id]
		if w == nil || (!w.rewrite && len(w.dirty) == 0) {
			continue
		}
		if w.rewrite || w.departed {
			bump = append(bump, id)
		}
		if w.rewrite {
			rewrite = append(rewrite, id)
			for _, b := range w.b {
				put = append(put, row{id, b})
			}
			continue
		}
		for _, seq := range slices.Sorted(maps.Keys(w.dirty)) {
			if i, ok := slices.BinarySearchFunc(w.b, seq, func(b Bucket, s uint64) int { return cmp.Compare(b.FirstSeq, s) }); ok {
				put = append(put, row{id, w.b[i]})
			} else {
				gone = append(gone, id, seq)
			}
		}
	}
	if err := store.ExecChunks(ctx, tx, "DELETE FROM waitlist_bucket WHERE activity_id IN (", ")", 1, rewrite); err != nil {
		return fmt.Errorf("rewrite waitlist buckets: %w", err)
	}
	if err := store.ExecChunks(ctx, tx, "DELETE FROM waitlist_bucket WHERE (activity_id, first_seq) IN (", ")", 2, gone); err != nil {
		return fmt.Errorf("delete waitlist buckets: %w", err)
	}
	if err := store.ExecChunks(ctx, tx, "UPDATE activity SET waitlist_version = waitlist_version + 1 WHERE id IN (", ")", 1, bump); err != nil {
		return fmt.Errorf("bump waitlist versions: %w", err)
	}
	err := store.InsertRows(ctx, tx, "INSERT INTO waitlist_bucket (activity_id, first_seq, waiting) VALUES ",
		" ON DUPLICATE KEY UPDATE waiting = VALUES(waiting)", 3, len(put), func(i int, args []any) []any {
			return append(args, put[i].activity, put[i].b.FirstSeq, put[i].b.Waiting)
		})
	if err != nil {
		return err
	}
	for _, w := range waits {
		if w != nil {
			w.dirty, w.rewrite, w.departed = nil, false, false
		}
	}
	return nil
}

// Rebuild recomputes activity's buckets and waiting_count from its
// WAITING rows: for rows written by hand (tests, repairs). The allocator
// repairs buckets that do not fit by itself when it loads an activity.
func Rebuild(ctx context.Context, db *sql.DB, activity int64) error {
	return store.WithTx(ctx, db, store.TxOptions{}, func(tx *sql.Tx) error {
		live, err := store.LiveSignups(ctx, tx, activity)
		if err != nil {
			return err
		}
		var seqs []uint64
		for _, s := range live {
			if s.Status == wire.StatusWaiting {
				seqs = append(seqs, s.QueueSeq)
			}
		}
		if _, err := tx.ExecContext(ctx, "UPDATE activity SET waiting_count = ? WHERE id = ?", len(seqs), activity); err != nil {
			return fmt.Errorf("rebuild waitlist of %d: %w", activity, err)
		}
		return Flush(ctx, tx, activity, Build(seqs, 0))
	})
}
