package allocator

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/shards"
	"github.com/allot-dev/allot/internal/store/schema"
	"github.com/allot-dev/allot/internal/wire"
)

// TestSingleDatabaseUpgrade: a deployment of one database from before
// shards (no fence epochs, no shard map) is upgraded in place. The
// migration puts its fences at epoch 1; the allocator applies every
// partition on its one database without the map; once setup creates the
// map (every partition on shard "default" at epoch 1), a restarted
// allocator goes on as before. Every request is applied once, in order,
// on the one database.
func TestSingleDatabaseUpgrade(t *testing.T) {
	const partitions = 2
	ctx := context.Background()
	db := dbtest.New(t)
	e := &shardEnv{env: &env{t: t, db: db, ns: natstest.New(t), log: discardLog()},
		dbs: []*dbtest.DB{db}, pools: shards.Pools{shards.DefaultName: db.DB}}
	e.nc, e.js = e.ns.Connect(t)
	if _, err := bus.Setup(ctx, e.js, natstest.Config(partitions), nil); err != nil {
		t.Fatal(err)
	}
	cfg := conf(func(c *Config) { c.Partitions = partitions; c.MetricsAddr = ""; c.BatchSize = 20 })
	acts := activities(18)
	reqs := map[int64][]wire.Request{}
	last := map[int]uint64{}
	keep := func(m map[int64][]wire.Request) {
		for a, rs := range m {
			reqs[a] = rs
		}
	}

	// Before the upgrade: the database as the release before shards left
	// it (no epoch column, its migration not recorded), no map bucket.
	if err := e.js.DeleteKeyValue(ctx, shards.Bucket); err != nil {
		t.Fatal(err)
	}
	stop := e.runUntil(cfg)
	keep(e.burst(acts[:6], partitions, last))
	e.waitFences(last, time.Minute)
	stop()
	for _, q := range []string{
		"ALTER TABLE allocator_partition DROP COLUMN epoch",
		"DELETE FROM schema_migration WHERE version = '0012_partition_epoch.sql'",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	// The upgrade: migrations, then the allocator without a map.
	if err := schema.Migrate(ctx, db.DB); err != nil {
		t.Fatal(err)
	}
	if n := db.Count(t, "SELECT COUNT(*) FROM allocator_partition WHERE epoch = 1"); n != partitions {
		t.Fatalf("%d fence rows at epoch 1 after the upgrade, want %d", n, partitions)
	}
	stop = e.runUntil(cfg)
	keep(e.burst(acts[6:12], partitions, last))
	e.waitFences(last, time.Minute)
	stop()

	// Setup creates the map: every partition on the one shard, epoch 1.
	if _, err := bus.Setup(ctx, e.js, natstest.Config(partitions), nil); err != nil {
		t.Fatal(err)
	}
	kv, err := e.js.KeyValue(ctx, shards.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	m, err := shards.Read(ctx, kv)
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != partitions {
		t.Fatalf("the map has %d entries, want %d", len(m), partitions)
	}
	for _, pl := range m {
		if pl.Shard != shards.DefaultName || pl.Epoch != 1 {
			t.Fatalf("partition %d is on %q at epoch %d, want %q at 1", pl.Partition, pl.Shard, pl.Epoch, shards.DefaultName)
		}
	}
	stop = e.runUntil(cfg)
	keep(e.burst(acts[12:], partitions, last))
	e.waitFences(last, time.Minute)
	stop()
	e.checkPlaced(reqs, partitions)
}

// runUntil runs the allocator's Run over e's shards until the returned
// stop is called (or the test ends).
func (e *shardEnv) runUntil(cfg Config) (stop func()) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	first := e.pools.Names()[0]
	go func() {
		done <- Run(ctx, cfg, Deps{DB: e.pools[first], Shards: e.pools, NATS: e.nc, Log: e.log,
			Test: TestHooks{AckWait: 2 * time.Second, IdleCheck: 100 * time.Millisecond}})
	}()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("Run: %v", err)
		}
	}
	e.t.Cleanup(stop)
	return stop
}
