package ui

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/wire"
)

// TestStateShowsThePartitionsProgress: the state names the activity's
// partition and how its allocator does: stalled while requests wait and
// none was applied for StalledAfter, idle once every request is
// acknowledged, with when the last one was and when the holder took the
// partition.
func TestStateShowsThePartitionsProgress(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fastConfig())
	ctx := context.Background()
	cons, err := bus.EnsureAllocatorConsumer(ctx, f.js, bus.ConsumerConfig{Partition: 0, Partitions: 1,
		MaxAckPending: 100, AckWait: time.Minute, PinnedTTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	f.openActivity(1, 10, 0, 1)
	for u := range int64(3) {
		natstest.PublishRequest(t, f.js, wire.Request{RequestID: "00000000-0000-7000-8000-00000000000" + string(rune('1'+u)),
			Op: wire.OpJoin, ActivityID: 1, UserID: u + 1, ReceivedAt: time.Now().UTC()}, "")
	}
	read := func(at time.Time) *Partition {
		t.Helper()
		st, err := f.srv.readState(ctx, 1, at)
		if err != nil {
			t.Fatal(err)
		}
		if st.Partition == nil {
			t.Fatal("the state has no partition")
		}
		return st.Partition
	}
	// Nothing was ever applied and three wait: no allocator makes progress.
	if p := read(time.Now()); p.ID != 0 || p.Waiting != 3 || !p.Stalled || p.LastApplied != nil || p.PinnedSince != nil {
		t.Fatalf("before any allocator pulled: %+v, want 3 waiting, stalled, never applied, pinned to none", *p)
	}
	// An allocator takes the partition and applies every request.
	batch, err := cons.Fetch(3, jetstream.FetchMaxWait(5*time.Second), jetstream.FetchPriorityGroup(bus.PriorityGroup))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 3 {
		t.Fatalf("fetched %d, want 3", n)
	}
	p := read(time.Now())
	if p.Waiting != 0 || p.Stalled || p.LastApplied == nil || p.PinnedSince == nil {
		t.Fatalf("after the allocator applied everything: %+v, want idle, a last applied time and a pin", *p)
	}
	// One more waits; it is stalled only once StalledAfter passed without
	// an ack (the snapshot's time says when it is read).
	natstest.PublishRequest(t, f.js, wire.Request{RequestID: "00000000-0000-7000-8000-000000000009",
		Op: wire.OpJoin, ActivityID: 1, UserID: 9, ReceivedAt: time.Now().UTC()}, "")
	if p := read(time.Now()); p.Waiting != 1 || p.Stalled {
		t.Fatalf("a request just stored: %+v, want 1 waiting, not stalled", *p)
	}
	if p := read(time.Now().Add(StalledAfter + time.Second)); !p.Stalled {
		t.Fatalf("no ack for longer than %s with a request waiting: %+v, want stalled", StalledAfter, *p)
	}
}
