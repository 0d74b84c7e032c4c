package waitlist

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/sync/singleflight"

	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// Positions reads signups as store.GetSignup does, with what a position read
// needs from the line ahead cached per activity.
//
// A waiter's position is the number of WAITING signups with a lower
// queue_seq, plus one. A join only ever appends at the end of the line (its
// queue_seq is the activity's highest) and a new bucket only ever starts
// there, so positions, and the counts of the buckets ahead of a waiter,
// change only when waiters leave the line. The allocator bumps the
// activity's waitlist_version in the transaction of every batch in which
// one left (or the buckets were rebuilt). So, read at version v:
//
//   - a bucket's prefix (the waiters in the buckets before it) holds for
//     as long as the version is v: one table of prefixes per activity,
//     loaded in one statement with its version;
//   - a waiter's position holds too: kept per user with v and its
//     queue_seq.
//
// A read takes the user's signup row, the activity's version and where
// the user's bucket starts in one statement (key reads, one snapshot).
// When the cached position has that version it is the answer; else the
// user's rank within its bucket is read with the version again in one
// statement (at most BucketSize index entries),
// and added to the cached prefix of that bucket at that version (loaded
// once per version, by one read at a time per activity). A version that
// moved between the statements starts the read over. Every answer is
// therefore exact for a snapshot taken after the read began: a client
// that saw a write's result and then reads sees that write.
type Positions struct {
	db       store.DBTX
	prefixes *lru.Cache[int64, *prefixTable]
	users    *lru.Cache[[2]int64, userPosition]
	loads    singleflight.Group
}

// prefixTable is an activity's bucket prefixes at one waitlist_version.
type prefixTable struct {
	version  int64
	firsts   []uint64  // the buckets' first_seqs, in order
	prefixes []int64   // waiters in the buckets before firsts[i]
	loaded   time.Time // when the statement had been answered
}

type userPosition struct {
	version  int64
	queueSeq uint64
	position int64
}

// Bounds of a Positions' caches: a prefix table is about 16 bytes per
// 1,024 waiters, a position about 64 bytes.
const (
	PositionActivities = 1024
	PositionUsers      = 1 << 16
)

// NewPositions reads through db, caching the prefixes of up to
// PositionActivities activities and the positions of up to PositionUsers
// waiters, the least recently read evicted first.
func NewPositions(db store.DBTX) *Positions {
	p := &Positions{db: db}
	p.prefixes, _ = lru.New[int64, *prefixTable](PositionActivities) // errs only for a size below 1
	p.users, _ = lru.New[[2]int64, userPosition](PositionUsers)
	return p
}

// errMoved means the version moved between a read's statements.
var errMoved = errors.New("waitlist moved")

// Get reads user's signup in activity, as store.GetSignup.
func (p *Positions) Get(ctx context.Context, activity, user int64) (store.SignupState, bool, error) {
	for range 8 {
		s, found, err := p.get(ctx, activity, user)
		if !errors.Is(err, errMoved) {
			return s, found, err
		}
	}
	// Waiters kept leaving under the reads: read without the cache.
	return store.GetSignup(ctx, p.db, activity, user)
}

func (p *Positions) get(ctx context.Context, activity, user int64) (store.SignupState, bool, error) {
	s := store.SignupState{ActivityID: activity, UserID: user}
	var (
		until   sql.NullTime
		seq     uint64
		version sql.NullInt64
		first   sql.NullInt64
		start   = time.Now()
	)
	// The signup, the activity's version and the user's bucket (the last
	// one starting at or before its queue_seq): one snapshot, primary-key
	// and unique-key reads only.
	err := p.db.QueryRowContext(ctx,
		"SELECT s.status, s.held_until, s.queue_seq, a.waitlist_version, (SELECT MAX(b.first_seq) FROM waitlist_bucket b "+
			"WHERE b.activity_id = s.activity_id AND b.first_seq <= s.queue_seq) FROM activity_signup s "+
			"LEFT JOIN activity a ON a.id = s.activity_id WHERE s.activity_id = ? AND s.user_id = ?", activity, user).
		Scan(&s.Status, &until, &seq, &version, &first)
	if errors.Is(err, sql.ErrNoRows) {
		return s, false, nil
	}
	if err != nil {
		return s, false, fmt.Errorf("get signup %d/%d: %w", activity, user, err)
	}
	if until.Valid {
		t := until.Time.UTC()
		s.HeldUntil = &t
	}
	if s.Status != wire.StatusWaiting {
		return s, true, nil
	}
	if !version.Valid {
		return store.GetSignup(ctx, p.db, activity, user) // a signup without its activity row
	}
	if t, ok := p.prefixes.Peek(activity); ok && t.version > version.Int64 && start.After(t.loaded) {
		// The version went back (the row was written by hand: a read
		// that began after the table was loaded sees at least its
		// version otherwise). What was cached at the versions above may
		// come round again with other counts, so none of it is kept.
		p.prefixes.Remove(activity)
		p.users.Purge()
	}
	key := [2]int64{activity, user}
	if c, ok := p.users.Get(key); ok && c.version == version.Int64 && c.queueSeq == seq {
		pos := c.position
		s.Position = &pos
		return s, true, nil
	}
	if !first.Valid {
		// No bucket covers the waiter: rows written without them. The
		// audit and the invariants report it; the answer stays exact.
		return store.GetSignupByCount(ctx, p.db, activity, user)
	}
	// The user's rank in its bucket, with the version again: equal
	// versions mean no waiter left in between, so the user still waits at
	// seq and its bucket still starts at first (only departures move
	// bucket bounds).
	var v2, rank int64
	err = p.db.QueryRowContext(ctx,
		"SELECT a.waitlist_version, (SELECT COUNT(*) FROM activity_signup w WHERE w.activity_id = a.id "+
			"AND w.status = 'WAITING' AND w.queue_seq >= ? AND w.queue_seq <= ?) FROM activity a WHERE a.id = ?",
		first.Int64, seq, activity).Scan(&v2, &rank)
	if err != nil {
		return s, false, fmt.Errorf("get position %d/%d: %w", activity, user, err)
	}
	if v2 != version.Int64 {
		return s, false, errMoved
	}
	ahead, err := p.prefix(ctx, activity, v2, uint64(first.Int64))
	if err != nil {
		return s, false, err
	}
	pos := ahead + rank
	p.users.Add(key, userPosition{version: v2, queueSeq: seq, position: pos})
	s.Position = &pos
	return s, true, nil
}

// prefix returns the number of waiters in activity's buckets before the
// one starting at first, at waitlist_version version: from the cached
// table when it has that version and that bucket (a bucket started by
// joins since it was loaded is not in it), else from a new table.
func (p *Positions) prefix(ctx context.Context, activity, version int64, first uint64) (int64, error) {
	for range 2 {
		t, ok := p.prefixes.Get(activity)
		if !ok || t.version < version || t.version == version && (len(t.firsts) == 0 || first > t.firsts[len(t.firsts)-1]) {
			var err error
			if t, err = p.load(ctx, activity); err != nil {
				return 0, err
			}
		}
		if t.version != version {
			return 0, errMoved // the line moved on since the reads
		}
		if i, found := slices.BinarySearch(t.firsts, first); found {
			return t.prefixes[i], nil
		}
		// The table predates the bucket (loaded by a read that began
		// before it started): load again.
		p.prefixes.Remove(activity)
	}
	return 0, errMoved
}

// load reads activity's buckets and version in one statement, one load
// at a time per activity (concurrent readers share it).
func (p *Positions) load(ctx context.Context, activity int64) (*prefixTable, error) {
	ch := p.loads.DoChan(strconv.FormatInt(activity, 10), func() (any, error) {
		// Not the first caller's context: one reader leaving must not
		// fail the others' load.
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), loadTimeout(ctx))
		defer cancel()
		rows, err := p.db.QueryContext(lctx, "SELECT a.waitlist_version, b.first_seq, b.waiting FROM activity a "+
			"LEFT JOIN waitlist_bucket b ON b.activity_id = a.id WHERE a.id = ? ORDER BY b.first_seq", activity)
		if err != nil {
			return nil, fmt.Errorf("waitlist prefixes of %d: %w", activity, err)
		}
		defer rows.Close()
		t := &prefixTable{}
		var sum int64
		for rows.Next() {
			var (
				first, waiting sql.NullInt64
			)
			if err := rows.Scan(&t.version, &first, &waiting); err != nil {
				return nil, fmt.Errorf("waitlist prefixes of %d: %w", activity, err)
			}
			if first.Valid {
				t.firsts = append(t.firsts, uint64(first.Int64))
				t.prefixes = append(t.prefixes, sum)
				sum += waiting.Int64
			}
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("waitlist prefixes of %d: %w", activity, err)
		}
		t.loaded = time.Now()
		if old, ok := p.prefixes.Get(activity); !ok || old.version <= t.version {
			p.prefixes.Add(activity, t)
		}
		return t, nil
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
		return r.Val.(*prefixTable), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// loadTimeout bounds a shared load by the first caller's deadline, or 5 s.
func loadTimeout(ctx context.Context) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return time.Until(dl)
	}
	return 5 * time.Second
}
