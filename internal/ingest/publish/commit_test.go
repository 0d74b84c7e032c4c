package publish

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/internal/wire"
)

// commitRig runs a committer against a real JetStream server whose request
// stream allows atomic publish or not. sizes returns the atomic batches'
// sizes so far (the committer counts a batch after answering it, so a
// reader waits for the count it expects).
func commitRig(t *testing.T, atomicOK bool) (c *committer, js jetstream.JetStream, sizes func() []int) {
	t.Helper()
	ns := natstest.New(t)
	nc, js := ns.Connect(t)
	ctx := context.Background()
	var (
		mu  sync.Mutex
		got []int
	)
	cfg := config.Defaults[bus.Config]().RequestStream()
	cfg.AllowAtomicPublish = atomicOK
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	c = &committer{nc: nc, js: js, log: slog.New(slog.NewTextHandler(io.Discard, nil)), in: make(chan *pubRequest, 1024),
		minBatch: 4, maxBatch: 1000, timeout: 5 * time.Second,
		batches: func(n int) { mu.Lock(); got = append(got, n); mu.Unlock() }}
	rctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	c.run(rctx)
	return c, js, func() []int { mu.Lock(); defer mu.Unlock(); return slices.Clone(got) }
}

// publishAll publishes n requests at once, with ids[i] as Nats-Msg-Id, and
// returns the sequence each was acknowledged with.
func publishAll(t *testing.T, c *committer, ids []string) []uint64 {
	t.Helper()
	seqs := make([]uint64, len(ids))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, id := range ids {
		wg.Go(func() {
			<-start
			msg := &nats.Msg{Subject: wire.RequestSubject(int64(1 + i%5)), Data: []byte(`{"n":` + fmt.Sprint(i) + `}`), Header: nats.Header{}}
			res := c.publish(msg, id, time.Now().Add(10*time.Second))
			if res.err != nil {
				t.Errorf("publish %d: %v", i, res.err)
				return
			}
			seqs[i] = res.ack.Sequence
		})
	}
	close(start)
	wg.Wait()
	return seqs
}

// requireStored checks that every id is stored exactly once, at the
// sequence its PubAck named.
func requireStored(t *testing.T, js jetstream.JetStream, ids []string, seqs []uint64) {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stream(ctx, wire.RequestStream)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := st.Info(ctx)
	distinct := map[string]bool{}
	for _, id := range ids {
		distinct[id] = true
	}
	if info.State.Msgs != uint64(len(distinct)) {
		t.Fatalf("%d messages stored for %d distinct ids", info.State.Msgs, len(distinct))
	}
	for i, id := range ids {
		m, err := st.GetMsg(ctx, seqs[i])
		if err != nil {
			t.Fatalf("request %d: seq %d: %v", i, seqs[i], err)
		}
		if got := m.Header.Get(jetstream.MsgIDHeader); got != id {
			t.Fatalf("request %d: seq %d holds %s, want %s", i, seqs[i], got, id)
		}
	}
}

func newIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = uuid.Must(uuid.NewV7()).String()
	}
	return ids
}

// TestGroupCommit: concurrent publishes are committed in atomic batches,
// each request stored once at the sequence its PubAck names.
func TestGroupCommit(t *testing.T) {
	t.Parallel()
	c, js, sizes := commitRig(t, true)
	ids := newIDs(600)
	seqs := publishAll(t, c, ids)
	requireStored(t, js, ids, seqs)
	total := func() int {
		n := 0
		for _, s := range sizes() {
			n += s
		}
		return n
	}
	testenv.WaitFor(t, 5*time.Second, "600 concurrent publishes, some in an atomic batch", func() bool { return total() > 0 })
	t.Logf("%d of 600 requests in %d atomic batches", total(), len(sizes()))
}

// TestGroupCommitFallsBack: a batch holding the same id twice (a retried
// publish) and a stream without atomic publish both end as ordinary
// publishes: every request stored once, repeats answered with the
// original's sequence.
func TestGroupCommitFallsBack(t *testing.T) {
	t.Parallel()
	t.Run("duplicate", func(t *testing.T) {
		t.Parallel()
		c, js, _ := commitRig(t, true)
		ids := newIDs(200)
		for i := 1; i < len(ids); i += 10 {
			ids[i] = ids[i-1]
		}
		seqs := publishAll(t, c, ids)
		requireStored(t, js, ids, seqs)
	})
	t.Run("no atomic publish", func(t *testing.T) {
		t.Parallel()
		c, js, sizes := commitRig(t, false)
		ids := newIDs(200)
		seqs := publishAll(t, c, ids)
		requireStored(t, js, ids, seqs)
		if len(sizes()) != 0 || !c.noAtomic.Load() {
			t.Fatalf("batches %v on a stream that refuses them; noAtomic %v", sizes(), c.noAtomic.Load())
		}
	})
}
