package move

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/devdb"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// env is an embedded JetStream server, n private MariaDB servers (shards
// s0..s<n-1>, the map seeded partition mod n) and an allocator process
// (allocator.Run) over them.
type env struct {
	t          *testing.T
	ns         *natstest.Server
	nc         *nats.Conn
	js         jetstream.JetStream
	kv         jetstream.KeyValue
	dbs        []*dbtest.DB
	pools      shards.Pools
	partitions int
	log        *slog.Logger
	procs      []*devdb.DB
	stopRun    func()

	mu   sync.Mutex
	reqs map[int64][]wire.Request // published, by activity, in order
	last map[int]uint64           // the last sequence published, by partition
}

func newEnv(t *testing.T, n, partitions int) *env {
	t.Helper()
	ns := natstest.New(t)
	e := &env{t: t, pools: shards.Pools{}, partitions: partitions, log: slog.New(slog.DiscardHandler),
		reqs: map[int64][]wire.Request{}, last: map[int]uint64{}}
	e.ns = ns
	e.nc, e.js = ns.Connect(t)
	var names []string
	e.procs = dbtest.ServerProcs(t, n)
	for i, proc := range e.procs {
		db := dbtest.NewOn(t, proc.DSN)
		e.dbs = append(e.dbs, db)
		name := fmt.Sprintf("s%d", i)
		names = append(names, name)
		e.pools[name] = db.DB
	}
	ctx := context.Background()
	if _, err := bus.Setup(ctx, e.js, natstest.Config(partitions), names); err != nil {
		t.Fatal(err)
	}
	var err error
	if e.kv, err = e.js.KeyValue(ctx, shards.Bucket); err != nil {
		t.Fatal(err)
	}
	e.startAllocator()
	t.Cleanup(e.stopAllocator)
	return e
}

// startAllocator runs an allocator process (allocator.Run) over the
// shards until stopAllocator.
func (e *env) startAllocator() {
	cfg := config.Defaults[allocator.Config]()
	cfg.Partitions, cfg.MetricsAddr, cfg.BatchSize = e.partitions, "", 50
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- allocator.Run(ctx, cfg, allocator.Deps{DB: e.pools["s0"], Shards: e.pools, NATS: e.nc, Log: e.log,
			Test: allocator.TestHooks{AckWait: 2 * time.Second, IdleCheck: 100 * time.Millisecond}})
	}()
	e.stopRun = func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("allocator.Run: %v", err)
		}
	}
}

// stopAllocator stops the allocator process.
func (e *env) stopAllocator() {
	if e.stopRun != nil {
		e.stopRun()
		e.stopRun = nil
	}
}

// publish stores r, remembering it and its partition's last sequence.
func (e *env) publish(r wire.Request) error {
	b, _ := json.Marshal(r)
	ack, err := e.js.Publish(context.Background(), wire.RequestSubject(r.ActivityID), b, jetstream.WithMsgID(r.RequestID))
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.reqs[r.ActivityID] = append(e.reqs[r.ActivityID], r)
	p := bus.PartitionOf(r.ActivityID, e.partitions)
	e.last[p] = max(e.last[p], ack.Sequence)
	return nil
}

func request(op wire.Op, activity, user int64) wire.Request {
	r := wire.Request{RequestID: uuid.Must(uuid.NewV7()).String(), Op: op, ActivityID: activity, UserID: user, ReceivedAt: time.Now().UTC()}
	if op == wire.OpOpen {
		c := int64(3)
		r.Capacity = &c
	}
	return r
}

// open opens the activities (capacity 3).
func (e *env) open(acts []int64) {
	e.t.Helper()
	for _, a := range acts {
		if err := e.publish(request(wire.OpOpen, a, 0)); err != nil {
			e.t.Fatal(err)
		}
	}
}

// load publishes joins of the activities, a round at a time (user 1, 2,
// …), until stop is closed; the returned channel says why it ended.
func (e *env) load(acts []int64, stop chan struct{}) chan error {
	out := make(chan error, 1)
	go func() {
		for u := e.users(acts[0]) + 1; ; u++ {
			for _, a := range acts {
				select {
				case <-stop:
					out <- nil
					return
				default:
				}
				if err := e.publish(request(wire.OpJoin, a, u)); err != nil {
					out <- err
					return
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return out
}

// users is how many joins activity a has been sent.
func (e *env) users(a int64) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return int64(len(e.reqs[a]) - 1)
}

// home is the shard (index) the map puts partition p on.
func (e *env) home(p int) int {
	e.t.Helper()
	pl, err := shards.Get(context.Background(), e.kv, p)
	if err != nil {
		e.t.Fatal(err)
	}
	var i int
	if _, err := fmt.Sscanf(pl.Shard, "s%d", &i); err != nil {
		e.t.Fatal(err)
	}
	return i
}

// fence is partition p's fence on shard i (-1: no row).
func (e *env) fence(i, p int) int64 {
	var last int64
	if err := e.dbs[i].QueryRow("SELECT last_seq FROM allocator_partition WHERE partition_id = ?", p).Scan(&last); err != nil {
		return -1
	}
	return last
}

// settle waits until every partition's fence on its home shard reaches
// the last sequence published to it.
func (e *env) settle() {
	e.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		e.mu.Lock()
		behind := ""
		for p, want := range e.last {
			if got := e.fence(e.home(p), p); got < int64(want) {
				behind += fmt.Sprintf(" p%d at %d of %d;", p, got, want)
			}
		}
		e.mu.Unlock()
		if behind == "" {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("fences behind:%s", behind)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rowsOf counts partition p's rows on shard i in every table of the move
// (its fence row left out when it is the frozen tombstone at 0).
func (e *env) rowsOf(i, p int) map[string]int64 {
	e.t.Helper()
	ctx := context.Background()
	ids, err := activityIDs(ctx, e.dbs[i], p, e.partitions)
	if err != nil {
		e.t.Fatal(err)
	}
	s := scope{p: p, partitions: e.partitions, ids: ids}
	out := map[string]int64{}
	for _, t := range tables {
		cols, err := columns(ctx, e.dbs[i], t.name)
		if err != nil {
			e.t.Fatal(err)
		}
		sm, err := s.checksum(ctx, e.dbs[i], t, cols)
		if err != nil {
			e.t.Fatal(err)
		}
		if sm.Rows > 0 {
			out[t.name] = sm.Rows
		}
	}
	if out["allocator_partition"] == 1 {
		if at, err := store.PartitionEpoch(ctx, e.dbs[i], p); err == nil && at == 0 && e.fence(i, p) == 0 {
			delete(out, "allocator_partition")
		}
	}
	return out
}

// check checks, once settled, that every activity's rows are on its
// partition's home shard only, each request applied there once, in
// order (users 1..3 confirmed, the others waiting in join order), the
// invariants on every shard, and the audit of every shard's activities
// clean.
func (e *env) check() {
	t := e.t
	t.Helper()
	e.settle()
	e.mu.Lock()
	defer e.mu.Unlock()
	byShard := map[int][]int64{}
	for a, rs := range e.reqs {
		p := bus.PartitionOf(a, e.partitions)
		home := e.home(p)
		byShard[home] = append(byShard[home], a)
		for i, db := range e.dbs {
			n := db.Count(t, "SELECT COUNT(*) FROM activity WHERE id = ?", a) + db.Count(t, "SELECT COUNT(*) FROM activity_signup WHERE activity_id = ?", a) +
				db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE activity_id = ?", a)
			if i != home && n != 0 {
				t.Errorf("activity %d (partition %d, home s%d) has %d rows on s%d", a, p, home, n, i)
			}
		}
		db := e.dbs[home]
		for _, r := range rs {
			if n := db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE request_id = ?", r.RequestID); n != 1 {
				t.Errorf("request %s of activity %d has %d results on s%d, want 1", r.RequestID, a, n, home)
			}
		}
		var want, got bytes.Buffer
		for u := 1; u < len(rs); u++ {
			status := "WAITING"
			if u <= 3 {
				status = "CONFIRMED"
			}
			fmt.Fprintf(&want, "%d:%s ", u, status)
		}
		rows, err := db.Query("SELECT user_id, status FROM activity_signup WHERE activity_id = ? ORDER BY queue_seq", a)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var u int64
			var s string
			if err := rows.Scan(&u, &s); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&got, "%d:%s ", u, s)
		}
		rows.Close()
		if got.String() != want.String() {
			t.Errorf("activity %d signups in queue order on s%d:\n got %s\nwant %s", a, home, got.String(), want.String())
		}
	}
	for i, db := range e.dbs {
		db.CheckInvariants(t)
		if len(byShard[i]) == 0 {
			continue
		}
		rep, err := audit.Run(context.Background(), audit.Config{Activities: byShard[i]}, audit.Deps{DB: db.DB, JS: e.js})
		if err != nil {
			t.Fatalf("audit of s%d: %v", i, err)
		}
		if !rep.OK {
			t.Errorf("audit of s%d's %d activities: %d divergences, the first %+v", i, len(byShard[i]), len(rep.Divergences), rep.Divergences[0])
		}
	}
}

// move runs a move of p to shard to (Undo when to is ""), stopped after
// step stop ("" runs it whole); it returns what it printed.
func (e *env) move(p int, to, stop string, after func(string)) (string, error) {
	var out bytes.Buffer
	err := Run(context.Background(), Options{Partition: p, Partitions: e.partitions, To: to, Undo: to == "",
		Pools: e.pools, KV: e.kv, JS: e.js, Out: &out, Settle: 3 * time.Second,
		After: func(step string) error {
			if after != nil {
				after(step)
			}
			if step == stop {
				return errKilled
			}
			return nil
		}})
	return out.String(), err
}

var errKilled = errors.New("killed after the step (test)")

// acts are n activity ids.
func acts(n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(1000 + i)
	}
	return out
}

// TestMoveUnderLoad: partition 0 moves from s0 to s1 while requests keep
// coming for every partition: the other partitions' fences advance
// throughout the move; after it every request is applied once, in order,
// on its partition's shard, the audit is clean, nothing of partition 0 is
// left on s0, and an allocator that keeps the old map (routed to s0 at
// epoch 1) commits nothing on either shard.
func TestMoveUnderLoad(t *testing.T) {
	const partitions = 4
	e := newEnv(t, 2, partitions)
	all := acts(24)
	stop, loaded := e.startLoad(all, 30)

	stale := e.staleAllocator(0)
	var atFreeze float64 // what the stale allocator committed before the freeze, when its map was right
	var startsAtFlip int
	fences := map[string]map[int]int64{}
	out, err := e.move(0, "s1", "", func(step string) {
		f := map[int]int64{}
		for p := 1; p < partitions; p++ {
			f[p] = e.fence(e.home(p), p)
		}
		fences[step] = f
		if step == StepFreeze {
			time.Sleep(300 * time.Millisecond) // requests for partition 0 pile up
			atFreeze = stale.commits()
		}
		if step == StepFlip {
			startsAtFlip = stale.starts()
		}
	})
	if err != nil {
		t.Fatalf("move: %v\n%s", err, out)
	}
	t.Logf("move:\n%s", out)
	for p := 1; p < partitions; p++ {
		if fences[StepClean][p] <= fences[StepFreeze][p] {
			t.Errorf("partition %d's fence did not advance during the move: %d at the freeze, %d at the clean", p, fences[StepFreeze][p], fences[StepClean][p])
		}
	}
	time.Sleep(500 * time.Millisecond) // the load goes on, applied on s1
	close(stop)
	if err := <-loaded; err != nil {
		t.Fatal(err)
	}
	stale.stop()
	if n := stale.starts(); n <= startsAtFlip {
		t.Fatalf("the allocator with the old map was not started after the flip (%d starts, %d before it)", n, startsAtFlip)
	}
	if e.home(0) != 1 {
		t.Fatalf("partition 0 on s%d after the move, want s1", e.home(0))
	}
	e.check()
	if left := e.rowsOf(0, 0); len(left) != 0 {
		t.Errorf("partition 0's rows left on s0: %v", left)
	}
	if n := stale.commits(); n != atFreeze {
		t.Errorf("the allocator with the old map committed %v transactions after the freeze", n-atFreeze)
	}
}

// settleSome waits until n joins of the first activities are applied.
func (e *env) settleSome(n int64) {
	e.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for e.dbs[0].Count(e.t, "SELECT COUNT(*) FROM processed_request")+e.dbs[1].Count(e.t, "SELECT COUNT(*) FROM processed_request") < n {
		if time.Now().After(deadline) {
			e.t.Fatal("the load is not applied")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stale is an allocator of one partition whose map stays as it was
// before the move (a bucket of its own, never changed), started again
// each time it stops.
type stale struct {
	done    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	started int
	reg     *prometheus.Registry
	commit  func() float64
}

func (e *env) staleAllocator(p int) *stale {
	t := e.t
	ctx, cancel := context.WithCancel(context.Background())
	kv, err := e.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "STALE_SHARDS"})
	if err != nil {
		t.Fatal(err)
	}
	pl, err := shards.Get(ctx, e.kv, p)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := json.Marshal(pl.Entry)
	if _, err := kv.Put(ctx, shards.Key(p), v); err != nil {
		t.Fatal(err)
	}
	m, err := shards.Watch(ctx, kv)
	if err != nil {
		t.Fatal(err)
	}
	router, err := shards.NewRouter(e.pools, m)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := router.Route(p)
	if err != nil {
		t.Fatal(err)
	}
	s := &stale{done: make(chan struct{})}
	var commits sync.Map
	s.commit = func() float64 {
		n := 0.0
		commits.Range(func(_, v any) bool { n += v.(func() float64)(); return true })
		return n
	}
	cfg := config.Defaults[allocator.Config]()
	cfg.Partitions, cfg.MetricsAddr = e.partitions, ""
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer cancel()
		for i := 0; ; i++ {
			reg := prometheus.NewRegistry()
			a, err := allocator.New(cfg, allocator.Deps{DB: rt.DB, Tenure: router.Tenure(rt), NATS: e.nc, Log: e.log, Partition: p, Registerer: reg,
				Test: allocator.TestHooks{AckWait: 2 * time.Second, IdleCheck: 100 * time.Millisecond}})
			if err == nil && a.Start(ctx) == nil {
				commits.Store(i, func() float64 { return counter(reg, "allot_allocator_transaction_duration_seconds") })
				s.mu.Lock()
				s.started++
				s.mu.Unlock()
				select {
				case <-s.done:
					a.Stop()
					return
				case <-waitCh(a):
				}
			}
			select {
			case <-s.done:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return s
}

func waitCh(a *allocator.Allocator) chan struct{} {
	ch := make(chan struct{})
	go func() { a.Wait(); close(ch) }() //nolint:errcheck // it stops when fenced
	return ch
}

func (s *stale) stop() {
	close(s.done)
	s.wg.Wait()
}

// starts is how many times the stale allocator started.
func (s *stale) starts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started
}

// commits is how many transactions the stale allocator committed.
func (s *stale) commits() float64 { return s.commit() }

// counter reads the sample count of histogram name from reg.
func counter(reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			n += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return n
}

// TestMoveResumesAfterEachStep: partition 0 moves back and forth under
// load, each move stopped after another step (as a kill would) and run
// again: until the flip the map keeps the partition on its old shard,
// from the flip on it names the new one; run again, the move finishes,
// nothing of the partition is left on the other shard, and in the end
// every request is applied once, in order, the audit clean.
func TestMoveResumesAfterEachStep(t *testing.T) {
	const partitions = 2
	e := newEnv(t, 2, partitions)
	all := acts(8)
	stop, loaded := e.startLoad(all, 10)
	for i, step := range []string{StepFreeze, StepCopy, StepVerify, StepFence, StepFlip, StepResume} {
		from, to := i%2, (i+1)%2
		dest := fmt.Sprintf("s%d", to)
		if out, err := e.move(0, dest, step, nil); !errors.Is(err, errKilled) {
			t.Fatalf("move to %s stopped after %s: %v\n%s", dest, step, err, out)
		}
		want := from
		if step == StepFlip || step == StepResume {
			want = to
		}
		if got := e.home(0); got != want {
			t.Fatalf("stopped after %s: the map puts partition 0 on s%d, want s%d", step, got, want)
		}
		out, err := e.move(0, dest, "", nil)
		if err != nil {
			t.Fatalf("move to %s run again after %s: %v\n%s", dest, step, err, out)
		}
		t.Logf("run again after %s:\n%s", step, out)
		if !bytes.Contains([]byte(out), []byte("resume  the move of partition 0")) {
			t.Errorf("the move run again after %s does not say it resumes:\n%s", step, out)
		}
		if got := e.home(0); got != to {
			t.Fatalf("after the move resumed from %s: partition 0 on s%d, want s%d", step, got, to)
		}
		if left := e.rowsOf(from, 0); len(left) != 0 {
			t.Errorf("after the move resumed from %s: partition 0's rows left on s%d: %v", step, from, left)
		}
	}
	close(stop)
	if err := <-loaded; err != nil {
		t.Fatal(err)
	}
	e.check()
}

// TestMoveUndo: a move stopped before the flip is undone: the partition
// applies on its old shard again, nothing of it is left on the other;
// after the flip the undo is refused, and the move run again finishes.
// A move to the shard the partition is on, to an unknown shard or of a
// partition the stream does not have is refused as bad usage.
func TestMoveUndo(t *testing.T) {
	const partitions = 2
	e := newEnv(t, 2, partitions)
	all := acts(8)
	stop, loaded := e.startLoad(all, 10)

	for _, to := range []string{"s0", "s9"} {
		if _, err := e.move(0, to, "", nil); !errors.Is(err, ErrUsage) {
			t.Errorf("move of partition 0 (on s0) to %s: %v, want ErrUsage", to, err)
		}
	}
	if err := Run(context.Background(), Options{Partition: partitions, Partitions: partitions, To: "s1", Pools: e.pools, KV: e.kv, JS: e.js}); !errors.Is(err, ErrUsage) {
		t.Errorf("move of partition %d of %d: %v, want ErrUsage", partitions, partitions, err)
	}

	for _, step := range []string{StepCopy, StepFence} {
		if out, err := e.move(0, "s1", step, nil); !errors.Is(err, errKilled) {
			t.Fatalf("move stopped after %s: %v\n%s", step, err, out)
		}
		out, err := e.move(0, "", "", nil)
		if err != nil {
			t.Fatalf("undo after %s: %v\n%s", step, err, out)
		}
		if e.home(0) != 0 {
			t.Fatalf("undo after %s: partition 0 on s%d, want s0", step, e.home(0))
		}
		if left := e.rowsOf(1, 0); len(left) != 0 {
			t.Errorf("undo after %s: partition 0's rows left on s1: %v", step, left)
		}
		if at, err := store.PartitionEpoch(context.Background(), e.dbs[0], 0); err != nil || at != 1 {
			t.Errorf("undo after %s: partition 0's fence on s0 at epoch %d (%v), want 1", step, at, err)
		}
		e.settle() // applying on s0 again
	}

	if out, err := e.move(0, "s1", StepFlip, nil); !errors.Is(err, errKilled) {
		t.Fatalf("move stopped after the flip: %v\n%s", err, out)
	}
	if _, err := e.move(0, "", "", nil); !errors.Is(err, ErrUsage) {
		t.Errorf("undo after the flip: %v, want ErrUsage (refused)", err)
	}
	if out, err := e.move(0, "s1", "", nil); err != nil {
		t.Fatalf("move run again after the flip: %v\n%s", err, out)
	}
	e.endLoad(stop, loaded)
}

// TestMoveSurvivesRestarts: the allocator process is stopped and started
// anew while partition 0 is frozen (it starts the frozen partition
// waiting, the others applying), and the new shard's server is killed
// after the copy: the move fails, P stays on s0; once the server is back
// the move run again finishes, every request applied once, in order.
func TestMoveSurvivesRestarts(t *testing.T) {
	const partitions = 2
	e := newEnv(t, 2, partitions)
	all := acts(8)
	stop, loaded := e.startLoad(all, 10)
	out, err := e.move(0, "s1", StepCopy, func(step string) {
		if step == StepFreeze {
			e.stopAllocator()
			e.startAllocator()
		}
	})
	if !errors.Is(err, errKilled) {
		t.Fatalf("move stopped after the copy: %v\n%s", err, out)
	}
	if err := e.procs[1].Kill(); err != nil {
		t.Fatal(err)
	}
	if out, err := e.move(0, "s1", "", nil); err == nil {
		t.Fatalf("move with s1 killed: done, want an error\n%s", out)
	}
	if e.home(0) != 0 {
		t.Fatalf("partition 0 on s%d after a failed move, want s0", e.home(0))
	}
	if err := e.procs[1].Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	if out, err := e.move(0, "s1", "", nil); err != nil {
		t.Fatalf("move run again with s1 back: %v\n%s", err, out)
	}
	e.endLoad(stop, loaded)
}

// TestTablesCoverTheSchema: every table the migrations create is either
// copied by a move (tables, with its primary key as the copy's order) or
// named as holding no partition's state (shared): a new table must be
// placed in one of them.
func TestTablesCoverTheSchema(t *testing.T) {
	db := dbtest.New(t)
	ctx := context.Background()
	rows, err := db.QueryContext(ctx, "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	known := map[string]bool{}
	for _, s := range shared {
		known[s] = true
	}
	for _, tb := range tables {
		known[tb.name] = true
		var key []string
		kr, err := db.QueryContext(ctx, "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND CONSTRAINT_NAME = 'PRIMARY' ORDER BY ORDINAL_POSITION", tb.name)
		if err != nil {
			t.Fatal(err)
		}
		for kr.Next() {
			var c string
			if err := kr.Scan(&c); err != nil {
				t.Fatal(err)
			}
			key = append(key, c)
		}
		kr.Close()
		if tb.name == "activity_signup" {
			// Keyed by an auto-increment id the copy leaves out: it pages by
			// the unique key (activity_id, user_id) instead.
			key = []string{"activity_id", "user_id"}
		}
		if fmt.Sprint(key) != fmt.Sprint(tb.key) {
			t.Errorf("table %s: the move pages by %v, its primary key is %v", tb.name, tb.key, key)
		}
	}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		if !known[name] {
			t.Errorf("table %s is neither copied by a move (tables) nor shared: place it", name)
		}
	}
}

// TestMoveInterruptedAnywhere: moves of partition 0, back and forth, each
// cut off after a longer time than the one before (its context ends in
// the middle of whatever it is doing: a copy, a delete, a compare-and-set)
// and run again until one finishes: after every cut the map names one
// shard and the partition's fence row there is the live one or the frozen
// old one; in the end every request is applied once, in order.
func TestMoveInterruptedAnywhere(t *testing.T) {
	const partitions = 2
	e := newEnv(t, 2, partitions)
	all := acts(16)
	stop, loaded := e.startLoad(all, 200)
	cut := 2 * time.Millisecond
	for _, dest := range []string{"s1", "s0", "s1"} {
		for done := false; !done; cut = cut * 3 / 2 {
			ctx, cancel := context.WithTimeout(context.Background(), cut)
			err := Run(ctx, Options{Partition: 0, Partitions: partitions, To: dest, Pools: e.pools, KV: e.kv, JS: e.js, Settle: time.Second})
			cancel()
			done = err == nil
			if err != nil && ctx.Err() == nil {
				t.Fatalf("move to %s cut after %s: %v", dest, cut, err)
			}
			home := e.home(0)
			at, err := store.PartitionEpoch(context.Background(), e.dbs[home], 0)
			if err != nil {
				t.Fatalf("after a cut at %s: partition 0's home s%d has no fence row: %v", cut, home, err)
			}
			pl, _ := shards.Get(context.Background(), e.kv, 0)
			if at != 0 && at != pl.Epoch {
				t.Fatalf("after a cut at %s: partition 0's fence row on s%d at epoch %d, the map's is %d", cut, home, at, pl.Epoch)
			}
		}
		if want := dest; fmt.Sprintf("s%d", e.home(0)) != want {
			t.Fatalf("partition 0 on s%d after the move to %s", e.home(0), dest)
		}
		if _, err := e.kv.Get(context.Background(), shards.MoveKey(0)); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("the move's record is still there after the move to %s: %v", dest, err)
		}
		t.Logf("moved to %s; the last cut %s", dest, cut)
		cut = 2 * time.Millisecond
	}
	e.endLoad(stop, loaded)
}

// TestMoveRefusesADivergentPartition: the partition's state on its old
// shard disagrees with the stream (a confirmed count changed behind the
// allocator's back, after the freeze): the copy is faithful, so the
// checksums agree, but the audit of the partition on the new shard finds
// the divergence and the move stops before the flip; undone, the
// partition applies on its old shard again.
func TestMoveRefusesADivergentPartition(t *testing.T) {
	const partitions = 2
	e := newEnv(t, 2, partitions)
	all := acts(8)
	e.open(all)
	e.settle()
	var victim int64
	for _, a := range all {
		if bus.PartitionOf(a, partitions) == 0 {
			victim = a
			break
		}
	}
	out, err := e.move(0, "s1", "", func(step string) {
		if step != StepFreeze {
			return
		}
		if _, err := e.dbs[0].ExecContext(context.Background(), "UPDATE activity SET capacity = capacity + 1 WHERE id = ?", victim); err != nil {
			t.Error(err)
		}
	})
	if err == nil || !strings.Contains(err.Error(), "divergence") {
		t.Fatalf("move of a partition whose state diverges: %v, want the audit's divergence\n%s", err, out)
	}
	if e.home(0) != 0 {
		t.Fatalf("partition 0 on s%d after a refused move, want s0", e.home(0))
	}
	if out, err := e.move(0, "", "", nil); err != nil {
		t.Fatalf("undo: %v\n%s", err, out)
	}
	if left := e.rowsOf(1, 0); len(left) != 0 {
		t.Errorf("partition 0's rows left on s1 after the undo: %v", left)
	}
}

// TestColumnsAgreeWithTheDictionary: the columns a copy writes, read from
// SHOW CREATE TABLE, are the dictionary's, in its order, less the
// generated and auto-increment ones (activity.is_full, activity_signup.id).
func TestColumnsAgreeWithTheDictionary(t *testing.T) {
	db := dbtest.New(t)
	ctx := context.Background()
	for _, tb := range tables {
		got, err := columns(ctx, db, tb.name)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := db.QueryContext(ctx, "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? "+
			"AND COALESCE(GENERATION_EXPRESSION, '') = '' AND EXTRA NOT LIKE '%auto_increment%' AND EXTRA NOT LIKE '%GENERATED%' ORDER BY ORDINAL_POSITION", tb.name)
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for rows.Next() {
			var c string
			if err := rows.Scan(&c); err != nil {
				t.Fatal(err)
			}
			want = append(want, c)
		}
		rows.Close()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("table %s: columns %v from SHOW CREATE TABLE, %v from the dictionary", tb.name, got, want)
		}
	}
	if _, err := columns(ctx, db, "no_such_table"); err == nil || !strings.Contains(err.Error(), "is missing") {
		t.Errorf("columns of a missing table: %v, want it named missing", err)
	}
	// MySQL 8 prints a generated column with GENERATED ALWAYS AS, MariaDB
	// may print a bare AS (...).
	create := "CREATE TABLE `activity` (\n  `id` bigint NOT NULL AUTO_INCREMENT,\n  `capacity` int NOT NULL,\n" +
		"  `is_full` tinyint GENERATED ALWAYS AS ((`confirmed_count` >= `capacity`)) STORED,\n  `full2` tinyint(1) AS (`a` > 1) VIRTUAL,\n" +
		"  `note` varchar(10) DEFAULT NULL,\n  PRIMARY KEY (`id`),\n  KEY `k` (`capacity`)\n) ENGINE=InnoDB"
	if got := fmt.Sprint(copiedColumns(create)); got != "[capacity note]" {
		t.Errorf("copiedColumns: %s, want [capacity note]", got)
	}
}

// endLoad stops the load, waits for it, and checks that every request
// was applied once, in order, and that nothing of partition 0 is left on
// s0.
func (e *env) endLoad(stop chan struct{}, loaded chan error) {
	e.t.Helper()
	close(stop)
	if err := <-loaded; err != nil {
		e.t.Fatal(err)
	}
	e.check()
	if left := e.rowsOf(0, 0); len(left) != 0 {
		e.t.Errorf("partition 0's rows left on s0: %v", left)
	}
}

// startLoad opens the activities, publishes joins of them until stop is
// closed (endLoad), and returns once settle of them are applied.
func (e *env) startLoad(all []int64, settle int64) (stop chan struct{}, loaded chan error) {
	e.t.Helper()
	e.open(all)
	stop = make(chan struct{})
	loaded = e.load(all, stop)
	e.settleSome(settle)
	return stop, loaded
}
