package allocator

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/internal/allocation"
	"github.com/allot-dev/allot/internal/allocator/viewpub"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/wire"
)

// viewBucketMsgs is the number of messages the view bucket's stream holds.
// A stream info request that times out (the server busy storing a churn on
// a loaded machine) is asked again, for up to a minute.
func (e *env) viewBucketMsgs() uint64 {
	e.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		n, err := e.viewBucketState()
		if err == nil {
			return n
		}
		if time.Now().After(deadline) || !(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)) {
			e.t.Fatalf("the view bucket's stream: %v", err)
		}
	}
}

// viewBucketState reads the view bucket stream's message count once.
func (e *env) viewBucketState() (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := e.js.Stream(ctx, bus.KeyValueStream(wire.ViewBucket))
	if err != nil {
		return 0, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

// churn opens n activities of capacity 1, fills each with one claim and
// then empties it with one cancel, the claims applied before the cancels
// (so every activity gets a view before it is cleared); it returns the
// last stream sequence.
func (e *env) churn(first, n int64) uint64 {
	e.t.Helper()
	reqs := make([]wire.Request, 0, 3*n)
	for a := first; a < first+n; a++ {
		reqs = append(reqs, open(a, 1))
	}
	for a := first; a < first+n; a++ {
		reqs = append(reqs, req(wire.OpClaim, a, 1))
	}
	for a := first; a < first+n; a++ {
		reqs = append(reqs, req(wire.OpCancel, a, 1))
	}
	var last uint64
	for lo := 0; lo < len(reqs); lo += 2000 { // below the async publish bound
		last = e.publishAll(reqs[lo:min(lo+2000, len(reqs))])
	}
	return last
}

// TestViewBucketHoldsOnlyLiveViews: activities filled and emptied leave no
// key behind in the view bucket; only the activity still full has one.
func TestViewBucketHoldsOnlyLiveViews(t *testing.T) {
	t.Parallel()
	n := int64(5000)
	if testing.Short() {
		n = 1000
	}
	e := newEnv(t)
	// Fewer keys tracked than activities filled: the untracked ones are
	// deleted, and leave the bucket too.
	reg := prometheus.NewRegistry()
	a, err := New(conf(func(k *Config) { k.Cache = 250 }), Deps{DB: e.db.DB, NATS: e.nc, Log: e.log, Registerer: reg, Test: TestHooks{ViewClearTTL: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	e.churn(1, n)
	// One activity stays full: its view stays.
	e.publish(open(n+1, 1), "")
	e.waitFenceWithin(e.publish(req(wire.OpClaim, n+1, 1), ""), 5*time.Minute)
	deadline := time.Now().Add(time.Minute)
	for {
		msgs := e.viewBucketMsgs()
		if msgs <= 1 {
			break
		}
		if time.Now().After(deadline) {
			mfs, _ := reg.Gather()
			for _, mf := range mfs {
				if strings.Contains(mf.GetName(), "view") {
					for _, m := range mf.GetMetric() {
						t.Logf("%s %v %v %v", mf.GetName(), m.GetLabel(), m.GetCounter().GetValue(), m.GetGauge().GetValue())
					}
				}
			}
			kv, _ := e.js.KeyValue(context.Background(), wire.ViewBucket)
			keys, _ := kv.Keys(context.Background())
			for i, k := range keys {
				if i < 5 || i == len(keys)-1 {
					en, _ := kv.Get(context.Background(), k)
					t.Logf("left: %s rev %d %s", k, en.Revision(), en.Value())
				}
			}
			t.Fatalf("after %d activities filled and emptied, the view bucket holds %d messages, want the one live view", n, msgs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	kv, err := e.js.KeyValue(context.Background(), wire.ViewBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(context.Background(), wire.ViewKey(n+1)); err != nil {
		t.Fatalf("the view of the full activity: %v", err)
	}
}

// storedView reads the view of activity from the bucket; ok is false when
// the key holds none.
func (e *env) storedView(activity int64) (wire.View, uint64, bool) {
	e.t.Helper()
	kv, err := e.js.KeyValue(context.Background(), wire.ViewBucket)
	if err != nil {
		e.t.Fatal(err)
	}
	en, err := kv.Get(context.Background(), wire.ViewKey(activity))
	if err != nil {
		return wire.View{}, 0, false
	}
	var v wire.View
	if err := json.Unmarshal(en.Value(), &v); err != nil {
		e.t.Fatal(err)
	}
	return v, en.Revision(), true
}

// waitStored waits until the bucket's view of activity satisfies ok (a
// missing view is passed as ok=false).
func (e *env) waitStored(activity int64, what string, ok func(v wire.View, present bool) bool) wire.View {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, _, present := e.storedView(activity)
		if ok(v, present) {
			return v
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("the view of activity %d never became %s (last: %+v, present %v)", activity, what, v, present)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLatePutCannotResurrectAClearedView: a put of an older full view that
// reaches the bucket after a later clear (an allocator that lost the
// partition, woken up) is refused, while the clear is stored and after it
// expired; the owner's own later view still goes in after the expiry.
func TestLatePutCannotResurrectAClearedView(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.start(conf(nil), TestHooks{ViewClearTTL: time.Second})
	const act = 7
	e.publish(open(act, 1), "")
	e.waitFence(e.publish(req(wire.OpClaim, act, 1), ""))
	full := e.waitStored(act, "full", func(v wire.View, ok bool) bool { return ok && allocation.ViewDecides(v) })
	_, fullRev, _ := e.storedView(act)

	e.waitFence(e.publish(req(wire.OpCancel, act, 1), ""))
	cleared := e.waitStored(act, "cleared", func(v wire.View, ok bool) bool { return ok && !allocation.ViewDecides(v) })
	if cleared.Seq <= full.Seq {
		t.Fatalf("cleared view at seq %d, full one at %d", cleared.Seq, full.Seq)
	}

	// Stale writers: one that never saw the key, one that wrote the full
	// view itself; both hold the full view, late.
	ctx := context.Background()
	for _, rev := range []uint64{0, fullRev} {
		e.staleWriter(a).PutStale(ctx, full, rev)
		if v, _, ok := e.storedView(act); !ok || allocation.ViewDecides(v) || v.Seq != cleared.Seq {
			t.Fatalf("a late put (expecting revision %d) replaced the clear: %+v", rev, v)
		}
	}

	// Once the clear expired, the key is empty; the late put still cannot
	// fill it, since MySQL has the activity past the view's sequence.
	e.waitStored(act, "gone", func(_ wire.View, ok bool) bool { return !ok })
	e.staleWriter(a).PutStale(ctx, full, fullRev)
	if v, _, ok := e.storedView(act); ok {
		t.Fatalf("a late put resurrected an expired clear: %+v", v)
	}

	// The owner's own next full view goes in over the expired clear.
	e.waitFence(e.publish(req(wire.OpClaim, act, 2), ""))
	again := e.waitStored(act, "full again", func(v wire.View, ok bool) bool { return ok && allocation.ViewDecides(v) })
	if len(again.Holders) != 1 || again.Holders[0] != 2 || again.Seq <= cleared.Seq {
		t.Fatalf("the view after the second claim: %+v", again)
	}
}

// TestRebuiltViewIsOneSnapshot: a takeover's rebuild reads an activity's
// row and its seats in one snapshot, so a commit falling between the two
// reads cannot give a view that describes a later state than its sequence.
func TestRebuiltViewIsOneSnapshot(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.start(conf(nil), TestHooks{})
	const act = 8
	e.publish(open(act, 2), "")
	e.publish(req(wire.OpClaim, act, 1), "")
	e.waitFence(e.publish(req(wire.OpClaim, act, 2), ""))
	before := e.waitStored(act, "full", func(v wire.View, ok bool) bool { return ok && allocation.ViewDecides(v) })
	a.Stop()
	// The next owner finds no view and must write it from MySQL.
	ctx := context.Background()
	kv, err := e.js.KeyValue(ctx, wire.ViewBucket)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, wire.ViewKey(act), jetstream.PurgeTTL(time.Second)); err != nil {
		t.Fatal(err)
	}
	st, err := e.js.Stream(ctx, bus.KeyValueStream(wire.ViewBucket))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := st.GetLastMsgForSubject(ctx, "$KV."+wire.ViewBucket+"."+wire.ViewKey(act)); errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the purge marker never expired")
		}
		time.Sleep(50 * time.Millisecond)
	}
	var once sync.Once
	e.start(conf(nil), TestHooks{ViewSnapshot: func() {
		once.Do(func() {
			// A commit of the previous owner between the reads: user 2
			// leaves, user 3 takes the seat, two requests later.
			for _, q := range []string{
				"UPDATE activity_signup SET status = 'CANCELLED' WHERE activity_id = 8 AND user_id = 2",
				"INSERT INTO activity_signup (activity_id, user_id, status, queue_seq) SELECT 8, 3, 'CONFIRMED', MAX(queue_seq) + 1 FROM activity_signup WHERE activity_id = 8",
				"UPDATE activity SET next_seq = next_seq + 2 WHERE id = 8",
			} {
				if _, err := e.db.Exec(q); err != nil {
					t.Error(err)
				}
			}
		})
	}})
	got := e.waitStored(act, "rebuilt", func(v wire.View, ok bool) bool { return ok })
	if got.Seq != before.Seq || !slices.Equal(sorted(got.Holders), sorted(before.Holders)) || !allocation.ViewDecides(got) {
		t.Fatalf("rebuilt view %+v, want the state at its sequence %+v", got, before)
	}
}

func sorted(s []int64) []int64 {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestRebuildExpiresLegacyClears: cleared views and deletes stored without
// a TTL (by a version that never expired them) are written again with one
// by the next rebuild, and leave the bucket.
func TestRebuildExpiresLegacyClears(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	kv, err := e.js.KeyValue(ctx, wire.ViewBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, wire.ViewKey(100), []byte(`{"activity_id":100,"capacity":2,"confirmed":1,"seq":40}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, wire.ViewKey(101), []byte(`{"activity_id":101,"capacity":1,"confirmed":1,"seq":41,"complete":true,"holders":[1]}`)); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, wire.ViewKey(101)); err != nil {
		t.Fatal(err)
	}
	if n := e.viewBucketMsgs(); n != 2 {
		t.Fatalf("precondition: %d messages in the bucket, want 2", n)
	}
	// Older than any clear this version writes (twice the TTL and the
	// marker's, and a margin).
	time.Sleep(10 * time.Second)
	e.start(conf(nil), TestHooks{ViewClearTTL: time.Second})
	deadline := time.Now().Add(time.Minute)
	for e.viewBucketMsgs() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("legacy clears still in the bucket: %d messages", e.viewBucketMsgs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestFrozenViewBucketCostsTheApplyLoopNothing: with a view bucket that
// never answers (every publish on its subjects dropped, as a stream without
// a leader looks to a client), requests are still applied, activities
// filled, and the allocator stops.
func TestFrozenViewBucketCostsTheApplyLoopNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f, err := natstest.NewFreezer(e.ns.Addr().String(), wire.ViewBucket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	nc, err := nats.Connect(f.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	a, err := New(conf(nil), Deps{DB: e.db.DB, NATS: nc, Log: e.log})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.SetFrozen(true)
	var reqs []wire.Request
	for act := int64(1); act <= 50; act++ {
		reqs = append(reqs, open(act, 1), req(wire.OpJoin, act, 1))
	}
	e.waitFence(e.publishAll(reqs))
	stopped := make(chan struct{})
	go func() { a.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(time.Minute):
		t.Fatal("the allocator did not stop with its view bucket frozen")
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM activity WHERE confirmed_count = 1"); n != 50 {
		t.Fatalf("%d activities filled, want 50", n)
	}
}

// staleWriter is a second view publisher of a's partition, as a late
// writer (an old owner) is.
func (e *env) staleWriter(a *Allocator) *viewpub.Publisher {
	e.t.Helper()
	kv, err := e.js.KeyValue(context.Background(), wire.ViewBucket)
	if err != nil {
		e.t.Fatal(err)
	}
	d := a.viewDeps(kv)
	d.Registerer = prometheus.NewRegistry()
	p, err := viewpub.New(d)
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}
