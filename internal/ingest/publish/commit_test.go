package publish

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"runtime"
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

// commitRig is a committer against a real JetStream server whose request
// stream allows atomic publish or not, not running yet (start runs it).
// sizes returns the atomic batches' sizes so far (the committer counts a
// batch after answering it, so a reader waits for the count it expects).
type commitRig struct {
	c     *committer
	js    jetstream.JetStream
	mu    sync.Mutex
	sizes []int
}

func newCommitRig(t *testing.T, atomicOK bool, batchMax int) *commitRig {
	t.Helper()
	ns := natstest.New(t)
	nc, js := ns.Connect(t)
	cfg := config.Defaults[bus.Config]().RequestStream()
	cfg.AllowAtomicPublish = atomicOK
	if _, err := js.CreateStream(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	r := &commitRig{js: js}
	r.c = &committer{nc: nc, js: js, log: slog.New(slog.NewTextHandler(io.Discard, nil)), in: make(chan *pubRequest, 4096),
		minBatch: 4, maxBatch: 1000, batchMax: batchMax,
		batches: func(n int) { r.mu.Lock(); r.sizes = append(r.sizes, n); r.mu.Unlock() }}
	return r
}

func (r *commitRig) start(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r.c.run(ctx)
}

func (r *commitRig) batches() []int { r.mu.Lock(); defer r.mu.Unlock(); return slices.Clone(r.sizes) }

// placed is where a request was stored.
type placed struct {
	place   uint64
	batched bool
}

// Ways publishAll queues its requests.
const (
	concurrent = iota // all at once, the committer running
	queued            // all at once, the committer started once all are queued (one group)
	inOrder           // one after another in the order of ids, then the committer started
)

// publishAll publishes one claim per id, ids[i] on activity
// 1+i%activities, queued as how says, and returns each one's place.
func publishAll(t *testing.T, r *commitRig, ids []string, activities int, how int) []placed {
	t.Helper()
	out := make([]placed, len(ids))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, id := range ids {
		wg.Go(func() {
			if how != inOrder {
				<-start
			}
			data, _ := json.Marshal(wire.Request{RequestID: id, Op: wire.OpClaim, ActivityID: int64(1 + i%activities), UserID: int64(i + 1)})
			msg := &nats.Msg{Subject: wire.RequestSubject(int64(1 + i%activities)), Data: data, Header: nats.Header{}}
			res := r.c.publish(msg, wire.OpClaim, id, time.Now().Add(10*time.Second))
			if res.err != nil {
				t.Errorf("publish %d: %v", i, res.err)
				return
			}
			out[i] = placed{wire.Place(res.ack.Sequence, res.index), res.batched}
		})
		if how == inOrder {
			for deadline := time.Now().Add(10 * time.Second); len(r.c.in) <= i; {
				if time.Now().After(deadline) {
					t.Fatalf("request %d not queued", i)
				}
				runtime.Gosched()
			}
		}
	}
	close(start)
	if how != concurrent {
		testenv.WaitFor(t, 10*time.Second, "every request queued", func() bool { return len(r.c.in) == len(ids) })
	}
	r.start(t)
	wg.Wait()
	return out
}

// stored reads the request stream: the request id at every place, and the
// Nats-Msg-Id of every message.
func stored(t *testing.T, js jetstream.JetStream) (ids map[uint64]string, msgIDs []string) {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stream(ctx, wire.RequestStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids = map[uint64]string{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
		msgIDs = append(msgIDs, m.Header.Get(jetstream.MsgIDHeader))
		ops := m.Header.Get(wire.OpsHeader)
		ds, err := wire.DecodeMessage(m.Subject, m.Header.Get(wire.BatchHeader), m.Data)
		if err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
		var want []wire.Op
		for _, d := range ds {
			if d.Err != nil {
				t.Fatalf("seq %d#%d: %v", seq, d.Index, d.Err)
			}
			ids[wire.Place(seq, d.Index)] = d.Request.RequestID
			want = append(want, d.Request.Op)
		}
		if ops != wire.OpsOf(want...) {
			t.Fatalf("seq %d: %s %q, want %q", seq, wire.OpsHeader, ops, wire.OpsOf(want...))
		}
		if len(ds) == 1 && m.Header.Get(wire.BatchHeader) == "" && msgIDs[len(msgIDs)-1] != ds[0].Request.RequestID {
			t.Fatalf("seq %d: a single request stored with Nats-Msg-Id %s, want its request id", seq, msgIDs[len(msgIDs)-1])
		}
	}
	return ids, msgIDs
}

// requireStored checks that every request id is stored exactly once, at
// the place its PubAck named, and that no Nats-Msg-Id is stored twice; it
// returns the number of messages stored.
func requireStored(t *testing.T, js jetstream.JetStream, ids []string, got []placed) int {
	t.Helper()
	at, msgIDs := stored(t, js)
	distinct := map[string]bool{}
	for _, id := range ids {
		distinct[id] = true
	}
	if len(at) != len(distinct) {
		t.Fatalf("%d requests stored for %d distinct ids", len(at), len(distinct))
	}
	for i, id := range ids {
		if at[got[i].place] != id {
			t.Fatalf("request %d: place %s holds %q, want %s", i, wire.FormatPlace(got[i].place), at[got[i].place], id)
		}
	}
	if slices.Sort(msgIDs); len(slices.Compact(slices.Clone(msgIDs))) != len(msgIDs) {
		t.Fatal("a Nats-Msg-Id is stored twice")
	}
	return len(msgIDs)
}

func newIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = uuid.Must(uuid.NewV7()).String()
	}
	return ids
}

// TestGroupCommitBatchesAnActivity: a group's requests for one activity
// are one message, in arrival order, each request stored once at the
// place its PubAck names; many activities' messages go out as one atomic
// batch.
func TestGroupCommitBatchesAnActivity(t *testing.T) {
	t.Parallel()
	t.Run("one activity", func(t *testing.T) {
		t.Parallel()
		r := newCommitRig(t, true, wire.MaxBatch)
		ids := newIDs(600)
		got := publishAll(t, r, ids, 1, inOrder)
		if n := requireStored(t, r.js, ids, got); n != 1 {
			t.Fatalf("600 queued requests for one activity stored as %d messages, want 1", n)
		}
		for i := range got {
			if !got[i].batched || got[i].place != wire.Place(wire.SeqOf(got[0].place), i) {
				t.Fatalf("request %d at %s (batched %v), want index %d of the batch", i, wire.FormatPlace(got[i].place), got[i].batched, i)
			}
		}
	})
	t.Run("bounded", func(t *testing.T) {
		t.Parallel()
		r := newCommitRig(t, true, 100)
		ids := newIDs(250)
		got := publishAll(t, r, ids, 1, inOrder)
		if n := requireStored(t, r.js, ids, got); n != 3 {
			t.Fatalf("250 queued requests, at most 100 a message, stored as %d messages, want 3", n)
		}
		for i := 1; i < len(got); i++ {
			if got[i].place <= got[i-1].place {
				t.Fatalf("request %d at %s, before the earlier request %d at %s", i, wire.FormatPlace(got[i].place), i-1, wire.FormatPlace(got[i-1].place))
			}
		}
	})
	t.Run("many activities", func(t *testing.T) {
		t.Parallel()
		r := newCommitRig(t, true, wire.MaxBatch)
		ids := newIDs(600)
		got := publishAll(t, r, ids, 40, queued)
		if n := requireStored(t, r.js, ids, got); n != 40 {
			t.Fatalf("600 queued requests for 40 activities stored as %d messages, want 40", n)
		}
		if b := r.batches(); len(b) != 1 || b[0] != 40 {
			t.Fatalf("atomic batches %v, want one of the 40 messages", b)
		}
	})
	t.Run("concurrent", func(t *testing.T) {
		t.Parallel()
		r := newCommitRig(t, true, wire.MaxBatch)
		ids := newIDs(600)
		got := publishAll(t, r, ids, 3, concurrent)
		n := requireStored(t, r.js, ids, got)
		t.Logf("600 concurrent requests for 3 activities stored as %d messages", n)
	})
}

// TestGroupCommitRepublishesABatch: a batch whose PubAck is lost is
// published again with the same Nats-Msg-Id: stored once, its requests at
// the places of the first copy.
func TestGroupCommitRepublishesABatch(t *testing.T) {
	t.Parallel()
	r := newCommitRig(t, true, wire.MaxBatch)
	var (
		mu      sync.Mutex
		dropped = map[string]int{}
	)
	r.c.dropAck = func(id string) bool {
		mu.Lock()
		defer mu.Unlock()
		dropped[id]++
		return dropped[id] == 1 // the first PubAck of every batch is lost
	}
	ids := newIDs(50)
	got := publishAll(t, r, ids, 1, queued)
	if n := requireStored(t, r.js, ids, got); n != 1 {
		t.Fatalf("a batch published twice is stored as %d messages, want 1", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(dropped) != 1 {
		t.Fatalf("PubAcks of %d batches seen, want 1", len(dropped))
	}
	for id, n := range dropped {
		if n != 2 {
			t.Fatalf("batch %s: %d PubAcks, want 2 (the lost one, then the duplicate's)", id, n)
		}
	}
}

// TestGroupCommitFallsBack: a batch holding the same id twice (a retried
// publish) and a stream without atomic publish both end as ordinary
// publishes: every request stored once, repeats answered with the
// original's sequence.
func TestGroupCommitFallsBack(t *testing.T) {
	t.Parallel()
	t.Run("duplicate", func(t *testing.T) {
		t.Parallel()
		r := newCommitRig(t, true, 1)
		ids := newIDs(200)
		for i := 1; i < len(ids); i += 10 {
			ids[i] = ids[i-1]
		}
		got := publishAll(t, r, ids, 5, queued)
		requireStored(t, r.js, ids, got)
	})
	t.Run("no atomic publish", func(t *testing.T) {
		t.Parallel()
		r := newCommitRig(t, false, wire.MaxBatch)
		ids := newIDs(200)
		got := publishAll(t, r, ids, 5, queued)
		if n := requireStored(t, r.js, ids, got); n != 5 {
			t.Fatalf("200 queued requests for 5 activities stored as %d messages, want 5", n)
		}
		if len(r.batches()) != 0 || !r.c.noAtomic.Load() {
			t.Fatalf("batches %v on a stream that refuses them; noAtomic %v", r.batches(), r.c.noAtomic.Load())
		}
	})
}

// TestGroupCommitFoldsUsesOfOneID: uses of one request id in one group
// (an Idempotency-Key used at once) are one copy in their activity's
// batch, and every use is answered with its place.
func TestGroupCommitFoldsUsesOfOneID(t *testing.T) {
	t.Parallel()
	r := newCommitRig(t, true, wire.MaxBatch)
	ids := newIDs(9)
	ids[3], ids[6] = ids[1], ids[1]
	got := make([]placed, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			data, _ := json.Marshal(wire.Request{RequestID: id, Op: wire.OpJoin, ActivityID: 1, UserID: 1})
			msg := &nats.Msg{Subject: wire.RequestSubject(1), Data: data, Header: nats.Header{}}
			res := r.c.publish(msg, wire.OpJoin, id, time.Now().Add(10*time.Second))
			if res.err != nil {
				t.Errorf("publish %d: %v", i, res.err)
				return
			}
			got[i] = placed{wire.Place(res.ack.Sequence, res.index), res.batched}
		})
		testenv.WaitFor(t, 10*time.Second, "the request queued", func() bool { return len(r.c.in) > i })
	}
	r.start(t)
	wg.Wait()
	// requireStored: 7 distinct ids stored once each, every use at its place.
	if n := requireStored(t, r.js, ids, got); n != 1 {
		t.Fatalf("stored as %d messages, want 1", n)
	}
	if got[3].place != got[1].place || got[6].place != got[1].place {
		t.Fatalf("uses of one id at %s, %s, %s", wire.FormatPlace(got[1].place), wire.FormatPlace(got[3].place), wire.FormatPlace(got[6].place))
	}
	if wire.IndexOf(got[8].place) != 6 {
		t.Fatalf("the last of 7 distinct requests at index %d, want 6", wire.IndexOf(got[8].place))
	}
}
