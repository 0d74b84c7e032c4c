package ui

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// State is the data of a "state" message: the activity's public state, as
// GET /v1/activities/{activity} answers it, plus what an operator needs to
// judge the allocator's progress.
type State struct {
	ActivityID int64 `json:"activity_id"`
	// Opened is false while the activity was never opened; the counters
	// are then zero.
	Opened    bool  `json:"opened"`
	Capacity  int64 `json:"capacity"`
	Confirmed int64 `json:"confirmed"` // seats taken, held ones included
	// Held counts the seats held, not yet confirmed (activities with a
	// hold); Hold is the activity's hold as a Go duration, "" without.
	Held      int64  `json:"held"`
	Hold      string `json:"hold,omitempty"`
	Waiting   int64  `json:"waiting"`
	Remaining int64  `json:"remaining"`
	// AppliedSeq is the request-stream sequence of the message of the last
	// request the allocator applied to the activity (activity.next_seq − 1
	// is its place); 0 if none.
	AppliedSeq uint64 `json:"applied_seq"`
	// StoredSeq is the request-stream sequence of the newest request stored
	// for the activity (0 if none); null when the stream could not be read.
	StoredSeq *uint64 `json:"stored_seq"`
	// Lag is StoredSeq − AppliedSeq when positive, else 0: how many stream
	// sequences (of every activity on the partition) the allocator still has
	// to get through before it has applied everything stored for this
	// activity. Null when unknown (stream unreadable, activity not opened).
	Lag *uint64 `json:"lag"`
	// Partition is the state of the allocator that applies the activity's
	// partition; null when the broker could not tell.
	Partition *Partition `json:"partition"`
	// Shard is the MySQL shard that holds the activity ("" with one
	// database), and Shards every shard with whether it answers (absent
	// with one database).
	Shard  string       `json:"shard,omitempty"`
	Shards []ShardState `json:"shards,omitempty"`
	// At is when the reads behind this snapshot began.
	At time.Time `json:"at"`
	// Skipped counts the events this stream dropped because its client read
	// slower than they came; the counters above stay exact regardless.
	Skipped uint64 `json:"skipped"`
}

// Partition is what the page shows of the allocator applying a partition,
// as the partition's consumer tells it: whether it makes progress.
type Partition struct {
	ID int `json:"id"`
	// Waiting counts the partition's requests stored and not acknowledged
	// yet (every activity of the partition).
	Waiting uint64 `json:"waiting"`
	// LastApplied is when the allocator last acknowledged a request of the
	// partition; null if never.
	LastApplied *time.Time `json:"last_applied"`
	// PinnedSince is when the partition was pinned to the allocator that
	// holds it now (a takeover resets it); null while pinned to none.
	PinnedSince *time.Time `json:"pinned_since"`
	// Stalled is set while requests wait and none was acknowledged for
	// StalledAfter: the allocator holding the partition makes no progress
	// (it gives the partition up to a peer after ALLOT_STALL_TIMEOUT).
	Stalled bool `json:"stalled"`
}

// StalledAfter is how long a partition may go without an acknowledged
// request while requests wait before the page calls it stalled.
const StalledAfter = 10 * time.Second

// snapshots shares state reads between the streams of one activity: a
// hundred pages watching a launch cost a few reads per second, not hundreds.
type snapshots struct {
	mu sync.Mutex
	m  map[int64]*snapEntry
}

type snapEntry struct {
	refs int // guarded by snapshots.mu

	mu      sync.Mutex // one read at a time per activity
	ok      bool
	started time.Time // when the reads of st began
	st      State
}

func (c *snapshots) acquire(activity int64) *snapEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[activity]
	if e == nil {
		e = &snapEntry{}
		c.m[activity] = e
	}
	e.refs++
	return e
}

func (c *snapshots) release(activity int64, e *snapEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.refs--; e.refs == 0 {
		delete(c.m, activity)
	}
}

// snapshot returns activity's state read no earlier than notBefore, and
// when that read began: the shared one if it is recent enough, else a
// fresh read.
func (s *Server) snapshot(ctx context.Context, e *snapEntry, activity int64, notBefore time.Time) (State, time.Time, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ok && !e.started.Before(notBefore) {
		return e.st, e.started, nil
	}
	start := time.Now()
	st, err := s.readState(ctx, activity, start)
	if err != nil {
		return State{}, time.Time{}, err
	}
	e.st, e.started, e.ok = st, start, true
	return st, start, nil
}

// readState reads the request stream first and MySQL second, so that the
// lag can only be understated by requests stored in between, never
// overstated by requests applied in between.
func (s *Server) readState(ctx context.Context, activity int64, start time.Time) (State, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	st := State{ActivityID: activity, At: start.UTC()}
	stored, storedErr := s.lastStored(ctx, activity)
	if storedErr == nil {
		st.StoredSeq = &stored
	} else if ctx.Err() == nil {
		s.cfg.Log.DebugContext(ctx, "live: read the last stored request",
			slog.Int64("activity_id", activity), slog.Any("err", storedErr))
	}
	if p, err := s.partition(ctx, activity, start); err == nil {
		st.Partition = p
	} else if ctx.Err() == nil {
		s.cfg.Log.DebugContext(ctx, "live: read the partition's consumer",
			slog.Int64("activity_id", activity), slog.Any("err", err))
	}
	db := s.cfg.DB
	if s.cfg.Route != nil {
		sh, err := s.cfg.Route(activity)
		if err != nil {
			return st, &ShardError{Err: err}
		}
		db, st.Shard = sh.DB, sh.Name
		if s.cfg.Shards != nil {
			st.Shards = s.cfg.Shards(ctx)
		}
	}
	as, found, err := store.GetActivity(ctx, db, activity)
	if err != nil {
		return st, s.shardErr(st.Shard, err)
	}
	if !found {
		return st, nil // no lag: requests for it are never applied to a row
	}
	row, found, err := store.GetActivityRow(ctx, db, activity)
	if err != nil {
		return st, s.shardErr(st.Shard, err)
	}
	st.Opened = true
	st.Capacity, st.Confirmed, st.Waiting, st.Remaining = as.Capacity, as.Confirmed, as.Waiting, as.Remaining
	st.Held, st.Hold = as.Held, as.Hold
	if found && row.NextSeq > 0 {
		// next_seq is the place after the last request applied.
		st.AppliedSeq = wire.SeqOf(row.NextSeq - 1)
	}
	if st.StoredSeq != nil {
		lag := uint64(0)
		if stored > st.AppliedSeq {
			lag = stored - st.AppliedSeq
		}
		st.Lag = &lag
	}
	return st, nil
}

// shardErr is err of a read on shard, named when shards are shown.
func (s *Server) shardErr(shard string, err error) error {
	if s.cfg.Shards == nil {
		return err
	}
	return &ShardError{Shard: shard, Err: err}
}

// lastStored is the stream sequence of the newest request stored for
// activity in ALLOT_REQUESTS, 0 if none: one direct get of the last message
// on the activity's stored subject.
func (s *Server) lastStored(ctx context.Context, activity int64) (uint64, error) {
	stream, parts, err := s.requestStream(ctx)
	if err != nil {
		return 0, err
	}
	msg, err := stream.GetLastMsgForSubject(ctx, bus.StoredSubject(activity, parts))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("last request of activity %d: %w", activity, err)
	}
	return msg.Sequence, nil
}

// partition reads the consumer of activity's partition.
func (s *Server) partition(ctx context.Context, activity int64, now time.Time) (*Partition, error) {
	stream, parts, err := s.requestStream(ctx)
	if err != nil {
		return nil, err
	}
	p := bus.PartitionOf(activity, parts)
	cons, err := stream.Consumer(ctx, bus.AllocatorConsumer(p))
	if err != nil {
		return nil, fmt.Errorf("consumer of partition %d: %w", p, err)
	}
	info := cons.CachedInfo()
	out := &Partition{ID: p, Waiting: info.NumPending + uint64(info.NumAckPending), LastApplied: info.AckFloor.Last}
	for _, g := range info.PriorityGroups {
		if g.Group == bus.PriorityGroup && g.PinnedClientID != "" && !g.PinnedTS.IsZero() {
			ts := g.PinnedTS
			out.PinnedSince = &ts
		}
	}
	// Progress is judged from the last ack, or from the pin when that is
	// later: a new holder had no chance to apply before it.
	since := out.LastApplied
	if out.PinnedSince != nil && (since == nil || out.PinnedSince.After(*since)) {
		since = out.PinnedSince
	}
	out.Stalled = out.Waiting > 0 && (since == nil || now.Sub(*since) >= StalledAfter)
	return out, nil
}

// requestStream looks ALLOT_REQUESTS up once: its partitions never change
// under a running system (bus.ErrPartitionsChanged).
func (s *Server) requestStream(ctx context.Context) (jetstream.Stream, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reqStream != nil {
		return s.reqStream, s.parts, nil
	}
	stream, err := s.cfg.JS.Stream(ctx, wire.RequestStream)
	if err != nil {
		return nil, 0, fmt.Errorf("look up %s: %w", wire.RequestStream, err)
	}
	s.reqStream, s.parts = stream, max(bus.PartitionsOf(stream.CachedInfo().Config), 1)
	return s.reqStream, s.parts, nil
}
