package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/wire"
)

func benchDrain(b *testing.B, cfg DrainConfig) {
	if testing.Short() {
		b.Skip("benchmark")
	}
	b.ReportAllocs()
	var rate float64
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		db := dbtest.New(b)
		ns := natstest.New(b)
		nc, _ := ns.Connect(b)
		b.StartTimer()
		res, err := Drain(context.Background(), db.DB, nc, slog.New(slog.NewTextHandler(io.Discard, nil)), cfg)
		if err != nil {
			b.Fatal(err)
		}
		rate = res.PerSecond()
	}
	b.ReportMetric(rate, "decisions/s")
}

func BenchmarkDrainHotJoin(b *testing.B) {
	benchDrain(b, DrainConfig{Requests: 20000, Activities: 1, Capacity: 100, Op: wire.OpJoin, Batch: 100})
}

// BenchmarkDrainHotJoinSingles is DrainHotJoin with one request per
// message: what batches save the allocator.
func BenchmarkDrainHotJoinSingles(b *testing.B) {
	benchDrain(b, DrainConfig{Requests: 20000, Activities: 1, Capacity: 100, Op: wire.OpJoin})
}

func BenchmarkDrainHotClaim(b *testing.B) {
	benchDrain(b, DrainConfig{Requests: 20000, Activities: 1, Capacity: 100, Op: wire.OpClaim, Users: 18000, Batch: 100})
}

func BenchmarkDrainSpreadJoin(b *testing.B) {
	benchDrain(b, DrainConfig{Requests: 20000, Activities: 1000, Capacity: 10, Op: wire.OpJoin, Batch: 100})
}

// TestDrainSmall keeps the harness honest in the ordinary test run, with
// one request per message and with batches (of 7, so that each activity
// ends with a shorter one).
func TestDrainSmall(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 7} {
		t.Run(fmt.Sprintf("batch-%d", batch), func(t *testing.T) {
			db := dbtest.New(t)
			ns := natstest.New(t)
			nc, _ := ns.Connect(t)
			res, err := Drain(context.Background(), db.DB, nc, slog.New(slog.NewTextHandler(io.Discard, nil)),
				DrainConfig{Requests: 300, Activities: 3, Capacity: 10, Op: wire.OpJoin, Batch: batch})
			if err != nil {
				t.Fatal(err)
			}
			if res.Decisions != 303 {
				t.Fatalf("decisions %d, want 303", res.Decisions)
			}
			if n := db.Count(t, "SELECT COUNT(*) FROM processed_request"); n != 303 {
				t.Fatalf("results %d, want 303", n)
			}
			// 3 opens, then each activity's 100 joins in messages of batch.
			wantMsgs := 3 + 3*((100+batch-1)/batch)
			if n := db.Count(t, "SELECT COUNT(DISTINCT seq) FROM processed_request"); n != int64(wantMsgs) {
				t.Fatalf("requests came in %d messages, want %d", n, wantMsgs)
			}
			// The line is in arrival order: user u joined before user u+3.
			if n := db.Count(t, `SELECT COUNT(*) FROM activity_signup a JOIN activity_signup b
				ON a.activity_id = b.activity_id AND b.user_id = a.user_id + 3 WHERE a.queue_seq >= b.queue_seq`); n != 0 {
				t.Fatalf("%d signups out of arrival order", n)
			}
			db.CheckInvariants(t)
			t.Logf("drained %d decisions at %.0f/s", res.Decisions, res.PerSecond())
		})
	}
}

// TestHoldsSmall keeps the holds benchmark honest in the ordinary test run:
// every hold given by one resize expires, once, through the stream.
func TestHoldsSmall(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ns := natstest.New(t)
	nc, _ := ns.Connect(t)
	res, err := Holds(context.Background(), db.DB, nc, slog.New(slog.NewTextHandler(io.Discard, nil)),
		HoldsConfig{Holds: 500, Hold: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExpiriesPerSecond() <= 0 || res.JoinsPerSecond() <= 0 || len(res.Probes) == 0 {
		t.Fatalf("nothing measured: %+v", res)
	}
}

// TestDrainShardsSmall keeps the shard drain honest: over two servers,
// each partition's requests are applied on the shard the map names for it
// (partition p on shard p mod 2), none elsewhere, and every request once.
func TestDrainShardsSmall(t *testing.T) {
	t.Parallel()
	bases := dbtest.Servers(t, 2)
	dbs := []*dbtest.DB{dbtest.NewOn(t, bases[0]), dbtest.NewOn(t, bases[1])}
	pools := shards.Pools{"s0": dbs[0].DB, "s1": dbs[1].DB}
	ns := natstest.New(t)
	nc, _ := ns.Connect(t)
	const partitions, activities, requests = 4, 40, 400
	res, err := DrainShards(context.Background(), pools, []string{"s0", "s1"}, nc, slog.New(slog.NewTextHandler(io.Discard, nil)),
		ShardsConfig{Partitions: partitions, Drain: DrainConfig{Requests: requests, Activities: activities, Capacity: 5, Op: wire.OpJoin, Batch: 7}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Decisions != requests+activities {
		t.Fatalf("decisions %d, want %d", res.Decisions, requests+activities)
	}
	if !slices.Equal(res.PartitionsOf["s0"], []int{0, 2}) || !slices.Equal(res.PartitionsOf["s1"], []int{1, 3}) {
		t.Fatalf("partitions by shard %v, want s0 [0 2], s1 [1 3]", res.PartitionsOf)
	}
	var total int64
	for s, db := range dbs {
		for a := int64(1); a <= activities; a++ {
			n := db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE activity_id = ?", a)
			mine := bus.PartitionOf(a, partitions)%2 == s
			if want := map[bool]int64{true: 1 + requests/activities, false: 0}[mine]; n != want {
				t.Fatalf("shard s%d holds %d results of activity %d (partition %d), want %d", s, n, a, bus.PartitionOf(a, partitions), want)
			}
			total += n
		}
		db.CheckInvariants(t)
	}
	if total != requests+activities {
		t.Fatalf("%d results in all, want %d", total, requests+activities)
	}
}

// TestMoveShardsSmall keeps the move's measurement honest: over two
// servers, partition 0 (on s0) is moved to s1 while the others drain; its
// report's seven steps are read, the requests that arrived while it was
// frozen are applied on s1, and afterwards every request is applied once,
// partition 0's results all on s1, none left on s0.
func TestMoveShardsSmall(t *testing.T) {
	t.Parallel()
	bases := dbtest.Servers(t, 2)
	dbs := []*dbtest.DB{dbtest.NewOn(t, bases[0]), dbtest.NewOn(t, bases[1])}
	pools := shards.Pools{"s0": dbs[0].DB, "s1": dbs[1].DB}
	ns := natstest.New(t)
	nc, _ := ns.Connect(t)
	const partitions, activities, signups, requests, during, waiting = 4, 40, 300, 400, 600, 50
	res, err := MoveShards(context.Background(), pools, []string{"s0", "s1"}, nc, slog.New(slog.NewTextHandler(io.Discard, nil)),
		MoveConfig{Partitions: partitions, Partition: 0, To: "s1", Activities: activities, Capacity: 5,
			Signups: signups, Requests: requests, DuringRequests: during, Waiting: waiting, Batch: 7, Settle: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("move:\n%s", res.Report)
	if res.From != "s0" || res.To != "s1" {
		t.Fatalf("moved from %s to %s, want s0 to s1", res.From, res.To)
	}
	var names []string
	for _, s := range res.Steps {
		names = append(names, s.Name)
	}
	if want := []string{"freeze", "copy", "verify", "fence", "flip", "resume", "clean"}; !slices.Equal(names, want) {
		t.Fatalf("steps %v, want %v", names, want)
	}
	if res.Frozen <= 0 || res.Took < res.Frozen {
		t.Fatalf("frozen for %s of a move of %s", res.Frozen, res.Took)
	}
	if !strings.Contains(res.Steps[5].Detail, "applied on s1") {
		t.Fatalf("resume step %q: the requests that waited were not applied on s1", res.Steps[5].Detail)
	}
	if res.Signups != signups {
		t.Fatalf("partition 0 held %d signups at the move, want %d", res.Signups, signups)
	}
	// Partition 0's activities are of 1 to 40, the others' of each
	// drain the others of the next 40 ids.
	var mine []any
	theirs := make([]int, 5) // by drain, and the warm-up's
	for a := int64(1); a <= 5*activities; a++ {
		k := int((a - 1) / activities)
		switch {
		case k > 0 && bus.PartitionOf(a, partitions) != 0:
			theirs[k]++
		case k == 0 && bus.PartitionOf(a, partitions) == 0:
			mine = append(mine, a)
		}
	}
	opens := int64(len(mine) + theirs[1] + theirs[2] + theirs[3] + theirs[4])
	if want := opens + signups + 2*requests + during + requests/10 + waiting; res.Requests != want {
		t.Fatalf("%d requests counted, want %d", res.Requests, want)
	}
	in := strings.TrimSuffix(strings.Repeat("?,", len(mine)), ",")
	for _, q := range []string{"SELECT COUNT(*) FROM processed_request WHERE partition_id = 0",
		"SELECT COUNT(*) FROM activity_signup WHERE activity_id IN (" + in + ")"} {
		args := mine
		if !strings.Contains(q, "IN") {
			args = nil
		}
		if n := dbs[0].Count(t, q, args...); n != 0 {
			t.Fatalf("s0 still holds %d rows of partition 0 (%s)", n, q)
		}
	}
	if n, want := dbs[1].Count(t, "SELECT COUNT(*) FROM processed_request WHERE partition_id = 0"), int64(len(mine)+signups+waiting); n != want {
		t.Fatalf("s1 holds %d results of partition 0, want %d", n, want)
	}
	if n := dbs[1].Count(t, "SELECT COUNT(*) FROM activity_signup WHERE activity_id IN ("+in+")", mine...); n != signups+waiting {
		t.Fatalf("s1 holds %d signups of partition 0, want %d", n, signups+waiting)
	}
	var total int64
	for _, db := range dbs {
		total += db.Count(t, "SELECT COUNT(*) FROM processed_request")
	}
	if total != res.Requests {
		t.Fatalf("%d results on both shards, want %d", total, res.Requests)
	}
	// Each drain is measured while every other partition had requests
	// waiting: some of its requests, never more than it had.
	for i, d := range []struct {
		r   DrainResult
		max int
	}{{res.Without, requests + theirs[1]}, {res.During, during + theirs[2]}, {res.WithoutAfter, requests + theirs[3]}} {
		if d.r.Decisions <= 0 || d.r.Decisions > d.max || d.r.Elapsed <= 0 {
			t.Fatalf("drain %d of the others: %d requests in %s, of %d", i+1, d.r.Decisions, d.r.Elapsed, d.max)
		}
	}
	if !res.Covered && res.Until == "" {
		t.Fatal("the drain with the move neither lasted the move nor says at which step it ended")
	}
	if res.Audit == "" {
		t.Fatal("no audit after the move")
	}
}
