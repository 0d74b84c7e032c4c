package audit_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/audit"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/store/checkpoint"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/internal/wire"
)

// shardedEnv is a JetStream server, three private MariaDB servers (shards
// s0, s1, s2, the map seeded partition p on s<p mod 3>) and the real
// allocator applying six partitions on them.
type shardedEnv struct {
	*env
	dbs        []*dbtest.DB
	pools      shards.Pools
	partitions int
}

func newShardedEnv(t *testing.T, n, partitions int) *shardedEnv {
	t.Helper()
	e := &shardedEnv{env: &env{t: t, ns: natstest.New(t)}, pools: shards.Pools{}, partitions: partitions}
	e.nc, e.js = e.ns.Connect(t)
	var names []string
	for i, base := range dbtest.Servers(t, n) {
		db := dbtest.NewOn(t, base)
		e.dbs = append(e.dbs, db)
		names = append(names, fmt.Sprintf("s%d", i))
		e.pools[names[i]] = db.DB
	}
	if _, err := bus.Setup(context.Background(), e.js, natstest.Config(partitions), names); err != nil {
		t.Fatal(err)
	}
	cfg := config.Defaults[allocator.Config]()
	cfg.Partitions, cfg.MetricsAddr, cfg.BatchSize = partitions, "", 50
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- allocator.Run(ctx, cfg, allocator.Deps{DB: e.dbs[0].DB, Shards: e.pools, NATS: e.nc, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("allocator.Run: %v", err)
		}
	})
	return e
}

// home is the index of the shard holding activity's partition.
func (e *shardedEnv) home(activity int64) int {
	return bus.PartitionOf(activity, e.partitions) % len(e.dbs)
}

// publish stores reqs in order and waits until every partition's fence,
// on its shard, has passed them.
func (e *shardedEnv) apply(reqs []wire.Request) {
	e.t.Helper()
	last := map[int]uint64{}
	for _, r := range reqs {
		p := bus.PartitionOf(r.ActivityID, e.partitions)
		last[p] = max(last[p], e.publish(r, ""))
	}
	testenv.WaitFor(e.t, time.Minute, "every partition applied on its shard", func() bool {
		for p, want := range last {
			if e.dbs[p%len(e.dbs)].Count(e.t, "SELECT COALESCE(MAX(last_seq), 0) FROM allocator_partition WHERE partition_id = ?", p) < int64(want) {
				return false
			}
		}
		return true
	})
}

// auditAll audits every shard.
func (e *shardedEnv) auditAll(cfg audit.Config, pools shards.Pools) (audit.Report, error) {
	return audit.Run(context.Background(), cfg, audit.Deps{Shards: pools, JS: e.js})
}

// shardReport is rep's report of shard name.
func shardReport(t *testing.T, rep audit.Report, name string) audit.ShardReport {
	t.Helper()
	for _, s := range rep.Shards {
		if s.Shard == name {
			return s
		}
	}
	t.Fatalf("no report of shard %s in %+v", name, rep.Shards)
	return audit.ShardReport{}
}

// TestAuditEveryShard: three shards, six partitions, 66 activities
// applied by the real allocator: each activity's rows are on its shard
// only and every request is applied once; the audit of every shard is
// clean, shard by shard; a tampered row on one shard is a divergence of
// that shard only, at its request; rows of an activity copied onto a
// shard that does not own its partition are a divergence there; a
// partition caught in a move and a shard that does not answer are errors
// naming them, with the other shards still reported; from checkpoints
// taken on every shard, the audit is clean.
func TestAuditEveryShard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const partitions = 6
	e := newShardedEnv(t, 3, partitions)

	var reqs []wire.Request
	acts := make([]int64, 66)
	for i := range acts {
		acts[i] = int64(100 + i)
		reqs = append(reqs, openReq(acts[i], 3))
	}
	for u := int64(1); u <= 5; u++ {
		for _, a := range acts {
			reqs = append(reqs, newReq(wire.OpJoin, a, u))
		}
	}
	for _, a := range acts {
		reqs = append(reqs, newReq(wire.OpCancel, a, 2)) // promotes user 4
	}
	seen := map[int]bool{}
	for _, a := range acts {
		seen[bus.PartitionOf(a, partitions)] = true
	}
	if len(seen) != partitions {
		t.Fatalf("the activities reach %d partitions, want %d", len(seen), partitions)
	}
	e.apply(reqs)

	// Every activity's rows on its shard only; each request applied once.
	for _, a := range acts {
		for i, db := range e.dbs {
			n := db.Count(t, "SELECT (SELECT COUNT(*) FROM activity WHERE id = ?) + (SELECT COUNT(*) FROM activity_signup WHERE activity_id = ?)"+
				" + (SELECT COUNT(*) FROM processed_request WHERE activity_id = ?) + (SELECT COUNT(*) FROM waitlist_bucket WHERE activity_id = ?)", a, a, a, a)
			if i == e.home(a) && db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE activity_id = ? AND events IS NOT NULL", a) != 7 {
				t.Errorf("activity %d: not 7 results with their outbox events on its shard s%d", a, i)
			}
			if i != e.home(a) && n != 0 {
				t.Errorf("activity %d (on s%d) has %d rows on s%d", a, e.home(a), n, i)
			}
		}
	}
	for p := range partitions {
		for i, db := range e.dbs {
			n := db.Count(t, "SELECT (SELECT COUNT(*) FROM allocator_partition WHERE partition_id = ?) + (SELECT COUNT(*) FROM event_relay WHERE partition_id = ?)", p, p)
			if want := int64(2); i == p%3 && n != want || i != p%3 && n != 0 {
				t.Errorf("partition %d: %d fence and relay rows on s%d", p, n, i)
			}
		}
	}
	for _, r := range reqs {
		var n int64
		for _, db := range e.dbs {
			n += db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE request_id = ?", r.RequestID)
		}
		if n != 1 {
			t.Fatalf("request %s has %d results over the shards, want 1", r.RequestID, n)
		}
	}
	for _, db := range e.dbs {
		db.CheckInvariants(t)
	}

	// Clean, shard by shard.
	rep, err := e.auditAll(audit.Config{}, e.pools)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || len(rep.Divergences) != 0 || len(rep.Shards) != 3 {
		t.Fatalf("clean shards: ok %v, %d shards, divergences:%s", rep.OK, len(rep.Shards), divergences(rep.Divergences))
	}
	if rep.Compared != len(reqs) || rep.ActivitiesChecked != len(acts) {
		t.Errorf("compared %d requests and %d activities over the shards, want %d and %d", rep.Compared, rep.ActivitiesChecked, len(reqs), len(acts))
	}
	for i := range 3 {
		s := shardReport(t, rep, fmt.Sprintf("s%d", i))
		want := 0
		for _, a := range acts {
			if e.home(a) == i {
				want += 7
			}
		}
		if !slices.Equal(s.Partitions, []int{i, i + 3}) || !s.OK || s.Compared != want || s.Error != "" {
			t.Errorf("shard s%d: partitions %v, ok %v, compared %d, error %q; want [%d %d], ok, %d", i, s.Partitions, s.OK, s.Compared, s.Error, i, i+3, want)
		}
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"== shard s0 (partitions 0, 3) ==", "== shard s2 (partitions 2, 5) ==", "shards: s0 OK, s1 OK, s2 OK\nOK\n"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("report text lacks %q:\n%s", want, text.String())
		}
	}
	var back audit.Report
	if b, err := json.Marshal(rep); err != nil || json.Unmarshal(b, &back) != nil || len(back.Shards) != 3 || back.Shards[1].Shard != "s1" || back.Shards[1].Compared == 0 {
		t.Errorf("the JSON report does not carry the shards: %+v (%v)", back.Shards, err)
	}

	// A tampered row on s1: s1's divergence only, at the request that
	// last changed the row.
	var tampered int64
	for _, a := range acts {
		if e.home(a) == 1 {
			tampered = a
			break
		}
	}
	s1 := e.dbs[1]
	if _, err := s1.ExecContext(ctx, "UPDATE activity_signup SET status = 'CANCELLED' WHERE activity_id = ? AND user_id = 1", tampered); err != nil {
		t.Fatal(err)
	}
	rep, err = e.auditAll(audit.Config{}, e.pools)
	if _, err := s1.ExecContext(ctx, "UPDATE activity_signup SET status = 'CONFIRMED' WHERE activity_id = ? AND user_id = 1", tampered); err != nil {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || len(rep.Divergences) != 1 {
		t.Fatalf("a tampered row on s1: ok %v, want one divergence, got:%s", rep.OK, divergences(rep.Divergences))
	}
	d := rep.Divergences[0]
	if d.Shard != "s1" || d.Kind != audit.KindSignup || d.ActivityID != tampered || d.UserID != 1 || d.Seq == 0 || d.RequestID == "" {
		t.Errorf("divergence %+v, want s1's signup of activity %d user 1 at its request", d, tampered)
	}
	if s := shardReport(t, rep, "s1"); s.OK || len(s.Divergences) != 1 {
		t.Errorf("s1's report: ok %v, %d divergences; want the one", s.OK, len(s.Divergences))
	}
	for _, name := range []string{"s0", "s2"} {
		if s := shardReport(t, rep, name); !s.OK || len(s.Divergences) != 0 {
			t.Errorf("%s's report: ok %v, divergences:%s", name, s.OK, divergences(s.Divergences))
		}
	}
	text.Reset()
	rep.WriteText(&text) //nolint:errcheck
	t.Logf("report of a tampered s1:\n%s", text.String())
	if want := "request_id " + d.RequestID + " shard s1 activity "; !strings.Contains(text.String(), want) || !strings.HasSuffix(text.String(), "shards: s0 OK, s1 1 divergence(s), s2 OK\n1 divergence(s)\n") {
		t.Errorf("report text of a tampered s1 lacks %q or the verdicts:\n%s", want, text.String())
	}

	// An activity of s0 copied onto s2: misplaced there.
	var copied int64
	for _, a := range acts {
		if e.home(a) == 0 {
			copied = a
			break
		}
	}
	copyRows(t, e.dbs[0], e.dbs[2], copied)
	rep, err = e.auditAll(audit.Config{}, e.pools)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || len(rep.Divergences) != 1 {
		t.Fatalf("an activity copied onto s2: want one divergence, got:%s", divergences(rep.Divergences))
	}
	d = rep.Divergences[0]
	first := e.dbs[0].Count(t, "SELECT MIN(seq) FROM processed_request WHERE activity_id = ?", copied)
	if d.Shard != "s2" || d.Kind != audit.KindMisplaced || d.ActivityID != copied || d.Seq != uint64(first) || d.RequestID == "" ||
		!strings.Contains(d.Actual, "5 activity_signup") || !strings.Contains(d.Actual, "7 processed_request") || !strings.Contains(d.Expected, "is on shard s0") {
		t.Errorf("divergence %+v, want activity %d misplaced on s2 at seq %d", d, copied, first)
	}
	// The same check of one database for the partition it holds: the
	// copy is of another partition, so not this audit's business.
	p2 := []int{2, 5}
	if r, err := audit.Run(ctx, audit.Config{Partitions: p2}, audit.Deps{DB: e.dbs[2].DB, JS: e.js}); err != nil || !r.OK || r.Compared != shardReport(t, rep, "s2").Compared {
		t.Errorf("audit of s2's database for partitions %v: %v, ok %v, compared %d:%s", p2, err, r.OK, r.Compared, divergences(r.Divergences))
	}
	for _, deps := range []audit.Deps{{DB: e.dbs[2].DB, JS: e.js}, {Shards: e.pools, JS: e.js}} {
		if _, err := audit.Run(ctx, audit.Config{Partitions: []int{partitions}}, deps); !errors.Is(err, audit.ErrInvalidConfig) || !strings.Contains(err.Error(), "has 6 partitions") {
			t.Errorf("partition %d of %d: %v, want ErrInvalidConfig", partitions, partitions, err)
		}
	}
	// Partition 0 alone, over the shards: s0's compared, and the copy on
	// s2 (of activity copied, partition 0 or 3) still seen when it is of 0.
	if r, err := e.auditAll(audit.Config{Partitions: []int{bus.PartitionOf(copied, partitions)}}, e.pools); err != nil || r.OK || len(r.Divergences) != 1 ||
		r.Divergences[0].Kind != audit.KindMisplaced || shardReport(t, r, "s1").Compared != 0 || shardReport(t, r, "s0").Compared == 0 {
		var b bytes.Buffer
		r.WriteText(&b) //nolint:errcheck
		t.Errorf("the copied activity's partition alone: %v, ok %v, divergences:%s\n%s", err, r.OK, divergences(r.Divergences), b.String())
	}
	for _, table := range []string{"activity WHERE id = ?", "activity_signup WHERE activity_id = ?", "processed_request WHERE activity_id = ?"} {
		if _, err := e.dbs[2].ExecContext(ctx, "DELETE FROM "+table, copied); err != nil {
			t.Fatal(err)
		}
	}

	// A move's copy of partition 0 on s1 (its fence row at the next
	// epoch) before the map names s1: the audit waits for the move.
	if _, err := e.dbs[1].ExecContext(ctx, "INSERT INTO allocator_partition (partition_id, last_seq, epoch) VALUES (0, 1, 2)"); err != nil {
		t.Fatal(err)
	}
	_, err = e.auditAll(audit.Config{}, e.pools)
	if _, derr := e.dbs[1].ExecContext(ctx, "DELETE FROM allocator_partition WHERE partition_id = 0"); derr != nil {
		t.Fatal(derr)
	}
	if !errors.Is(err, audit.ErrShard) || !strings.Contains(err.Error(), "partition 0") || !strings.Contains(err.Error(), "being moved") {
		t.Errorf("a move under way: %v, want ErrShard naming partition 0", err)
	}

	// A shard that does not answer: an error naming it; the others are
	// audited.
	dead, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/allot")
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	down := shards.Pools{"s0": e.pools["s0"], "s1": e.pools["s1"], "s2": dead}
	rep, err = e.auditAll(audit.Config{}, down)
	if !errors.Is(err, audit.ErrShard) || !strings.Contains(err.Error(), "shard s2") {
		t.Fatalf("a shard down: %v, want ErrShard naming s2", err)
	}
	if s := shardReport(t, rep, "s2"); s.Error == "" || !slices.Equal(s.Partitions, []int{2, 5}) {
		t.Errorf("s2 down: its report %+v, want its error and partitions", s)
	}
	if s := shardReport(t, rep, "s0"); !s.OK || s.Compared == 0 {
		t.Errorf("s0 with s2 down: ok %v, compared %d; want audited and clean", s.OK, s.Compared)
	}
	if rep.OK {
		t.Error("a report with a shard not audited is OK")
	}

	// Checkpoints on every shard, more traffic, and the audit from them.
	for p := range partitions {
		db := e.dbs[p%3]
		if _, ok, err := checkpoint.Take(ctx, db.DB, p, partitions, func(a int64) bool { return bus.PartitionOf(a, partitions) == p }); err != nil || !ok {
			t.Fatalf("checkpoint of partition %d: %v, %v", p, ok, err)
		}
	}
	var more []wire.Request
	for _, a := range acts {
		more = append(more, newReq(wire.OpJoin, a, 6), newReq(wire.OpCancel, a, 1))
	}
	e.apply(more)
	rep, err = e.auditAll(audit.Config{FromCheckpoint: true}, e.pools)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || len(rep.Checkpoints) != partitions || rep.Compared != len(more) {
		t.Fatalf("from checkpoints: ok %v, %d checkpoints, %d compared (want %d, %d):%s", rep.OK, len(rep.Checkpoints), rep.Compared, partitions, len(more), divergences(rep.Divergences))
	}
	for _, c := range rep.Checkpoints {
		if want := fmt.Sprintf("s%d", c.Partition%3); c.Shard != want || !c.DigestOK {
			t.Errorf("checkpoint of partition %d read on %s (digest ok %v), want %s", c.Partition, c.Shard, c.DigestOK, want)
		}
	}
}

// copyRows copies activity's activity, activity_signup and
// processed_request rows from one database to another.
func copyRows(t *testing.T, from, to *dbtest.DB, activity int64) {
	t.Helper()
	ctx := context.Background()
	for _, q := range []struct{ cols, table, key string }{
		{"id, capacity, confirmed_count, next_seq", "activity", "id"},
		{"activity_id, user_id, status, queue_seq", "activity_signup", "activity_id"},
		{"partition_id, seq, batch_index, request_id, op, activity_id, user_id, outcome, applied_at", "processed_request", "activity_id"},
	} {
		rows, err := from.QueryContext(ctx, "SELECT "+q.cols+" FROM "+q.table+" WHERE "+q.key+" = ?", activity)
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			marks := strings.TrimSuffix(strings.Repeat("?, ", len(cols)), ", ")
			if _, err := to.ExecContext(ctx, "INSERT INTO "+q.table+" ("+q.cols+") VALUES ("+marks+")", vals...); err != nil {
				t.Fatal(err)
			}
		}
		rows.Close()
	}
}
