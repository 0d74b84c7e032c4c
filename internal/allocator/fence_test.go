package allocator

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/wire"
)

// fetch pulls n messages from a's consumer, as the apply loop would.
func fetch(t *testing.T, a *Allocator, n int) []jetstream.Msg {
	t.Helper()
	batch, err := a.cons.Fetch(n, jetstream.FetchMaxWait(5*time.Second), jetstream.FetchPriorityGroup(bus.PriorityGroup))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	if len(msgs) != n {
		t.Fatalf("fetched %d messages, want %d", len(msgs), n)
	}
	return msgs
}

// TestRedeliveryDoesNotProveAGap: a redelivery of a message the fence
// already covers carries a delivery sequence past deliveries this
// allocator never saw. Taking it as the last delivery handled made the
// next first delivery look contiguous, and the fence jumped over the
// messages between: fetch and hold, idle walk, drop
// two, redeliver the first, publish one more.
func TestRedeliveryDoesNotProveAGap(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	a, err := New(conf(nil), Deps{DB: e.db.DB, NATS: e.nc, Log: e.log, Test: TestHooks{AckWait: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.prepare(ctx); err != nil {
		t.Fatal(err)
	}
	e.publish(open(1, 10), "")
	e.publish(req(wire.OpJoin, 1, 1), "")
	held := fetch(t, a, 2) // delivery sequences 1 and 2, held

	// Idle: the allocator walks the stream and applies both itself.
	if err := a.handle(ctx, nil); err != nil {
		t.Fatal(err)
	}
	e.waitFence(2)

	// Two more are delivered (3 and 4) and dropped on the way.
	dropped := []wire.Request{req(wire.OpJoin, 1, 2), req(wire.OpJoin, 1, 3)}
	for _, r := range dropped {
		e.publish(r, "")
	}
	fetch(t, a, 2)

	// The first held message comes again (delivery 5): already applied.
	if err := held[0].Nak(); err != nil {
		t.Fatal(err)
	}
	again := fetch(t, a, 1)
	if md, _ := again[0].Metadata(); md.NumDelivered != 2 || md.Sequence.Stream != 1 {
		t.Fatalf("fetched stream seq %d delivered %d times, want seq 1 redelivered", md.Sequence.Stream, md.NumDelivered)
	}
	if err := a.handle(ctx, again); err != nil {
		t.Fatal(err)
	}

	// One more (delivery 6): it must not pass as the next run after 5.
	next := req(wire.OpJoin, 1, 4)
	last := e.publish(next, "")
	if err := a.handle(ctx, fetch(t, a, 1)); err != nil {
		t.Fatal(err)
	}
	e.waitFence(last)
	for i, r := range append(dropped, next) {
		// e.result fails the test when the fence skipped the request.
		if got := e.result(r.RequestID).Seq; got != uint64(3+i) {
			t.Errorf("user %d applied at seq %d, want %d", r.UserID, got, 3+i)
		}
	}
	e.db.CheckInvariants(t)
}
