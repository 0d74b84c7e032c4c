package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/shards/move"
	"github.com/allot-dev/allot/internal/wire"
)

// MoveConfig describes the measurement of one partition's move between
// shards (package move, as `allotctl shards move` runs it) while the other
// partitions drain a backlog.
type MoveConfig struct {
	Partitions int    // of the request stream, at least 2
	Partition  int    // the partition moved
	To         string // the shard it is moved to
	// Activities: the moved partition's of 1 to Activities, of Capacity
	// seats, are opened first; each drain (and the warm-up) opens the
	// other partitions' of the next Activities ids.
	Activities int
	Capacity   int64
	// Signups joins, each of a user of its own, spread over the moved
	// partition's activities, are applied before anything else: its
	// signups at the move.
	Signups int
	// Requests joins spread over the other partitions' activities make
	// each of the drains without a move, before it and after it;
	// DuringRequests the drain with the move (enough to outlast it).
	Requests, DuringRequests int
	// Waiting joins to the moved partition's activities are published
	// once it is frozen: they wait in the stream, and are applied on its
	// new shard after the flip (the move's resume step sees them there).
	Waiting int
	Batch   int // requests of one activity per message, as in DrainConfig
	// Allocator is the allocators' configuration (the zero Config: the
	// defaults).
	Allocator allocator.Config
	// Settle bounds the move's resume step (move.Options.Settle; 0: 10s).
	Settle time.Duration
	// Progress, when set, gets a line at the end of each phase.
	Progress io.Writer
}

// MoveStep is one step of the move as its report printed it.
type MoveStep struct {
	Name   string
	Detail string
	Took   time.Duration
}

// MoveResult is what a move measured, and what was checked after it.
type MoveResult struct {
	Partition int
	From, To  string
	// Signups are the moved partition's signup rows (activity_signup) on
	// its shard before the move's drain started.
	Signups int64
	Steps   []MoveStep
	Frozen  time.Duration // the move's own figure: from the freeze to the flip
	Took    time.Duration // the whole move, from its start to its return
	Report  string        // what the move printed
	// Without, During and WithoutAfter are the other partitions' drains
	// of the three backlogs, before, with and after the move: their
	// requests applied from the allocators' start while each of them
	// still had requests waiting, that is until the first of them had
	// applied its last (or, with the move, until the move ended, if that
	// came first: Covered).
	Without, During, WithoutAfter DrainResult
	Covered                       bool             // During lasted the whole move
	Until                         string           // else the step the move was at when During ended (by the steps' printed times)
	Requests                      int64            // every request published (opens and joins)
	Results                       map[string]int64 // results (processed_request rows) by shard, after it
	// Audit is the verdict of the audit of the moved partition over every
	// shard, after the move.
	Audit string
}

// MoveShards measures the move of cfg.Partition to cfg.To over the shards
// of pools (named in order by names; every pool migrated and empty of
// allot state, nc's server empty), with the stream and the map set up as
// `allotctl setup` does and one allocator per partition following the map
// (package follow), as the allocator process runs them:
//
//  1. the opens and cfg.Signups joins to the partition's activities are
//     applied: its state at the move (with a tenth of a drain of the
//     others, not timed: a warm-up);
//  2. a backlog of opens and cfg.Requests joins over activities of the
//     other partitions is drained and timed: the drain without a move;
//  3. a backlog of cfg.DuringRequests is drained with the move (move.Run,
//     in process) started as the allocators start; the others are timed
//     until the move has returned (or the first of them has run out), and
//     cfg.Waiting joins to the moved partition, published once it is
//     frozen, are applied on its new shard;
//  4. a backlog like the first is drained and timed, after the move.
//
// Then it checks that every request was applied once, on the shard the map
// names for its partition, that no row of the moved partition's
// activities is left on another shard than cfg.To, and that the audit of
// the moved partition over every shard is clean; any of these failing is
// an error.
func MoveShards(ctx context.Context, pools shards.Pools, names []string, nc *nats.Conn, log *slog.Logger, cfg MoveConfig) (MoveResult, error) {
	switch {
	case cfg.Partitions < 2:
		return MoveResult{}, errors.New("bench: a move needs at least 2 partitions, one moved and others draining")
	case cfg.Partition < 0 || cfg.Partition >= cfg.Partitions:
		return MoveResult{}, fmt.Errorf("bench: partition %d is not one of %d", cfg.Partition, cfg.Partitions)
	case !slices.Contains(names, cfg.To):
		return MoveResult{}, fmt.Errorf("bench: shard %q is not one of %v", cfg.To, names)
	case cfg.Signups < 0 || cfg.Requests < 1 || cfg.DuringRequests < 1 || cfg.Activities < 1:
		return MoveResult{}, errors.New("bench: a move needs at least one activity and one request per drain, and no negative signups")
	}
	p := cfg.Partition
	mine := activitiesOf(cfg, 0, func(q int) bool { return q == p })
	if len(mine) == 0 || len(mine) == cfg.Activities {
		return MoveResult{}, fmt.Errorf("bench: partition %d must have some of the %d activities, not all or none", p, cfg.Activities)
	}
	sr, err := newShardRun(ctx, pools, names, nc, log, cfg.Partitions, cfg.Allocator)
	if err != nil {
		return MoveResult{}, err
	}
	defer sr.close()
	from, err := sr.router.Route(p)
	if err != nil {
		return MoveResult{}, err
	}
	if from.Shard == cfg.To {
		return MoveResult{}, fmt.Errorf("bench: partition %d is on shard %s already", p, cfg.To)
	}
	res := MoveResult{Partition: p, From: from.Shard, To: cfg.To}
	others := slices.DeleteFunc(sr.all(), func(q int) bool { return q == p })
	pub := &publisher{sr: sr, batch: cfg.Batch, perPartition: make([]int64, cfg.Partitions)}

	// 1. The moved partition's state.
	ph, err := pub.publish(ctx, mine, cfg.Capacity, mine, cfg.Signups)
	if err != nil {
		return res, err
	}
	// With them, a tenth of a drain of the others, not measured: the
	// first drain timed is not their first.
	theirs := func(k int) []int64 { return activitiesOf(cfg, k, func(q int) bool { return q != p }) }
	if ph, err = pub.publish(ctx, theirs(4), cfg.Capacity, theirs(4), max(cfg.Requests/10, 1)); err != nil {
		return res, err
	}
	if _, err := sr.drain(ctx, ph, nil); err != nil {
		return res, fmt.Errorf("the moved partition's signups: %w", err)
	}
	cfg.progress("partition %d's %d signups applied on %s", p, cfg.Signups, from.Shard)

	// 2. The drain without a move.
	// Each drain opens activities of its own, so that the three are
	// alike (the waitlists of one do not grow the next's).
	if res.Without, err = sr.timedDrain(ctx, pub, theirs(1), cfg, cfg.Requests, others); err != nil {
		return res, fmt.Errorf("the drain without a move: %w", err)
	}
	cfg.progress("the drain without a move: %d requests in %s", res.Without.Decisions, res.Without.Elapsed.Round(time.Millisecond))
	if err := from.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM activity_signup WHERE activity_id IN ("+placeholders(len(mine))+")",
		anys(mine)...).Scan(&res.Signups); err != nil {
		return res, err
	}

	// 3. The drain with the move.
	if ph, err = pub.publish(ctx, theirs(2), cfg.Capacity, theirs(2), cfg.DuringRequests); err != nil {
		return res, err
	}
	settle := cfg.Settle
	if settle == 0 {
		settle = 10 * time.Second // allotctl shards move's -settle
	}
	kv, err := sr.js.KeyValue(ctx, shards.Bucket)
	if err != nil {
		return res, err
	}
	var (
		out       lockedBuffer
		moveErr   error
		moveStart time.Time
		moveDone  = make(chan struct{})
		waitErr   = make(chan error, 1)
		published = false
	)
	// Requests for the moved partition arrive once it is frozen: they wait
	// in the stream and are applied on its new shard after the flip.
	arrive := func(step string) error {
		if step == move.StepFreeze && cfg.Waiting > 0 && !published {
			published = true
			go func() {
				_, err := pub.publish(ctx, nil, 0, mine, cfg.Waiting)
				waitErr <- err
			}()
		}
		return nil
	}
	// A move that fails ends the drain: its partition would wait for ever.
	dctx, failed := context.WithCancelCause(ctx)
	defer failed(nil)
	start := time.Now()
	run, err := sr.start(dctx)
	if err != nil {
		return res, err
	}
	defer run.stop()
	go func() {
		defer close(moveDone)
		moveStart = time.Now()
		moveErr = move.Run(ctx, move.Options{Partition: p, Partitions: cfg.Partitions, To: cfg.To, Pools: pools, KV: kv, JS: sr.js,
			Out: &out, Settle: settle, After: arrive})
		res.Took = time.Since(moveStart)
		if moveErr != nil {
			failed(moveErr)
		}
	}()
	w, err := run.saturated(dctx, others, ph.last, moveDone)
	if err == nil {
		err = run.wait(dctx, others, ph.last)
	}
	<-moveDone
	res.Report = out.String()
	if moveErr != nil {
		return res, fmt.Errorf("the move of partition %d to %s: %w\n%s", p, cfg.To, moveErr, res.Report)
	}
	if err != nil {
		return res, fmt.Errorf("the drain with the move: %w", err)
	}
	if published {
		if err := <-waitErr; err != nil {
			return res, fmt.Errorf("the requests to the frozen partition: %w", err)
		}
	}
	last, err := partitionLastSeqs(ctx, sr.js, cfg.Partitions)
	if err != nil {
		return res, err
	}
	if err := run.wait(ctx, sr.all(), last); err != nil {
		return res, fmt.Errorf("the moved partition's requests on %s: %w", cfg.To, err)
	}
	run.stop()
	if res.Steps, res.Frozen, err = parseMoveReport(res.Report); err != nil {
		return res, err
	}
	n, err := sr.applied(ctx, ph, others, w.fences)
	if err != nil {
		return res, err
	}
	res.During = DrainResult{Decisions: int(n), Elapsed: w.end.Sub(start)}
	if res.Covered = w.stopped; !res.Covered {
		at, sum := w.end.Sub(moveStart), time.Duration(0)
		for _, st := range res.Steps {
			if sum += st.Took; sum >= at {
				res.Until = st.Name
				break
			}
		}
	}
	cfg.progress("the drain with the move: %d requests in %s, the move %s", res.During.Decisions, res.During.Elapsed.Round(time.Millisecond), res.Took.Round(time.Millisecond))

	// 4. The drain without a move again, after it: the two bracket the
	// drain with the move, so that a drift of the machine shows.
	if res.WithoutAfter, err = sr.timedDrain(ctx, pub, theirs(3), cfg, cfg.Requests, others); err != nil {
		return res, fmt.Errorf("the drain after the move: %w", err)
	}
	cfg.progress("the drain after the move: %d requests in %s", res.WithoutAfter.Decisions, res.WithoutAfter.Elapsed.Round(time.Millisecond))
	t := time.Now()
	if err := checkMoved(ctx, sr, pub, mine, &res); err != nil {
		return res, err
	}
	cfg.progress("checked every request, audited partition %d over every shard, in %s", p, time.Since(t).Round(time.Millisecond))
	return res, nil
}

func (c MoveConfig) progress(format string, args ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, "  "+format+"\n", args...)
	}
}

// activitiesOf is the activities k*cfg.Activities+1 to
// (k+1)*cfg.Activities of the partitions keep keeps: k 0 the moved
// partition's, 1 to 3 the others' of each drain, 4 the warm-up's.
func activitiesOf(cfg MoveConfig, k int, keep func(partition int) bool) []int64 {
	var out []int64
	for a := int64(k*cfg.Activities) + 1; a <= int64((k+1)*cfg.Activities); a++ {
		if keep(bus.PartitionOf(a, cfg.Partitions)) {
			out = append(out, a)
		}
	}
	return out
}

// checkMoved checks, the allocators stopped, that every request was
// applied once on the shard its partition is on, that the moved
// partition's rows are on its new shard only, and that the audit of the
// moved partition over every shard (its rows on its shard, none misplaced
// on another) is clean.
func checkMoved(ctx context.Context, sr *shardRun, pub *publisher, mine []int64, res *MoveResult) error {
	res.Results = map[string]int64{}
	for p, want := range pub.perPartition {
		rt, err := sr.router.Route(p)
		if err != nil {
			return err
		}
		for name, db := range sr.pools {
			var n, ids int64
			if err := db.QueryRowContext(ctx, "SELECT COUNT(*), COUNT(DISTINCT request_id) FROM processed_request WHERE partition_id = ?", p).Scan(&n, &ids); err != nil {
				return fmt.Errorf("count partition %d's results on %s: %w", p, name, err)
			}
			res.Results[name] += n
			if name != rt.Shard && n != 0 {
				return fmt.Errorf("shard %s holds %d results of partition %d, which is on %s", name, n, p, rt.Shard)
			}
			if name == rt.Shard && (n != want || ids != want) {
				return fmt.Errorf("partition %d on %s has %d results of %d request ids, want %d requests applied once", p, name, n, ids, want)
			}
		}
		res.Requests += want
	}
	in := placeholders(len(mine))
	for name, db := range sr.pools {
		if name == res.To {
			continue
		}
		for t, col := range map[string]string{"activity": "id", "activity_signup": "activity_id", "waitlist_bucket": "activity_id"} {
			var n int64
			if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+t+" WHERE "+col+" IN ("+in+")", anys(mine)...).Scan(&n); err != nil {
				return fmt.Errorf("count %s on %s: %w", t, name, err)
			}
			if n != 0 {
				return fmt.Errorf("shard %s still holds %d %s rows of the moved partition's activities", name, n, t)
			}
		}
	}
	// The audit of the moved partition over every shard: its rows on its
	// shard against the stream, and none of them on another (misplaced).
	rep, err := audit.Run(ctx, audit.Config{Partitions: []int{res.Partition}}, audit.Deps{Shards: sr.pools, JS: sr.js})
	if err != nil {
		return fmt.Errorf("the audit after the move: %w", err)
	}
	if len(rep.Divergences) > 0 {
		d := rep.Divergences[0]
		return fmt.Errorf("the audit after the move found %d divergence(s), the first %s of activity %d on shard %s: %s, want %s",
			len(rep.Divergences), d.Kind, d.ActivityID, d.Shard, d.Actual, d.Expected)
	}
	res.Audit = fmt.Sprintf("of partition %d over the %d shards clean: %d activities, %d results compared", res.Partition, len(sr.pools), rep.ActivitiesChecked, rep.Compared)
	return nil
}

// timedDrain publishes the opens of ids and n joins over them, drains
// them, and returns the requests of the partitions ps applied while each
// of them still had requests waiting (saturated), and in how long.
func (s *shardRun) timedDrain(ctx context.Context, pub *publisher, ids []int64, cfg MoveConfig, n int, ps []int) (DrainResult, error) {
	ph, err := pub.publish(ctx, ids, cfg.Capacity, ids, n)
	if err != nil {
		return DrainResult{}, err
	}
	start := time.Now()
	run, err := s.start(ctx)
	if err != nil {
		return DrainResult{}, err
	}
	defer run.stop()
	w, err := run.saturated(ctx, ps, ph.last, nil)
	if err != nil {
		return DrainResult{}, err
	}
	if err := run.wait(ctx, s.all(), ph.last); err != nil {
		return DrainResult{}, err
	}
	k, err := s.applied(ctx, ph, ps, w.fences)
	return DrainResult{Decisions: int(k), Elapsed: w.end.Sub(start)}, err
}

// window is the end of a drain's measured part: when the first of its
// partitions applied its last request (from then on they do not all have
// requests waiting), or stop came first (stopped); and each partition's
// fence then.
type window struct {
	end     time.Time
	fences  []uint64
	stopped bool
}

// saturated waits until the first of the partitions ps has passed last,
// or stop is closed, and returns the window.
func (a *allocators) saturated(ctx context.Context, ps []int, last []uint64, stop <-chan struct{}) (window, error) {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		stopped := false
		select {
		case <-stop:
			stopped = true
		default:
		}
		w := window{end: time.Now(), fences: make([]uint64, len(last)), stopped: stopped}
		done := stopped
		for _, q := range ps {
			f, _, err := a.s.fence(ctx, q)
			if err != nil {
				return window{}, err
			}
			w.fences[q] = f
			done = done || f >= last[q]
		}
		if done {
			return w, nil
		}
		if time.Now().After(deadline) {
			return window{}, fmt.Errorf("drain stalled at fences %v of %v", w.fences, last)
		}
		select {
		case err := <-a.errs:
			return window{}, err
		case <-ctx.Done():
			return window{}, ctx.Err()
		case <-stop:
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// applied is the requests of ph of the partitions ps applied up to fences.
func (s *shardRun) applied(ctx context.Context, ph phase, ps []int, fences []uint64) (int64, error) {
	var n int64
	for _, q := range ps {
		rt, err := s.router.Route(q)
		if err != nil {
			return 0, err
		}
		var k int64
		if err := rt.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM processed_request WHERE partition_id = ? AND seq > ? AND seq <= ?",
			q, ph.before, fences[q]).Scan(&k); err != nil {
			return 0, fmt.Errorf("count partition %d's results on %s: %w", q, rt.Shard, err)
		}
		n += k
	}
	return n, nil
}

// drain starts the allocators, waits until every partition's fence has
// passed ph's last message, and stops them; it returns how long the
// partitions of timed (all when nil) took from the allocators' start.
func (s *shardRun) drain(ctx context.Context, ph phase, timed []int) (time.Duration, error) {
	if timed == nil {
		timed = s.all()
	}
	start := time.Now()
	run, err := s.start(ctx)
	if err != nil {
		return 0, err
	}
	defer run.stop()
	if err := run.wait(ctx, timed, ph.last); err != nil {
		return 0, err
	}
	took := time.Since(start)
	return took, run.wait(ctx, s.all(), ph.last)
}

// publisher publishes the backlogs of a move's measurement, each user
// joining once, and counts each partition's requests.
type publisher struct {
	sr           *shardRun
	batch        int
	user         int64
	perPartition []int64
}

// phase is one backlog published: the stream's last sequence before it,
// each partition's last message, and each partition's requests in it.
type phase struct {
	before uint64
	last   []uint64
	counts []int64
}

// of is the requests of the partitions ps.
func (ph phase) of(ps []int) int64 {
	var n int64
	for _, p := range ps {
		n += ph.counts[p]
	}
	return n
}

// publish stores an open (of capacity) of each of opens, then n joins
// spread over to in turn, each by a user of its own.
func (pb *publisher) publish(ctx context.Context, opens []int64, capacity int64, to []int64, n int) (phase, error) {
	st, err := pb.sr.js.Stream(ctx, wire.RequestStream)
	if err != nil {
		return phase{}, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return phase{}, err
	}
	ph := phase{before: info.State.LastSeq, counts: make([]int64, pb.sr.partitions)}
	now := time.Now().UTC()
	bl := &backlog{js: pb.sr.js, batch: max(pb.batch, 1), open: map[int64][][]byte{}}
	add := func(r wire.Request) error {
		ph.counts[bus.PartitionOf(r.ActivityID, pb.sr.partitions)]++
		return bl.add(r)
	}
	for _, a := range opens {
		c := capacity
		if err := add(wire.Request{RequestID: uuid.Must(uuid.NewV7()).String(), Op: wire.OpOpen, ActivityID: a, Capacity: &c, ReceivedAt: now}); err != nil {
			return phase{}, err
		}
	}
	for i := range n {
		pb.user++
		if err := add(wire.Request{RequestID: uuid.Must(uuid.NewV7()).String(), Op: wire.OpJoin, ActivityID: to[i%len(to)], UserID: pb.user, ReceivedAt: now}); err != nil {
			return phase{}, err
		}
	}
	if err := bl.flush(); err != nil {
		return phase{}, err
	}
	if err := bl.wait(); err != nil {
		return phase{}, err
	}
	for p, c := range ph.counts {
		pb.perPartition[p] += c
	}
	if ph.last, err = partitionLastSeqs(ctx, pb.sr.js, pb.sr.partitions); err != nil {
		return phase{}, err
	}
	return ph, nil
}

// parseMoveReport reads the steps and their times, and the time the
// partition was frozen, from what the move printed: a line per step,
// "<step> <detail> (<time>)", and "done … it was frozen for <time>".
func parseMoveReport(report string) ([]MoveStep, time.Duration, error) {
	steps := []string{move.StepFreeze, move.StepCopy, move.StepVerify, move.StepFence, move.StepFlip, move.StepResume, move.StepClean}
	var (
		out    []MoveStep
		frozen time.Duration
	)
	sc := bufio.NewScanner(strings.NewReader(report))
	for sc.Scan() {
		line := sc.Text()
		name, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimSpace(rest)
		if name == "done" {
			_, f, ok := strings.Cut(rest, "frozen for ")
			d, err := time.ParseDuration(strings.TrimSpace(f))
			if !ok || err != nil {
				return nil, 0, fmt.Errorf("the move's report says %q: no frozen time in it", line)
			}
			frozen = d
			continue
		}
		i := strings.LastIndex(rest, " (")
		if !slices.Contains(steps, name) || i < 0 || !strings.HasSuffix(rest, ")") {
			continue
		}
		d, err := time.ParseDuration(rest[i+2 : len(rest)-1])
		if err != nil {
			continue
		}
		out = append(out, MoveStep{Name: name, Detail: rest[:i], Took: d})
	}
	got := make([]string, len(out))
	for i, s := range out {
		got[i] = s.Name
	}
	if !slices.Equal(got, steps) || frozen == 0 {
		return nil, 0, fmt.Errorf("the move's report has the steps %v and frozen time %s, want %v and a frozen time:\n%s", got, frozen, steps, report)
	}
	return out, frozen, nil
}

// lockedBuffer is a buffer safe to write from the move's goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func placeholders(n int) string { return strings.TrimSuffix(strings.Repeat("?,", n), ",") }

func anys(ids []int64) []any {
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}
