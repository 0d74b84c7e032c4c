package shards_test

import (
	"context"
	"database/sql"
	"log/slog"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // the pools are opened, never used

	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/shards"
)

// pools opens a pool per name; none connects (sql.Open is lazy).
func pools(t *testing.T, names ...string) shards.Pools {
	t.Helper()
	ps := shards.Pools{}
	for _, n := range names {
		db, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/"+n)
		if err != nil {
			t.Fatal(err)
		}
		ps[n] = db
	}
	t.Cleanup(ps.Close)
	return ps
}

// TestRouterWithoutTheBucket: a deployment set up before the map existed
// (no bucket ALLOT_SHARDS) applies every partition on its one shard at
// epoch 1; with several shards the allocator refuses, saying to run
// `allotctl setup`.
func TestRouterWithoutTheBucket(t *testing.T) {
	t.Parallel()
	s := natstest.New(t)
	_, js := s.Connect(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	one := pools(t, shards.DefaultName)
	r, err := shards.Load(ctx, js, one, log)
	if err != nil {
		t.Fatal(err)
	}
	for p := range 4 {
		rt, err := r.Route(p)
		if err != nil || rt.Shard != shards.DefaultName || rt.DB != one[shards.DefaultName] || rt.Epoch != 1 {
			t.Fatalf("partition %d routed to %+v, %v; want default at epoch 1", p, rt, err)
		}
		if tn := r.Tenure(rt); tn.Epoch() != 1 || tn.Moved() {
			t.Fatalf("partition %d tenure at %d, moved %v", p, tn.Epoch(), tn.Moved())
		}
	}
	_, err = shards.Load(ctx, js, pools(t, "s0", "s1"), log)
	if err == nil || !strings.Contains(err.Error(), "allotctl setup") {
		t.Fatalf("two shards without the map: %v, want a refusal naming allotctl setup", err)
	}
}

// TestRouterFollowsTheMap: routes follow the watched map; a tenure sees
// its epoch change and a move to another shard (epoch 0 then: no fence
// row matches it); a shard the configuration lacks is an error.
func TestRouterFollowsTheMap(t *testing.T) {
	t.Parallel()
	s, kv := setUp(t, 3, "s0", "s1")
	_, js := s.Connect(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ps := pools(t, "s0", "s1")
	r, err := shards.Load(ctx, js, ps, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := r.Route(1)
	if err != nil || rt.Shard != "s1" || rt.DB != ps["s1"] || rt.Epoch != 1 {
		t.Fatalf("partition 1 routed to %+v, %v; want s1 at epoch 1", rt, err)
	}
	tn := r.Tenure(rt)
	m, err := shards.Read(ctx, kv)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := shards.Update(ctx, kv, 1, shards.Entry{Shard: "s0", Epoch: 2}, m[1].Revision); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !tn.Moved() {
		if time.Now().After(deadline) {
			t.Fatal("the tenure did not see the move")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if tn.Epoch() != 0 {
		t.Fatalf("a moved tenure's epoch is %d, want 0", tn.Epoch())
	}
	if rt, err := r.Route(1); err != nil || rt.Shard != "s0" || rt.Epoch != 2 {
		t.Fatalf("partition 1 after the move routed to %+v, %v; want s0 at 2", rt, err)
	}
	if _, err := shards.Update(ctx, kv, 2, shards.Entry{Shard: "s9", Epoch: 2}, m[2].Revision); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := r.Route(2)
		if err != nil && strings.Contains(err.Error(), `"s9"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("partition 2 on an unknown shard: %v, want an error naming it", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
