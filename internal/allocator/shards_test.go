package allocator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/devdb"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/internal/wire"
	"github.com/allot-dev/allot/migrations"
)

// shardEnv is a JetStream server and n private MariaDB servers, one
// database on each standing for a shard s0..s<n-1>, with the map seeded
// (partition p on shard p mod n).
type shardEnv struct {
	*env
	procs []*devdb.DB
	dbs   []*dbtest.DB
	pools shards.Pools
}

func newShardEnv(t *testing.T, n, partitions int) *shardEnv {
	t.Helper()
	return newShardEnvEmpty(t, n, partitions, -1)
}

// newShardEnvEmpty is newShardEnv with shard s<empty>'s database not
// migrated (-1: every one is).
func newShardEnvEmpty(t *testing.T, n, partitions, empty int) *shardEnv {
	t.Helper()
	e := &shardEnv{env: &env{t: t, ns: natstest.New(t), log: discardLog()}, pools: shards.Pools{}}
	e.nc, e.js = e.ns.Connect(t)
	e.procs = dbtest.ServerProcs(t, n)
	var names []string
	for i, s := range e.procs {
		open := dbtest.NewOn
		if i == empty {
			open = dbtest.NewEmptyOn
		}
		db := open(t, s.DSN)
		e.dbs = append(e.dbs, db)
		name := fmt.Sprintf("s%d", i)
		names = append(names, name)
		e.pools[name] = db.DB
	}
	if _, err := bus.Setup(context.Background(), e.js, natstest.Config(partitions), names); err != nil {
		t.Fatal(err)
	}
	return e
}

// shardOf is the index of the shard the seed puts partition p on.
func (e *shardEnv) shardOf(p int) int { return p % len(e.dbs) }

// run runs the allocator's Run over every shard until the test ends.
func (e *shardEnv) run(cfg Config) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, Deps{DB: e.pools["s0"], Shards: e.pools, NATS: e.nc, Log: e.log,
			Test: TestHooks{AckWait: 2 * time.Second, IdleCheck: 100 * time.Millisecond}})
	}()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("Run: %v", err)
		}
	})
}

// fence is partition p's fence on shard i (-1 when it has no row there or
// the shard does not answer).
func (e *shardEnv) fence(i, p int) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var last int64
	if err := e.dbs[i].QueryRowContext(ctx, "SELECT last_seq FROM allocator_partition WHERE partition_id = ?", p).Scan(&last); err != nil {
		return -1
	}
	return last
}

// waitFences waits until every partition's fence on its shard reaches
// last[p].
func (e *shardEnv) waitFences(last map[int]uint64, within time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		behind := ""
		for p, want := range last {
			if got := e.fence(e.shardOf(p), p); got < int64(want) {
				behind += fmt.Sprintf(" p%d at %d of %d;", p, got, want)
			}
		}
		if behind == "" {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("fences behind after %s:%s", within, behind)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// burst publishes, for each activity, an open (capacity 3) and five joins
// in order; it returns the requests by activity and the last sequence of
// each partition.
func (e *shardEnv) burst(activities []int64, partitions int, last map[int]uint64) map[int64][]wire.Request {
	out := map[int64][]wire.Request{}
	for _, a := range activities {
		out[a] = append(out[a], open(a, 3))
		for u := int64(1); u <= 5; u++ {
			out[a] = append(out[a], req(wire.OpJoin, a, u))
		}
	}
	for round := range 6 {
		for _, a := range activities {
			seq := e.publish(out[a][round], "")
			p := bus.PartitionOf(a, partitions)
			last[p] = max(last[p], seq)
		}
	}
	return out
}

// checkPlaced checks that each activity's rows are on its partition's
// shard only, each request applied once, in order (users 1..3 confirmed,
// 4 and 5 waiting behind them), and the invariants on every shard.
func (e *shardEnv) checkPlaced(reqs map[int64][]wire.Request, partitions int) {
	t := e.t
	for a, rs := range reqs {
		home := e.shardOf(bus.PartitionOf(a, partitions))
		for i, db := range e.dbs {
			acts := db.Count(t, "SELECT COUNT(*) FROM activity WHERE id = ?", a)
			results := db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE activity_id = ?", a)
			signups := db.Count(t, "SELECT COUNT(*) FROM activity_signup WHERE activity_id = ?", a)
			if i == home {
				if acts != 1 || results != int64(len(rs)) || signups != 5 {
					t.Errorf("activity %d on its shard s%d: %d activity rows, %d results, %d signups; want 1, %d, 5", a, i, acts, results, signups, len(rs))
				}
				continue
			}
			if acts+results+signups != 0 {
				t.Errorf("activity %d (home s%d) has %d activity rows, %d results, %d signups on s%d", a, home, acts, results, signups, i)
			}
		}
		db := e.dbs[home]
		for _, r := range rs {
			if n := db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE request_id = ?", r.RequestID); n != 1 {
				t.Errorf("request %s of activity %d has %d results, want 1", r.RequestID, a, n)
			}
		}
		rows, err := db.Query("SELECT user_id, status FROM activity_signup WHERE activity_id = ? ORDER BY queue_seq", a)
		if err != nil {
			t.Fatal(err)
		}
		var got string
		for rows.Next() {
			var u int64
			var s string
			if err := rows.Scan(&u, &s); err != nil {
				t.Fatal(err)
			}
			got += fmt.Sprintf("%d:%s ", u, s)
		}
		rows.Close()
		if want := "1:CONFIRMED 2:CONFIRMED 3:CONFIRMED 4:WAITING 5:WAITING "; got != want {
			t.Errorf("activity %d signups in queue order: %q, want %q", a, got, want)
		}
	}
	for _, db := range e.dbs {
		db.CheckInvariants(t)
	}
}

func activities(n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(1000 + i)
	}
	return out
}

// TestPartitionsApplyOnTheirShards: three shards, six partitions, sixty
// activities: each activity's state is on its partition's shard and
// nowhere else, every request applied once, in order.
func TestPartitionsApplyOnTheirShards(t *testing.T) {
	const partitions = 6
	e := newShardEnv(t, 3, partitions)
	e.run(conf(func(c *Config) { c.Partitions = partitions; c.MetricsAddr = ""; c.BatchSize = 50 }))
	last := map[int]uint64{}
	reqs := e.burst(activities(60), partitions, last)
	if len(last) != partitions {
		t.Fatalf("the activities reach %d partitions, want all %d", len(last), partitions)
	}
	e.waitFences(last, time.Minute)
	e.checkPlaced(reqs, partitions)
	for p := range partitions {
		for i := range e.dbs {
			if i != e.shardOf(p) && e.fence(i, p) != -1 {
				t.Errorf("partition %d (on s%d) has a fence row on s%d", p, e.shardOf(p), i)
			}
		}
	}
}

// TestDeadShardStopsOnlyItsPartitions: one shard's server is killed; the
// other shards' partitions keep applying; restarted, the dead shard's
// partitions catch up, every request applied once, in order.
func TestDeadShardStopsOnlyItsPartitions(t *testing.T) {
	const partitions = 6
	e := newShardEnv(t, 3, partitions)
	e.run(conf(func(c *Config) { c.Partitions = partitions; c.MetricsAddr = ""; c.BatchSize = 50 }))
	last := map[int]uint64{}
	first := e.burst(activities(30), partitions, last)
	e.waitFences(last, time.Minute)

	if err := e.procs[1].Kill(); err != nil {
		t.Fatal(err)
	}
	more := e.burst(activities(60)[30:], partitions, last)
	alive := map[int]uint64{}
	for p, seq := range last {
		if e.shardOf(p) != 1 {
			alive[p] = seq
		}
	}
	// The live shards' fences pass every request while s1 is down.
	e.waitFences(alive, time.Minute)
	for p := range partitions {
		if e.shardOf(p) == 1 {
			if got := e.fence(1, p); got != -1 {
				t.Fatalf("shard s1 answers (partition %d at %d) while killed", p, got)
			}
		}
	}
	if err := e.procs[1].Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.waitFences(last, 2*time.Minute)
	for a, rs := range more {
		first[a] = rs
	}
	e.checkPlaced(first, partitions)
}

// TestStaleEpochCommitsNothing: a transaction of partition 0 at an epoch
// the fence row is no longer at commits nothing, whether the map or the
// row moved on; with both at the new epoch it applies. Once the map puts
// the partition on another shard, the allocator still pointed at the old
// one commits nothing there nor on the new one, and stops with ErrFenced.
func TestStaleEpochCommitsNothing(t *testing.T) {
	e := newShardEnv(t, 2, 1)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // ends the router's watch
	kv, err := e.js.KeyValue(ctx, shards.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	router, err := shards.Load(ctx, e.js, e.pools, e.log)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := router.Route(0)
	if err != nil {
		t.Fatal(err)
	}
	if rt.Shard != "s0" || rt.Epoch != 1 {
		t.Fatalf("partition 0 routed to %s at epoch %d, want s0 at 1", rt.Shard, rt.Epoch)
	}
	db := e.dbs[0]
	a, err := New(conf(nil), Deps{DB: rt.DB, Tenure: router.Tenure(rt), NATS: e.nc, Log: e.log, Test: TestHooks{AckWait: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.prepare(ctx); err != nil {
		t.Fatal(err)
	}
	e.publish(open(1, 10), "")
	if err := a.handle(ctx, fetch(t, a, 1)); err != nil {
		t.Fatal(err)
	}
	if got := e.fence(0, 0); got != 1 {
		t.Fatalf("fence %d after the open, want 1", got)
	}

	// The row moves on (a move, or an operator, raised it): the
	// allocator's map still says 1.
	if ok, err := store.SetEpoch(ctx, db, 0, 1, 2); err != nil || !ok {
		t.Fatalf("SetEpoch 1→2: %v, %v", ok, err)
	}
	e.publish(req(wire.OpJoin, 1, 1), "")
	msgs := fetch(t, a, 1)
	if err := a.handle(ctx, msgs); !errors.Is(err, store.ErrEpoch) {
		t.Fatalf("handle at a stale map epoch: %v, want ErrEpoch", err)
	}
	if got, n := e.fence(0, 0), db.Count(t, "SELECT COUNT(*) FROM processed_request"); got != 1 || n != 1 {
		t.Fatalf("after a stale transaction: fence %d, %d results; want 1 and 1 (nothing committed)", got, n)
	}

	// The map catches up (the watch brings it): the same batch applies.
	rev := func() uint64 { p, _ := shards.Read(ctx, kv); return p[0].Revision }()
	if _, err := shards.Update(ctx, kv, 0, shards.Entry{Shard: "s0", Epoch: 2}, rev); err != nil {
		t.Fatal(err)
	}
	waitEpoch(t, router, 0, 2)
	if err := a.handle(ctx, msgs); err != nil {
		t.Fatalf("handle at the new epoch: %v", err)
	}
	if got := e.fence(0, 0); got != 2 {
		t.Fatalf("fence %d at the new epoch, want 2", got)
	}

	// The map moves on alone (a move's last step), the row stays at 2:
	// again nothing commits.
	rev = func() uint64 { p, _ := shards.Read(ctx, kv); return p[0].Revision }()
	if _, err := shards.Update(ctx, kv, 0, shards.Entry{Shard: "s0", Epoch: 3}, rev); err != nil {
		t.Fatal(err)
	}
	waitEpoch(t, router, 0, 3)
	e.publish(req(wire.OpJoin, 1, 2), "")
	if err := a.handle(ctx, fetch(t, a, 1)); !errors.Is(err, store.ErrEpoch) {
		t.Fatalf("handle against a row behind the map: %v, want ErrEpoch", err)
	}
	// A frozen row (epoch NULL, a move's first step) matches no epoch.
	if ok, err := store.SetEpoch(ctx, db, 0, 2, 0); err != nil || !ok {
		t.Fatalf("freeze: %v, %v", ok, err)
	}
	if err := a.handle(ctx, nil); !errors.Is(err, store.ErrEpoch) {
		t.Fatalf("handle against a frozen row: %v, want ErrEpoch", err)
	}
	if got, n := e.fence(0, 0), db.Count(t, "SELECT COUNT(*) FROM processed_request"); got != 2 || n != 2 {
		t.Fatalf("after stale transactions: fence %d, %d results; want 2 and 2", got, n)
	}

	// A move's last steps: the fence row on s1 at epoch 4, the map to
	// {s1, 4}. The allocator routed to s0 finds its row frozen, sees the
	// move and stops; s1 is left as the move wrote it.
	if _, err := e.dbs[1].ExecContext(ctx, "INSERT INTO allocator_partition (partition_id, last_seq, epoch) VALUES (0, 2, 4)"); err != nil {
		t.Fatal(err)
	}
	rev = func() uint64 { p, _ := shards.Read(ctx, kv); return p[0].Revision }()
	if _, err := shards.Update(ctx, kv, 0, shards.Entry{Shard: "s1", Epoch: 4}, rev); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !a.deps.Tenure.Moved() {
		if time.Now().After(deadline) {
			t.Fatal("the allocator's tenure did not see the move")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := a.handleUntilDone(ctx, nil); !errors.Is(err, ErrFenced) {
		t.Fatalf("the allocator on the old shard after a move: %v, want ErrFenced", err)
	}
	if got, n := e.fence(0, 0), db.Count(t, "SELECT COUNT(*) FROM processed_request"); got != 2 || n != 2 {
		t.Fatalf("old shard after the move: fence %d, %d results; want 2 and 2", got, n)
	}
	if got, n := e.fence(1, 0), e.dbs[1].Count(t, "SELECT COUNT(*) FROM processed_request"); got != 2 || n != 0 {
		t.Fatalf("new shard after the move: fence %d, %d results; want 2 and 0", got, n)
	}
	db.CheckInvariants(t)
}

func waitEpoch(t *testing.T, r *shards.Router, p int, want uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rt, err := r.Route(p)
		if err == nil && rt.Epoch == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the router's epoch of partition %d is %d, want %d", p, rt.Epoch, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFrozenPartitionWaitsAlone: partition 0's fence row is frozen (a
// move's first step) under a running allocator: partition 1 keeps
// applying, partition 0 applies nothing, and is not given up as stalled
// (its stall timeout passes meanwhile); thawed (the move undone), it
// catches up in the same process, every request once, in order.
func TestFrozenPartitionWaitsAlone(t *testing.T) {
	const partitions = 2
	e := newShardEnv(t, 2, partitions)
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// giveUps is the partitions' count of give-ups, from /metrics.
	giveUps := func() float64 {
		resp, err := http.Get("http://" + ln.Addr().String() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		n := 0.0
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, "allot_allocator_stall_giveups_total{") {
				var v float64
				fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
				n += v
			}
		}
		return n
	}
	cfg := conf(func(c *Config) {
		c.Partitions = partitions
		c.BatchSize = 50
		c.StallTimeout = time.Second
	})
	done := make(chan error, 1)
	rctx, cancel := context.WithCancel(ctx)
	go func() {
		done <- Run(rctx, cfg, Deps{DB: e.pools["s0"], Shards: e.pools, NATS: e.nc, Log: e.log, MetricsListener: ln,
			Test: TestHooks{AckWait: 2 * time.Second, IdleCheck: 100 * time.Millisecond}})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	last := map[int]uint64{}
	reqs := e.burst(activities(10), partitions, last)
	e.waitFences(last, time.Minute)
	frozenAt := uint64(e.fence(0, 0))
	if ok, err := store.SetEpoch(ctx, e.dbs[0], 0, 1, 0); err != nil || !ok {
		t.Fatalf("freeze: %v, %v", ok, err)
	}
	more := e.burst(activities(20)[10:], partitions, last)
	e.waitFences(map[int]uint64{1: last[1]}, time.Minute)
	time.Sleep(2 * cfg.StallTimeout) // past the stall timeout, frozen
	if got := e.fence(0, 0); uint64(got) != frozenAt {
		t.Fatalf("frozen partition 0's fence moved from %d to %d", frozenAt, got)
	}
	if n := giveUps(); n != 0 {
		t.Errorf("partition 0, frozen past its stall timeout, was given up %v times, want never", n)
	}
	if ok, err := store.Thaw(ctx, e.dbs[0], 0, 1); err != nil || !ok {
		t.Fatalf("thaw: %v, %v", ok, err)
	}
	e.waitFences(last, time.Minute)
	for a, rs := range more {
		reqs[a] = rs
	}
	e.checkPlaced(reqs, partitions)

}

// TestStartsWithAShardDown: of three shards, s1 (never migrated) is
// killed before the allocator starts. The allocator starts anyway: the
// other shards' partitions apply a burst, /readyz answers 200 naming s1
// down, allot_allocator_shard_up reads 0 for s1. Restarted, s1 is
// migrated in the background and its partitions catch up in the same
// process, every request applied once, in order; the gauge reads 1. The
// log says s1 is down once and back once, however many times it was
// tried.
func TestStartsWithAShardDown(t *testing.T) {
	const partitions = 6
	e := newShardEnvEmpty(t, 3, partitions, 1)
	logs := &lines{}
	e.log = slog.New(slog.NewTextHandler(logs, nil))
	if err := e.procs[1].Kill(); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + ln.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	var tries atomic.Int64 // of s1, while it does not answer
	tried := func(shard string) {
		if shard == "s1" {
			tries.Add(1)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, conf(func(c *Config) { c.Partitions = partitions; c.BatchSize = 50 }),
			Deps{DB: e.pools["s0"], Shards: e.pools, NATS: e.nc, Log: e.log, MetricsListener: ln,
				Test: TestHooks{AckWait: 2 * time.Second, IdleCheck: 100 * time.Millisecond, ShardTried: tried}})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	last := map[int]uint64{}
	reqs := e.burst(activities(30), partitions, last)
	alive := map[int]uint64{}
	for p, seq := range last {
		if e.shardOf(p) != 1 {
			alive[p] = seq
		}
	}
	if len(alive) != 4 || len(last) != partitions {
		t.Fatalf("the burst reaches partitions %v, %v on s0 and s2; want all six, four", last, alive)
	}
	e.waitFences(alive, time.Minute)
	testenv.WaitFor(t, 30*time.Second, "/readyz 200 naming s1 down", func() bool {
		code, body := get("/readyz")
		return code == http.StatusOK && strings.Contains(body, `"s1":"down"`) && strings.Contains(body, `"s0":"up"`)
	})
	_, metrics := get("/metrics")
	for _, want := range []string{`allot_allocator_shard_up{shard="s0"} 1`, `allot_allocator_shard_up{shard="s1"} 0`, `allot_allocator_shard_up{shard="s2"} 1`} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("/metrics lacks %q while s1 is down", want)
		}
	}
	select {
	case err := <-done:
		t.Fatalf("Run returned while s1 was down: %v", err)
	default:
	}

	// Tried a few times, said once.
	testenv.WaitFor(t, 30*time.Second, "three tries of s1", func() bool { return tries.Load() >= 3 })
	if err := e.procs[1].Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	more := e.burst(activities(40)[30:], partitions, last)
	e.waitFences(last, 2*time.Minute)
	files, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	if n := e.dbs[1].Count(t, "SELECT COUNT(*) FROM schema_migration"); n != int64(len(files)) {
		t.Errorf("s1 has %d migrations recorded, want %d", n, len(files))
	}
	for a, rs := range more {
		reqs[a] = rs
	}
	e.checkPlaced(reqs, partitions)
	testenv.WaitFor(t, 10*time.Second, "allot_allocator_shard_up 1 for s1", func() bool {
		_, metrics := get("/metrics")
		return strings.Contains(metrics, `allot_allocator_shard_up{shard="s1"} 1`+"\n")
	})
	if code, body := get("/readyz"); code != http.StatusOK || strings.Contains(body, "down") {
		t.Errorf("/readyz with every shard back: %d %s", code, body)
	}
	for msg, want := range map[string]int{"MySQL shard does not answer": 1, "MySQL shard answers again: migrated": 1} {
		if n := logs.count(msg); n != want {
			t.Errorf("the log says %q %d times, want %d:\n%s", msg, n, want, logs)
		}
	}
}

// TestShardThatFailsToMigrateStopsTheStart: a shard that answers but
// whose migration fails stops the allocator, with an error naming it (a
// schema it cannot bring up to date is no outage to wait out).
func TestShardThatFailsToMigrateStopsTheStart(t *testing.T) {
	e := newShardEnvEmpty(t, 2, 2, 1)
	// schema_migration as a view without its column: its read fails.
	if _, err := e.dbs[1].Exec("CREATE VIEW schema_migration AS SELECT 1 AS x"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := Run(ctx, conf(func(c *Config) { c.Partitions = 2; c.MetricsAddr = "" }),
		Deps{DB: e.pools["s0"], Shards: e.pools, NATS: e.nc, Log: e.log, Test: TestHooks{AckWait: 2 * time.Second}})
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "shard s1: ") {
		t.Fatalf("Run with s1's migration failing: %v, want an error naming shard s1", err)
	}
}

// lines is a log sink safe for concurrent writes.
type lines struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// count is the number of lines holding s.
func (l *lines) count(s string) int {
	n := 0
	for _, line := range strings.Split(l.String(), "\n") {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

// TestPeerTakesAShardDownAtStart: two allocator processes; process A
// cannot reach s1 from its start (its route refuses), B can. A gives s1's
// partitions up to its peers while it waits, so B applies them: every
// request of every partition is applied once, in order. A's route back,
// A starts them too and nothing is applied twice.
func TestPeerTakesAShardDownAtStart(t *testing.T) {
	const partitions = 4
	e := newShardEnv(t, 2, partitions)
	cfg, err := mysql.ParseDSN(e.dbs[1].DSN)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.NewProxy(t, cfg.Addr)
	proxy.Refuse()
	cfg.Addr = proxy.Addr()
	viaProxy, err := store.OpenLater(cfg.FormatDSN(), 8)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { viaProxy.Close() })
	var tries atomic.Int64 // A's of s1
	run := func(pools shards.Pools, tried func(string)) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- Run(ctx, conf(func(c *Config) { c.Partitions = partitions; c.MetricsAddr = ""; c.BatchSize = 50 }),
				Deps{DB: pools["s0"], Shards: pools, NATS: e.nc, Log: e.log,
					Test: TestHooks{AckWait: 2 * time.Second, IdleCheck: 100 * time.Millisecond, ShardTried: tried}})
		}()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	run(shards.Pools{"s0": e.pools["s0"], "s1": viaProxy}, func(string) { tries.Add(1) })
	run(e.pools, nil)
	testenv.WaitFor(t, 30*time.Second, "A tried s1", func() bool { return tries.Load() >= 1 })

	last := map[int]uint64{}
	reqs := e.burst(activities(20), partitions, last)
	e.waitFences(last, time.Minute)
	proxy.Forward()
	more := e.burst(activities(40)[20:], partitions, last)
	e.waitFences(last, time.Minute)
	for a, rs := range more {
		reqs[a] = rs
	}
	e.checkPlaced(reqs, partitions)
}

// TestHungShardDoesNotHoldUpTheOthers: s1's route hangs (nothing passes,
// nothing is refused) from before the start: s0's partitions start and
// apply a burst all the same; the route back, s1's partitions catch up.
func TestHungShardDoesNotHoldUpTheOthers(t *testing.T) {
	const partitions = 2
	e := newShardEnv(t, 2, partitions)
	cfg, err := mysql.ParseDSN(e.dbs[1].DSN)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.NewProxy(t, cfg.Addr)
	proxy.Hang()
	cfg.Addr = proxy.Addr()
	viaProxy, err := store.OpenLater(cfg.FormatDSN(), 8)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { viaProxy.Close() })
	e.pools = shards.Pools{"s0": e.pools["s0"], "s1": viaProxy}
	e.run(conf(func(c *Config) { c.Partitions = partitions; c.MetricsAddr = ""; c.BatchSize = 50 }))
	last := map[int]uint64{}
	reqs := e.burst(activities(10), partitions, last)
	e.waitFences(map[int]uint64{0: last[0]}, time.Minute)
	if got := e.fence(1, 1); got != 0 && got != -1 {
		t.Fatalf("partition 1 at %d on s1 while its route hangs", got)
	}
	proxy.Forward()
	e.waitFences(last, time.Minute)
	e.checkPlaced(reqs, partitions)
}
