package shards_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/shards"
)

// setUp runs the setup step with partitions and shard names and opens the
// map's bucket as a runtime binary would (CheckBucket).
func setUp(t *testing.T, partitions int, names ...string) (*natstest.Server, jetstream.KeyValue) {
	t.Helper()
	s := natstest.New(t)
	s.Setup(t, natstest.Config(partitions), names...)
	_, js := s.Connect(t)
	kv, err := bus.CheckBucket(context.Background(), js, bus.ShardsBucketConfig(1))
	if err != nil {
		t.Fatal(err)
	}
	return s, kv
}

func shardsOf(t *testing.T, kv jetstream.KeyValue) []string {
	t.Helper()
	m, err := shards.Read(context.Background(), kv)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for i, pl := range m {
		if pl.Partition != i || pl.Epoch != 1 || pl.Revision == 0 {
			t.Fatalf("placement %d is %+v", i, pl)
		}
		out = append(out, pl.Shard)
	}
	return out
}

func TestSetupSeedsPartitionModShards(t *testing.T) {
	s, kv := setUp(t, 5, "a", "b")
	want := []string{"a", "b", "a", "b", "a"}
	if got := shardsOf(t, kv); !equal(got, want) {
		t.Fatalf("seeded %v, want %v", got, want)
	}
	// A second setup with three shards keeps every entry as it is.
	s.Setup(t, natstest.Config(5), "a", "b", "c")
	if got := shardsOf(t, kv); !equal(got, want) {
		t.Fatalf("after a setup with another number of shards: %v, want %v", got, want)
	}
}

func TestSetupWithoutShardsSeedsDefault(t *testing.T) {
	_, kv := setUp(t, 2)
	if got := shardsOf(t, kv); !equal(got, []string{shards.DefaultName, shards.DefaultName}) {
		t.Fatalf("seeded %v", got)
	}
}

func TestConcurrentUpdateOneWins(t *testing.T) {
	_, kv := setUp(t, 1, "a", "b")
	ctx := context.Background()
	m, err := shards.Read(ctx, kv)
	if err != nil {
		t.Fatal(err)
	}
	rev := m[0].Revision
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			_, errs[i] = shards.Update(ctx, kv, 0, shards.Entry{Shard: "b", Epoch: 2}, rev)
		})
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, shards.ErrStale):
			t.Errorf("a losing update says %v, want ErrStale", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d updates from revision %d won, want exactly 1", won, rev)
	}
	m, err = shards.Read(ctx, kv)
	if err != nil {
		t.Fatal(err)
	}
	if m[0].Shard != "b" || m[0].Epoch != 2 || m[0].Revision <= rev {
		t.Fatalf("after the update: %+v", m[0])
	}
}

func TestWatchSeesAFlip(t *testing.T) {
	_, kv := setUp(t, 2, "a", "b")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, err := shards.Watch(ctx, kv)
	if err != nil {
		t.Fatal(err)
	}
	if m.Shard(0) != "a" || m.Shard(1) != "b" || m.Epoch(1) != 1 {
		t.Fatalf("initial map: p0 %s p1 %s epoch %d", m.Shard(0), m.Shard(1), m.Epoch(1))
	}
	pl, _ := m.Get(1)
	changed := m.Changed()
	if _, err := shards.Update(ctx, kv, 1, shards.Entry{Shard: "a", Epoch: 2}, pl.Revision); err != nil {
		t.Fatal(err)
	}
	for m.Epoch(1) != 2 {
		select {
		case <-changed:
			changed = m.Changed()
		case <-time.After(10 * time.Second):
			t.Fatal("the watch did not see the update within 10s")
		}
	}
	if m.Shard(1) != "a" || m.Shard(0) != "a" || m.Epoch(0) != 1 {
		t.Fatalf("after the flip: p0 %s/%d p1 %s/%d", m.Shard(0), m.Epoch(0), m.Shard(1), m.Epoch(1))
	}
	if m.Shard(7) != "" {
		t.Fatalf("a partition without an entry has shard %q", m.Shard(7))
	}
	cancel()
	<-m.Done()
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestMoveRecordsArePassedOver: a move's record (key move.<P>) in the
// bucket is no entry of the map: Read lists the partitions only, a watch
// started with one there, or seeing one written, reads no error, and Get
// reads the partition's entry.
func TestMoveRecordsArePassedOver(t *testing.T) {
	_, kv := setUp(t, 2, "a", "b")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := kv.Put(ctx, shards.MoveKey(0), []byte(`{"from":"a","to":"b","epoch":1,"state":"moving"}`)); err != nil {
		t.Fatal(err)
	}
	m, err := shards.Watch(ctx, kv)
	if err != nil {
		t.Fatalf("watch with a move record there: %v", err)
	}
	if got := shardsOf(t, kv); !equal(got, []string{"a", "b"}) {
		t.Errorf("Read with a move record there: %v, want [a b]", got)
	}
	changed := m.Changed()
	if _, err := kv.Put(ctx, shards.MoveKey(1), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, shards.Key(1), []byte(`{"shard":"a","epoch":2}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch saw no change")
	}
	for deadline := time.Now().Add(10 * time.Second); m.Epoch(1) != 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the watch has partition 1 at epoch %d, want 2", m.Epoch(1))
		}
	}
	if err := m.Err(); err != nil {
		t.Errorf("the watch after a move record was written: %v", err)
	}
	if pl, err := shards.Get(ctx, kv, 0); err != nil || pl.Shard != "a" || pl.Epoch != 1 {
		t.Errorf("Get(0): %+v, %v; want a at 1", pl, err)
	}
}
