package faults

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/store"
)

// moveActivities are two activities of each of the scenario's four
// partitions, small pools as in the default burst.
func moveActivities(partitions int) []activity {
	var out []activity
	per := map[int]int{}
	caps := []int{20, 30, 50}
	for id := int64(101); len(out) < 2*partitions; id++ {
		p := bus.PartitionOf(id, partitions)
		if per[p] == 2 {
			continue
		}
		per[p]++
		out = append(out, activity{id: id, capacity: caps[len(out)%len(caps)]})
	}
	return out
}

// TestScenario15MoveUnderKills: two shards (private MariaDB servers s0
// and s1), four partitions (0 and 2 on s0, 1 and 3 on s1), and the real
// `allotctl shards move` moving partition 0 under the burst, three times:
//
//  1. to s1: stopped (SIGSTOP) right after its freeze, the allocator is
//     killed with SIGKILL there, between the freeze and the flip; the move
//     goes on, the allocator is started again, and the move finishes;
//  2. back to s0: stopped in its copy, the old shard's server (s1) is
//     killed with SIGKILL; the move fails (exit 1); the server is started
//     again (crash recovery) and the move run again until it finishes;
//  3. to s1 again: allotctl itself killed with SIGKILL in its copy (the
//     first activity row on s1); an undo started at once is refused by
//     the killed run's lease (exit 2, naming it), and once the lease has
//     ended the undo takes the move over and puts the partition back on
//     s0, the half copy deleted.
//
// Throughout (every 50ms, and at each step) the map names exactly one
// shard for partition 0 and the fence rows agree: the map's shard's row
// is at the map's epoch or frozen, no other shard's is at the map's epoch;
// after each move and the undo the map's shard's row is live. In the end
// every accepted request is applied once, in order, the invariants hold
// on each shard, the audit of every shard is clean, and nothing of
// partition 0 is left on s1 but its frozen fence tombstone.
func TestScenario15MoveUnderKills(t *testing.T) {
	const partitions = 4
	tr := defaultTraffic(15)
	tr.requests, tr.perSecond = 4000, 500
	tr.activities = moveActivities(partitions)
	env := []string{"ALLOT_PARTITIONS=" + strconv.Itoa(partitions)}
	var w *moveWatch
	run(t, scenario{n: 15, name: "move-under-kills", traffic: tr,
		stack: stackConfig{shards: 2, allocEnv: env, ingestEnv: env},
		fault: func(s *stack, b *burst, r *faultResult) error {
			if !b.reached(0.1) {
				return errors.New("the burst ended before the fault")
			}
			w = s.watchMove(0)
			defer w.stop()
			if err := s.moveKillAllocator(w, r); err != nil {
				return err
			}
			if err := s.leftOn(0, 0, activitiesOf(tr.activities, 0, partitions)); err != nil {
				return fmt.Errorf("after the first move: %w", err)
			}
			if err := s.moveKillOldShard(w, r); err != nil {
				return err
			}
			if err := s.moveKillAllotctlUndo(w, r, activitiesOf(tr.activities, 0, partitions)); err != nil {
				return err
			}
			r.note("moved_at=%d/%d", b.done.Load(), len(b.reqs))
			return nil
		},
		check: func(t *testing.T, s *stack, m *summary, r *faultResult) {
			if w == nil {
				t.Fatal("the moves did not start")
			}
			for _, v := range w.violations() {
				t.Error(v)
			}
			m.notes = append(m.notes, fmt.Sprintf("observations=%d", w.count()))
			if r.count.Load() != 3 {
				t.Errorf("%d of the 3 faults took effect", r.count.Load())
			}
			ctx := context.Background()
			pl, err := s.placement(ctx, 0)
			if err != nil || pl.shard != "s0" || pl.epoch != 3 {
				t.Fatalf("partition 0 in the end: %+v, %v; want s0 at epoch 3", pl, err)
			}
			if err := s.leftOn(1, 0, activitiesOf(tr.activities, 0, partitions)); err != nil {
				t.Error(err)
			}
		},
	})
}

// movePlace is a partition's map entry and its fence row on each shard.
type movePlace struct {
	shard string
	epoch uint64
	// rows are the partition's fence row epochs by shard index (0:
	// frozen); a shard without a row is absent, one that does not
	// answer is in down.
	rows map[int]uint64
	down map[int]bool
}

// placement reads partition p's map entry and its fence rows.
func (s *stack) placement(ctx context.Context, p int) (movePlace, error) {
	places, err := s.placements(ctx)
	if err != nil {
		return movePlace{}, err
	}
	pl := movePlace{rows: map[int]uint64{}, down: map[int]bool{}}
	found := false
	for _, x := range places {
		if x.Partition == p {
			pl.shard, pl.epoch, found = x.Shard, x.Epoch, true
		}
	}
	if !found {
		return pl, fmt.Errorf("the map has no entry for partition %d", p)
	}
	for i, db := range s.dbs {
		if !s.shardProcs[i].alive() {
			pl.down[i] = true
			continue
		}
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		at, err := store.PartitionEpoch(qctx, db, p)
		cancel()
		switch {
		case errors.Is(err, store.ErrNoFence):
		case err != nil:
			pl.down[i] = true
		default:
			pl.rows[i] = at
		}
	}
	return pl, nil
}

// check reports what is wrong with a placement: a map's shard row at
// neither its epoch nor frozen, another shard's row at the map's epoch,
// or (live) the map's shard's row not at the map's epoch.
func (pl movePlace) check(s *stack, live bool) error {
	home, err := s.shardIndex(pl.shard)
	if err != nil {
		return err
	}
	for i, at := range pl.rows {
		switch {
		case i == home && at != 0 && at != pl.epoch:
			return fmt.Errorf("the map puts it on %s at epoch %d, its fence row there is at epoch %d", pl.shard, pl.epoch, at)
		case i != home && at == pl.epoch:
			return fmt.Errorf("the map puts it on %s at epoch %d, and s%d's fence row is live at that epoch too (rows %v)", pl.shard, pl.epoch, i, pl.rows)
		}
	}
	if live && !pl.down[home] {
		if at, ok := pl.rows[home]; !ok || at != pl.epoch {
			return fmt.Errorf("the move is over, the map puts it on %s at epoch %d, its fence row there is not live at that epoch (rows %v)", pl.shard, pl.epoch, pl.rows)
		}
	}
	return nil
}

// moveWatch observes a partition's placement every 50ms while moves run.
type moveWatch struct {
	s    *stack
	p    int
	done chan struct{}
	wg   sync.WaitGroup

	mu   sync.Mutex
	n    int
	errs []string
}

func (s *stack) watchMove(p int) *moveWatch {
	w := &moveWatch{s: s, p: p, done: make(chan struct{})}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		for {
			w.observe("while moving", false)
			select {
			case <-w.done:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return w
}

// observe reads the placement once and records what is wrong with it;
// live says a move or undo has just finished.
func (w *moveWatch) observe(when string, live bool) movePlace {
	pl, err := w.s.placement(context.Background(), w.p)
	if err == nil {
		err = pl.check(w.s, live)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n++
	if err != nil && len(w.errs) < 20 {
		w.errs = append(w.errs, fmt.Sprintf("partition %d %s: %v", w.p, when, err))
	}
	return pl
}

func (w *moveWatch) stop() {
	select {
	case <-w.done:
	default:
		close(w.done)
	}
	w.wg.Wait()
}

func (w *moveWatch) violations() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.errs
}

func (w *moveWatch) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// allotctlMove prepares `allotctl shards move` of partition p with args
// (-to SHARD, or -undo), a short lease and settle.
func (s *stack) allotctlMove(p int, args ...string) *proc {
	name := "allotctl shards move " + strings.Join(args, " ")
	args = append([]string{"shards", "move", "-partition", strconv.Itoa(p), "-settle", "5s", "-lease", "2s"}, args...)
	return newProc(s.t, name, "allotctl", s.setupEnv, args...)
}

// waitOutput waits until the running incarnation of p printed want.
func waitOutput(p *proc, want string) error {
	inc := p.current()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(inc.output.String(), want) {
		if !inc.alive() {
			return fmt.Errorf("%s ended (%s) before it printed %q:\n%s", p.name, inc.exitText(), want, inc.output.String())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not print %q within 30s:\n%s", p.name, want, inc.output.String())
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// waitExit waits for the running incarnation of p to exit and returns its
// exit code and output.
func waitExit(p *proc) (int, string, error) {
	inc := p.current()
	select {
	case <-inc.done:
	case <-time.After(time.Minute):
		return 0, "", fmt.Errorf("%s still running after a minute:\n%s", p.name, inc.output.String())
	}
	code := 0
	var ee interface{ ExitCode() int }
	if errors.As(inc.err, &ee) {
		code = ee.ExitCode()
	} else if inc.err != nil {
		return 0, "", inc.err
	}
	return code, inc.output.String(), nil
}

// runToEnd runs p until it exits 0, again after each exit 1 (up to 10
// runs); it returns the last output.
func runToEnd(p *proc) (string, error) {
	for try := 1; ; try++ {
		if _, err := p.start(); err != nil {
			return "", err
		}
		code, out, err := waitExit(p)
		if err != nil {
			return "", err
		}
		if code == 0 {
			return out, nil
		}
		if code != 1 || try == 10 {
			return "", fmt.Errorf("%s: exit %d (run %d):\n%s", p.name, code, try, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// stoppedBeforeFlip checks, allotctl stopped after its freeze, that the
// move has not flipped the map and the partition is frozen on its shard.
func (s *stack) stoppedBeforeFlip(w *moveWatch, from string, epoch uint64) error {
	pl := w.observe("allotctl stopped after its freeze", false)
	i, err := s.shardIndex(from)
	if err != nil {
		return err
	}
	if pl.shard != from || pl.epoch != epoch {
		return fmt.Errorf("the move stopped after its freeze has flipped the map already (%s at %d): the fault missed the window", pl.shard, pl.epoch)
	}
	if at, ok := pl.rows[i]; !ok || at != 0 {
		return fmt.Errorf("partition %d is not frozen on %s after the freeze (rows %v)", w.p, from, pl.rows)
	}
	return nil
}

// moveKillAllocator is the first move: 0 to s1, the allocator killed
// between the freeze and the flip.
func (s *stack) moveKillAllocator(w *moveWatch, r *faultResult) error {
	mv, err := s.moveStoppedAtFreeze(w, "s1", "s0", 1)
	if err != nil {
		return err
	}
	if err := s.allocs[0].kill(); err != nil {
		return err
	}
	w.observe("the allocator killed mid-move", false)
	if err := mv.signal(syscall.SIGCONT); err != nil {
		return err
	}
	time.Sleep(200 * time.Millisecond) // the move goes on without an allocator
	if err := s.startAllocator(0); err != nil {
		return err
	}
	code, out, err := waitExit(mv)
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("the move with the allocator killed: exit %d:\n%s", code, out)
	}
	s.t.Logf("the move to s1, the allocator killed after its freeze:\n%s", out)
	w.observe("after the first move", true)
	r.count.Add(1)
	r.note("move1_frozen=%q", frozenFor(out))
	return nil
}

// moveKillOldShard is the second move: 0 back to s0, the old shard's
// server (s1) killed in the copy.
func (s *stack) moveKillOldShard(w *moveWatch, r *faultResult) error {
	mv, err := s.moveStoppedAtFreeze(w, "s0", "s1", 2)
	if err != nil {
		return err
	}
	if out := mv.current().output.String(); strings.Contains(out, "copy  ") {
		mv.signal(syscall.SIGCONT) //nolint:errcheck // failing anyway
		return fmt.Errorf("the move had copied before it was stopped: the fault missed the copy:\n%s", out)
	}
	if err := s.shardProcs[1].kill(); err != nil {
		return err
	}
	down := time.Now()
	w.observe("the old shard killed in the copy", false)
	if err := mv.signal(syscall.SIGCONT); err != nil {
		return err
	}
	code, out, err := waitExit(mv)
	if err != nil {
		return err
	}
	if code != 1 || strings.Contains(out, "copy  ") {
		return fmt.Errorf("the move with its old shard killed in the copy: exit %d, want 1 and no copy done:\n%s", code, out)
	}
	w.observe("the move failed with its old shard down", false)
	s.t.Logf("the move to s0, its old shard killed in the copy:\n%s", out)
	if err := startAndWait(s.shardProcs[1], s.shardBases[1]); err != nil {
		return err
	}
	r.note("old_shard_down=%s", time.Since(down).Round(10*time.Millisecond))
	out, err = runToEnd(mv)
	if err != nil {
		return err
	}
	if !strings.Contains(out, "resume  the move of partition") {
		return fmt.Errorf("the move run again does not resume:\n%s", out)
	}
	s.t.Logf("the move to s0 run again:\n%s", out)
	w.observe("after the second move", true)
	r.count.Add(1)
	return nil
}

// moveKillAllotctlUndo is the third move: 0 to s1, allotctl killed in
// its copy (once the first activity row is on s1), and undone once the
// killed run's lease has ended.
func (s *stack) moveKillAllotctlUndo(w *moveWatch, r *faultResult, acts []int64) error {
	mv := s.allotctlMove(w.p, "-to", "s1")
	if _, err := mv.start(); err != nil {
		return err
	}
	if err := waitOutput(mv, "freeze  "); err != nil {
		return err
	}
	in := strings.Trim(strings.Join(strings.Fields(fmt.Sprint(acts)), ","), "[]")
	// Polled as fast as it answers: the copy takes tens of milliseconds.
	for deadline := time.Now().Add(30 * time.Second); ; {
		if !mv.alive() {
			return fmt.Errorf("the move ended before its copy reached the activities:\n%s", mv.current().output.String())
		}
		var n int64
		if err := s.dbs[1].QueryRow("SELECT COUNT(*) FROM activity WHERE id IN (" + in + ")").Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the move's copy put no activity of partition %d on s1 within 30s:\n%s", w.p, mv.current().output.String())
		}
	}
	pid := mv.pid()
	if err := mv.kill(); err != nil {
		return err
	}
	if pl := w.observe("allotctl killed in its copy", false); pl.shard != "s0" || pl.epoch != 3 {
		// The flip came before the kill: the undo would be refused.
		return fmt.Errorf("the move killed in its copy had flipped the map already (%s at %d): the fault missed the window", pl.shard, pl.epoch)
	}
	if out := mv.current().output.String(); strings.Contains(out, "verify  ") {
		return fmt.Errorf("the move killed in its copy had verified it already: the fault missed the copy:\n%s", out)
	}
	undo := s.allotctlMove(w.p, "-undo")
	refused := 0
	for {
		if _, err := undo.start(); err != nil {
			return err
		}
		code, out, err := waitExit(undo)
		if err != nil {
			return err
		}
		if code == 0 {
			s.t.Logf("the undo, after %d refusals:\n%s", refused, out)
			break
		}
		if refused == 0 {
			s.t.Logf("the undo refused:\n%s", out)
		}
		if code != 2 || !strings.Contains(out, "lease ends at") || !strings.Contains(out, fmt.Sprintf("pid %d on", pid)) {
			return fmt.Errorf("the undo while the killed run's (pid %d) lease may be live: exit %d, want 0, or 2 naming it:\n%s", pid, code, out)
		}
		refused++
		if refused > 100 {
			return fmt.Errorf("the undo is still refused after %d tries:\n%s", refused, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if refused == 0 {
		return errors.New("the undo started at once after the kill was not refused by the killed run's lease")
	}
	w.observe("after the undo", true)
	r.count.Add(1)
	r.note("undo_refused=%d", refused)
	return nil
}

// frozenFor is what the move's done line says of its frozen time.
func frozenFor(out string) string {
	_, after, ok := strings.Cut(out, "it was frozen for ")
	if !ok {
		return ""
	}
	return strings.TrimSpace(strings.SplitN(after, "\n", 2)[0])
}

// leftOn reports what shard i holds of partition p (whose activities
// are acts) beyond its fence row frozen at 0, the tombstone a move
// leaves, or nothing.
func (s *stack) leftOn(i, p int, acts []int64) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db := s.dbs[i]
	var ids []string
	for _, a := range acts {
		ids = append(ids, strconv.FormatInt(a, 10))
	}
	in, part := strings.Join(ids, ","), strconv.Itoa(p)
	var left []string
	for _, q := range []string{
		"activity WHERE id IN (" + in + ")",
		"activity_signup WHERE activity_id IN (" + in + ")",
		"waitlist_bucket WHERE activity_id IN (" + in + ")",
		"event_relay WHERE partition_id = " + part,
		"processed_request WHERE partition_id = " + part,
		"processed_request_part WHERE partition_id = " + part,
		"outbox_skipped WHERE partition_id = " + part,
		"allocator_checkpoint WHERE partition_id = " + part,
		"allocator_checkpoint_activity WHERE partition_id = " + part,
		"allocator_checkpoint_signup WHERE partition_id = " + part,
	} {
		var n int64
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+q).Scan(&n); err != nil {
			return err
		}
		if n != 0 {
			left = append(left, fmt.Sprintf("%d rows of %s", n, q))
		}
	}
	var last uint64
	var epoch sql.NullInt64
	err := db.QueryRowContext(ctx, "SELECT last_seq, epoch FROM allocator_partition WHERE partition_id = ?", p).Scan(&last, &epoch)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return err
	case last != 0 || epoch.Valid:
		left = append(left, fmt.Sprintf("its fence row at %d, epoch %d (not the frozen tombstone)", last, epoch.Int64))
	}
	if len(left) > 0 {
		return fmt.Errorf("shard s%d holds of partition %d: %s", i, p, strings.Join(left, "; "))
	}
	return nil
}

// activitiesOf are the ids of acts in partition p.
func activitiesOf(acts []activity, p, partitions int) []int64 {
	var out []int64
	for _, a := range acts {
		if bus.PartitionOf(a.id, partitions) == p {
			out = append(out, a.id)
		}
	}
	return out
}

// TestMovePlaceCheck: the scenario's check of a placement objects to a
// fence row on the map's shard at another epoch, to another shard's row
// live at the map's epoch, and, once a move is over, to the map's shard's
// row frozen or missing; it accepts a move under way (frozen on the map's
// shard, the copy's row at the next epoch) and a shard that does not
// answer.
func TestMovePlaceCheck(t *testing.T) {
	s := &stack{dbs: make([]*dbtest.DB, 2)}
	for _, c := range []struct {
		name string
		pl   movePlace
		live bool
		bad  bool
	}{
		{"live on its shard", movePlace{shard: "s0", epoch: 1, rows: map[int]uint64{0: 1}}, true, false},
		{"frozen, copied, fenced", movePlace{shard: "s0", epoch: 1, rows: map[int]uint64{0: 0, 1: 2}}, false, false},
		{"flipped, old row frozen", movePlace{shard: "s1", epoch: 2, rows: map[int]uint64{0: 0, 1: 2}}, true, false},
		{"its shard down", movePlace{shard: "s1", epoch: 2, rows: map[int]uint64{0: 0}, down: map[int]bool{1: true}}, true, false},
		{"its row at another epoch", movePlace{shard: "s0", epoch: 1, rows: map[int]uint64{0: 2}}, false, true},
		{"both live at the map's epoch", movePlace{shard: "s1", epoch: 2, rows: map[int]uint64{0: 2, 1: 2}}, false, true},
		{"frozen after the move", movePlace{shard: "s1", epoch: 2, rows: map[int]uint64{0: 0, 1: 0}}, true, true},
		{"no row after the move", movePlace{shard: "s1", epoch: 2, rows: map[int]uint64{0: 0}}, true, true},
		{"a shard not in the stack", movePlace{shard: "s7", epoch: 2}, false, true},
	} {
		if err := c.pl.check(s, c.live); (err != nil) != c.bad {
			t.Errorf("%s: %v, want an objection %t", c.name, err, c.bad)
		}
	}
}

// moveStoppedAtFreeze starts `allotctl shards move` of w's partition to
// shard to and stops it (SIGSTOP) as soon as it prints its freeze, after
// checking that the partition is frozen on from at epoch and the map not
// flipped.
func (s *stack) moveStoppedAtFreeze(w *moveWatch, to, from string, epoch uint64) (*proc, error) {
	mv := s.allotctlMove(w.p, "-to", to)
	if _, err := mv.start(); err != nil {
		return nil, err
	}
	if err := waitOutput(mv, "freeze  "); err != nil {
		return nil, err
	}
	if err := mv.signal(syscall.SIGSTOP); err != nil {
		return nil, err
	}
	if err := s.stoppedBeforeFlip(w, from, epoch); err != nil {
		mv.signal(syscall.SIGCONT) //nolint:errcheck // failing anyway
		return nil, err
	}
	return mv, nil
}
