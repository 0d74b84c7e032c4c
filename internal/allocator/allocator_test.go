package allocator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/internal/wire"
)

// env is one test's real MariaDB database and JetStream server.
type env struct {
	t   *testing.T
	db  *dbtest.DB
	ns  *natstest.Server
	nc  *nats.Conn
	js  jetstream.JetStream
	log *slog.Logger
}

// discardLog is a logger that writes nowhere.
func discardLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, db: dbtest.New(t), ns: natstest.New(t), log: discardLog()}
	e.nc, e.js = e.ns.Connect(t)
	if err := bus.EnsureStreams(context.Background(), e.js, config.Defaults[bus.Config]()); err != nil {
		t.Fatal(err)
	}
	return e
}

// start runs an allocator until the test ends.
func (e *env) start(cfg Config, hooks TestHooks) *Allocator {
	e.t.Helper()
	a, err := New(cfg, Deps{DB: e.db.DB, NATS: e.nc, Log: e.log, Test: hooks})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(a.Stop)
	return a
}

func capacity(n int64) *int64 { return &n }

func req(op wire.Op, activity, user int64) wire.Request {
	r := wire.Request{RequestID: uuid.Must(uuid.NewV7()).String(), Op: op, ActivityID: activity, UserID: user, ReceivedAt: time.Now().UTC()}
	return r
}

func open(activity, cap int64) wire.Request {
	r := req(wire.OpOpen, activity, 0)
	r.Capacity = capacity(cap)
	return r
}

// publish stores r with Nats-Msg-Id msgID (request_id when empty).
func (e *env) publish(r wire.Request, msgID string) uint64 {
	e.t.Helper()
	return natstest.PublishRequest(e.t, e.js, r, msgID)
}

func (e *env) publishRaw(subject string, data []byte) uint64 {
	e.t.Helper()
	ack, err := e.js.Publish(context.Background(), subject, data)
	if err != nil {
		e.t.Fatal(err)
	}
	return ack.Sequence
}

// waitFence waits until the partition's fence reaches seq, for as long
// as the fence moves: it fails once the fence has stood still for a
// minute short of seq. A loaded machine (CI runs every package at once,
// race detector on) slows a drain of a request a transaction down to a
// few dozen a second, which is no failure; a fence that stops is.
func (e *env) waitFence(seq uint64) {
	e.t.Helper()
	const still = time.Minute
	var (
		at    uint64
		moved = time.Now()
	)
	for {
		var last uint64
		err := e.db.QueryRow("SELECT last_seq FROM allocator_partition WHERE partition_id = 0").Scan(&last)
		if err == nil && last >= seq {
			return
		}
		if err == nil && last != at {
			at, moved = last, time.Now()
		}
		if time.Since(moved) > still {
			e.t.Fatalf("fence stood at %d for %s, short of %d (last error %v); %s", at, still, seq, err, e.consumerState())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitFenceWithin waits until the partition's fence reaches seq within a
// deadline of the caller's, moving or not (one long transaction).
func (e *env) waitFenceWithin(seq uint64, within time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		var last uint64
		err := e.db.QueryRow("SELECT last_seq FROM allocator_partition WHERE partition_id = 0").Scan(&last)
		if err == nil && last >= seq {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("fence did not reach %d within %s (at %d, err %v); %s", seq, within, last, err, e.consumerState())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// consumerState describes partition 0's consumer, for a failure message.
func (e *env) consumerState() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := e.js.Consumer(ctx, wire.RequestStream, bus.AllocatorConsumer(0))
	if err != nil {
		return "consumer: " + err.Error()
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return "consumer info: " + err.Error()
	}
	pinned := ""
	for _, g := range info.PriorityGroups {
		pinned += fmt.Sprintf(" group %s pinned to %q;", g.Group, g.PinnedClientID)
	}
	return fmt.Sprintf("consumer: %d pending, %d ack pending, %d redelivered, %d waiting pulls, ack floor %d, delivered %d;%s",
		info.NumPending, info.NumAckPending, info.NumRedelivered, info.NumWaiting, info.AckFloor.Stream, info.Delivered.Stream, pinned)
}

func (e *env) result(id string) wire.Result {
	e.t.Helper()
	r, ok, err := store.GetResult(context.Background(), e.db, id)
	if err != nil || !ok {
		e.t.Fatalf("result of %s: found %v, err %v", id, ok, err)
	}
	return r
}

// events reads every event on ALLOT_EVENTS once the stream holds want.
func (e *env) events(want int) []wire.Event {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for natstest.StreamMsgs(e.t, e.js, wire.EventStream) < uint64(want) {
		if time.Now().After(deadline) {
			e.t.Fatalf("event stream holds %d events, want %d", natstest.StreamMsgs(e.t, e.js, wire.EventStream), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	st, err := e.js.Stream(context.Background(), wire.EventStream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, _ := st.Info(context.Background())
	var out []wire.Event
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(context.Background(), seq)
		if err != nil {
			e.t.Fatal(err)
		}
		var ev wire.Event
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			e.t.Fatal(err)
		}
		if m.Header.Get(jetstream.MsgIDHeader) != ev.EventID {
			e.t.Errorf("event %s has Nats-Msg-Id %q", ev.EventID, m.Header.Get(jetstream.MsgIDHeader))
		}
		if m.Subject != wire.EventSubject(ev.ActivityID, ev.Kind) {
			e.t.Errorf("event %s on subject %s", ev.Kind, m.Subject)
		}
		out = append(out, ev)
	}
	return out
}

func kinds(evs []wire.Event) map[wire.EventKind]int {
	m := map[wire.EventKind]int{}
	for _, e := range evs {
		m[e.Kind]++
	}
	return m
}

// TestRedeliveryAfterCrashBetweenCommitAndAck kills (by hook) an allocator
// after its commit and before its acks; the redelivered messages reach a
// second allocator, which must not apply them again.
func TestRedeliveryAfterCrashBetweenCommitAndAck(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	o := open(1, 1)
	j := req(wire.OpJoin, 1, 7)
	e.publish(o, "")
	last := e.publish(j, "")

	var crashed atomic.Bool
	a := e.start(conf(nil), TestHooks{AckWait: time.Second, AfterCommit: func() error {
		crashed.Store(true)
		return errors.New("killed after commit")
	}})
	if err := a.Wait(); !errors.Is(err, ErrCrashed) {
		t.Fatalf("first allocator exited with %v, want ErrCrashed", err)
	}
	if !crashed.Load() {
		t.Fatal("crash hook never ran")
	}
	e.waitFence(last)

	// The second allocator gets both messages again after AckWait.
	e.start(conf(nil), TestHooks{AckWait: time.Second})
	cons, err := e.js.Consumer(context.Background(), wire.RequestStream, bus.AllocatorConsumer(0))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := cons.Info(context.Background())
		if err == nil && info.NumAckPending == 0 && info.NumPending == 0 && info.NumRedelivered == 0 && info.AckFloor.Stream >= last {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("redelivered messages never acknowledged: %+v", info)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The fault took effect: the two messages were delivered again (each
	// delivery, a redelivery too, takes the next consumer sequence), not
	// read afresh by a consumer created anew.
	info, err := cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if redelivered := info.Delivered.Consumer - last; redelivered < 2 {
		t.Fatalf("%d redeliveries (consumer sequence %d over %d messages), want 2: the crash between commit and ack was not exercised",
			redelivered, info.Delivered.Consumer, last)
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM processed_request"); n != 2 {
		t.Fatalf("results = %d, want 2 (one per request)", n)
	}
	if r := e.result(j.RequestID); r.Outcome != wire.OutcomeConfirmed {
		t.Fatalf("join outcome = %s, want CONFIRMED", r.Outcome)
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM activity_signup"); n != 1 {
		t.Fatalf("signup rows = %d, want 1", n)
	}
	evs := e.events(3)
	if got := kinds(evs); got[wire.EventOpened] != 1 || got[wire.EventConfirmed] != 1 || got[wire.EventSoldOut] != 1 || len(evs) != 3 {
		t.Fatalf("events = %v, want one opened, one confirmed, one sold_out", got)
	}
	e.db.CheckInvariants(t)
}

// TestAnIdleLoopWakesTheRelay: a commit's events are relayed once the
// apply loop has nothing more in hand, not only at the relay's period (an
// hour here, so only that wake-up can bring them within the wait).
func TestAnIdleLoopWakesTheRelay(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start(conf(nil), TestHooks{RelayPeriod: time.Hour})
	e.publish(open(1, 5), "")
	e.waitFence(e.publish(req(wire.OpJoin, 1, 7), ""))
	evs := e.events(2)
	if got := kinds(evs); got[wire.EventOpened] != 1 || got[wire.EventConfirmed] != 1 || len(evs) != 2 {
		t.Fatalf("events = %v, want one opened, one confirmed", got)
	}
}

// TestSameRequestStoredTwice covers an Idempotency-Key repeat published
// after the broker's duplicate window: two stream messages, one request.
func TestSameRequestStoredTwice(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.publish(open(1, 5), "")
	j := req(wire.OpJoin, 1, 7)
	e.publish(j, "first")
	last := e.publish(j, "second") // a different Nats-Msg-Id: the broker stores it again
	e.start(conf(nil), TestHooks{})
	e.waitFence(last)
	if n := e.db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE request_id = ?", j.RequestID); n != 1 {
		t.Fatalf("results for the request = %d, want 1", n)
	}
	if n := e.db.Count(t, "SELECT confirmed_count FROM activity WHERE id = 1"); n != 1 {
		t.Fatalf("confirmed_count = %d, want 1", n)
	}
	evs := e.events(2)
	if got := kinds(evs); got[wire.EventConfirmed] != 1 {
		t.Fatalf("events = %v, want one confirmed", got)
	}
	e.db.CheckInvariants(t)
}

// TestGapLeftByDeadConsumerIsFilledInOrder: a dead process took delivery of
// the first requests and never acked them. The allocator must apply them
// first, in stream order, rather than the later ones it is handed.
func TestGapLeftByDeadConsumerIsFilledInOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	cons, err := bus.EnsureAllocatorConsumer(ctx, e.js, bus.ConsumerConfig{MaxAckPending: 100, AckWait: time.Minute, PinnedTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e.publish(open(1, 1), "")
	early := []wire.Request{req(wire.OpJoin, 1, 1), req(wire.OpJoin, 1, 2), req(wire.OpJoin, 1, 3)}
	for _, r := range early {
		e.publish(r, "")
	}
	// The "dead" process: takes delivery of the first four, never acks.
	batch, err := cons.Fetch(4, jetstream.FetchMaxWait(5*time.Second), jetstream.FetchPriorityGroup(bus.PriorityGroup))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range batch.Messages() {
		n++
	}
	if n != 4 {
		t.Fatalf("stole %d messages, want 4", n)
	}
	late := []wire.Request{req(wire.OpJoin, 1, 4), req(wire.OpCancel, 1, 1)}
	var last uint64
	for _, r := range late {
		last = e.publish(r, "")
	}
	e.start(conf(func(k *Config) { k.PinnedTTL = time.Second }), TestHooks{AckWait: time.Minute})
	e.waitFence(last)

	for i, want := range []wire.Outcome{wire.OutcomeConfirmed, wire.OutcomeWaiting, wire.OutcomeWaiting} {
		if got := e.result(early[i].RequestID).Outcome; got != want {
			t.Errorf("early join %d: outcome %s, want %s", i+1, got, want)
		}
	}
	if got := e.result(late[0].RequestID); got.Outcome != wire.OutcomeWaiting || got.Position == nil || *got.Position != 3 {
		t.Errorf("late join: %+v, want WAITING at position 3", got)
	}
	c := e.result(late[1].RequestID)
	if c.Outcome != wire.OutcomeCancelled || c.PromotedUserID == nil || *c.PromotedUserID != 2 {
		t.Errorf("cancel: %+v, want CANCELLED promoting user 2", c)
	}
	e.db.CheckInvariants(t)
}

// TestMalformedMessagesAreTerminatedAndRecorded: poison never blocks the
// partition and is never applied.
func TestMalformedMessagesAreTerminatedAndRecorded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.publish(open(1, 2), "")
	wrongSubject := req(wire.OpJoin, 2, 5)
	wsb, _ := json.Marshal(wrongSubject)
	poison := []struct {
		subject string
		data    string
	}{
		{"alloc.req.1", "\x00\xffgarbage"},
		{"alloc.req.1", `{"request_id":"` + uuid.NewString() + `","op":"steal","activity_id":1,"user_id":3}`},
		{"alloc.req.1", `{"request_id":"` + uuid.NewString() + `","op":"join","activity_id":"one","user_id":3}`},
		{"alloc.req.1", `{"request_id":"not-a-uuid","op":"join","activity_id":1,"user_id":3}`},
		{"alloc.req.1", `{"request_id":"` + uuid.NewString() + `","op":"join","activity_id":1,"user_id":-3}`},
		{"alloc.req.1", `{"request_id":"` + uuid.NewString() + `","op":"open","activity_id":1,"capacity":-1}`},
		{"alloc.req.1", string(wsb)},
		{"alloc.req.x", `{}`},
	}
	for _, p := range poison {
		e.publishRaw(p.subject, []byte(p.data))
	}
	good := req(wire.OpJoin, 1, 9)
	last := e.publish(good, "")
	e.start(conf(nil), TestHooks{})
	e.waitFence(last)
	if n := e.db.Count(t, "SELECT COUNT(*) FROM rejected_message"); n != int64(len(poison)) {
		t.Fatalf("rejected = %d, want %d", n, len(poison))
	}
	if r := e.result(good.RequestID); r.Outcome != wire.OutcomeConfirmed {
		t.Fatalf("request after poison: %s, want CONFIRMED", r.Outcome)
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM activity_signup"); n != 1 {
		t.Fatalf("signups = %d, want 1: poison must change nothing", n)
	}
	e.db.CheckInvariants(t)
}

// TestBatchSizesDecideIdentically: the same stream order gives the same
// outcomes whether requests are applied one, seven or 500 per transaction.
func TestBatchSizesDecideIdentically(t *testing.T) {
	t.Parallel()
	reqs := mixedBurst(1500, 3, 40, 120)
	var want []string
	for _, c := range []struct{ size, cache int }{{1, 0}, {7, 0}, {500, 0}, {7, 1}} {
		t.Run(fmt.Sprintf("batch %d cache %d", c.size, c.cache), func(t *testing.T) {
			e := newEnv(t)
			var last uint64
			for _, r := range reqs {
				last = e.publish(r, "")
			}
			a := e.start(conf(func(k *Config) {
				k.BatchSize = c.size
				if c.cache > 0 {
					k.Cache = c.cache
				}
			}), TestHooks{})
			e.waitFence(last)
			if c.cache > 0 {
				// A cache of one over three activities: reloads from
				// MySQL all along, the same decisions.
				a.Stop()
				if n := a.loop.cache.Len(); n > c.cache {
					t.Fatalf("the cache holds %d activities, bounded at %d", n, c.cache)
				}
				if loads := testutil.ToFloat64(a.m.cache.loads); loads < 10 {
					t.Fatalf("%v loads from MySQL with a cache of one over three activities", loads)
				}
			}
			got := make([]string, len(reqs))
			for i, r := range reqs {
				res := e.result(r.RequestID)
				got[i] = fmt.Sprintf("%s %s %v %v %v %v", res.Op, res.Outcome, deref(res.Status), deref(res.Position),
					deref(res.PromotedUserID), res.PromotedUserIDs)
			}
			e.db.CheckInvariants(t)
			if want == nil {
				want = got
				return
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("request %d (%s): batch size %d, cache %d decided %q, batch size 1 decided %q", i, reqs[i].Op, c.size, c.cache, got[i], want[i])
				}
			}
		})
	}
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// mixedBurst is a deterministic mix of every op over a few activities.
func mixedBurst(n, activities, capacity, users int) []wire.Request {
	var out []wire.Request
	for a := int64(1); a <= int64(activities); a++ {
		out = append(out, open(a, int64(capacity)))
	}
	x := uint64(88172645463325252)
	next := func() uint64 { x ^= x << 13; x ^= x >> 7; x ^= x << 17; return x }
	for i := 0; i < n; i++ {
		a := int64(next()%uint64(activities)) + 1
		u := int64(next()%uint64(users)) + 1
		switch k := next() % 20; {
		case k < 9:
			out = append(out, req(wire.OpJoin, a, u))
		case k < 14:
			out = append(out, req(wire.OpCancel, a, u))
		case k < 19:
			out = append(out, req(wire.OpClaim, a, u))
		default:
			out = append(out, open(a, int64(capacity/2)+int64(next()%uint64(capacity))))
		}
	}
	// A request for an activity never opened.
	return append(out, req(wire.OpJoin, 99, 1))
}

// TestHoleInsideABatchIsFilled: a batch with a message missing in the
// middle (dropped by a slow client, or delivered elsewhere) must not move
// the fence past it: the missing message is read from the stream and
// applied in its place.
func TestHoleInsideABatchIsFilled(t *testing.T) {
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
	e.publish(open(1, 2), "")
	joins := make([]wire.Request, 6)
	for i := range joins {
		joins[i] = req(wire.OpJoin, 1, int64(i+1))
		e.publish(joins[i], "")
	}
	batch, err := a.cons.Fetch(7, jetstream.FetchMaxWait(5*time.Second), jetstream.FetchPriorityGroup(bus.PriorityGroup))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	if len(msgs) != 7 {
		t.Fatalf("fetched %d, want 7", len(msgs))
	}
	// First batch: complete, proves itself contiguous.
	if err := a.handle(ctx, msgs[:3]); err != nil {
		t.Fatal(err)
	}
	// Second batch: the 4th message is missing.
	holed := append([]jetstream.Msg{}, msgs[4:]...)
	if err := a.handle(ctx, holed); err != nil {
		t.Fatal(err)
	}
	for i, want := range []wire.Outcome{wire.OutcomeConfirmed, wire.OutcomeConfirmed, wire.OutcomeWaiting, wire.OutcomeWaiting, wire.OutcomeWaiting, wire.OutcomeWaiting} {
		r := e.result(joins[i].RequestID)
		if r.Outcome != want {
			t.Errorf("join %d: %s, want %s", i+1, r.Outcome, want)
		}
		if r.Position != nil && *r.Position != int64(i-1) {
			t.Errorf("join %d: position %d, want %d (stream order)", i+1, *r.Position, i-1)
		}
	}
	e.db.CheckInvariants(t)
}

// TestOneBadRequestDoesNotSinkItsBatch: a request the database refuses for
// its data (here a trigger turns user 666's signup into a CHECK violation)
// is isolated and rejected; the rest of its batch is applied as usual.
func TestOneBadRequestDoesNotSinkItsBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if _, err := e.db.Exec(`CREATE TRIGGER poison_signup BEFORE INSERT ON activity_signup FOR EACH ROW
		BEGIN IF NEW.user_id = 666 THEN SET NEW.status = 'BOGUS'; END IF; END`); err != nil {
		t.Fatal(err)
	}
	e.publish(open(1, 2), "")
	good1, bad, good2, good3 := req(wire.OpJoin, 1, 1), req(wire.OpJoin, 1, 666), req(wire.OpJoin, 1, 2), req(wire.OpJoin, 1, 3)
	var badSeq, last uint64
	for _, r := range []wire.Request{good1, bad, good2, good3} {
		seq := e.publish(r, "")
		if r.UserID == 666 {
			badSeq = seq
		}
		last = seq
	}
	e.start(conf(func(k *Config) { k.BatchWait = 50 * time.Millisecond }), TestHooks{})
	e.waitFence(last)
	for r, want := range map[wire.Request]wire.Outcome{good1: wire.OutcomeConfirmed, good2: wire.OutcomeConfirmed, good3: wire.OutcomeWaiting} {
		if got := e.result(r.RequestID).Outcome; got != want {
			t.Errorf("user %d: %s, want %s", r.UserID, got, want)
		}
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM rejected_message WHERE seq = ?", badSeq); n != 1 {
		t.Fatalf("the refused request is not recorded as rejected")
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE request_id = ?", bad.RequestID); n != 0 {
		t.Fatalf("the refused request has a result")
	}
	e.db.CheckInvariants(t)
}

// TestReplacedStreamIsRefused: MySQL's fence counts in one stream. When the
// stream is deleted and created anew (a wiped NATS store), its sequences
// start again below the fence; the allocator must refuse to start rather
// than skip the new requests as if they were applied.
func TestReplacedStreamIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.publish(open(1, 5), "")
	last := e.publish(req(wire.OpJoin, 1, 1), "")
	a := e.start(conf(nil), TestHooks{})
	e.waitFence(last)
	a.Stop()

	if err := e.js.DeleteStream(ctx, wire.RequestStream); err != nil {
		t.Fatal(err)
	}
	if err := bus.EnsureStreams(ctx, e.js, config.Defaults[bus.Config]()); err != nil {
		t.Fatal(err)
	}
	fresh := req(wire.OpJoin, 1, 2)
	e.publish(fresh, "") // seq 1 again, below the fence

	b, err := New(conf(nil), Deps{DB: e.db.DB, NATS: e.nc, Log: e.log})
	if err != nil {
		t.Fatal(err)
	}
	err = b.Start(ctx)
	if !errors.Is(err, store.ErrStreamReplaced) {
		b.Stop()
		t.Fatalf("Start on a replaced stream: %v, want ErrStreamReplaced", err)
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE request_id = ?", fresh.RequestID); n != 0 {
		t.Fatal("a request of the new stream was treated as applied")
	}
}

// TestBadRequestInsideAFilledGap: the request the database refuses is one
// a dead consumer held, so it reaches the allocator through a gap filled
// from the stream. Isolation must reject exactly it, apply the others in
// order, and never move the fence past a message left without a result.
func TestBadRequestInsideAFilledGap(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.db.Exec(`CREATE TRIGGER poison_signup BEFORE INSERT ON activity_signup FOR EACH ROW
		BEGIN IF NEW.user_id = 666 THEN SET NEW.status = 'BOGUS'; END IF; END`); err != nil {
		t.Fatal(err)
	}
	cons, err := bus.EnsureAllocatorConsumer(ctx, e.js, bus.ConsumerConfig{MaxAckPending: 100, AckWait: time.Minute, PinnedTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e.publish(open(1, 2), "")
	early := []wire.Request{req(wire.OpJoin, 1, 1), req(wire.OpJoin, 1, 666), req(wire.OpJoin, 1, 2)}
	var badSeq uint64
	for _, r := range early {
		if seq := e.publish(r, ""); r.UserID == 666 {
			badSeq = seq
		}
	}
	// A consumer that takes delivery of everything so far and dies.
	batch, err := cons.Fetch(4, jetstream.FetchMaxWait(5*time.Second), jetstream.FetchPriorityGroup(bus.PriorityGroup))
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for range batch.Messages() {
		held++
	}
	if held != 4 {
		t.Fatalf("the dead consumer holds %d messages, want 4: no gap to fill", held)
	}
	late := []wire.Request{req(wire.OpJoin, 1, 3), req(wire.OpJoin, 1, 4)}
	var last uint64
	for _, r := range late {
		last = e.publish(r, "")
	}
	a := e.start(conf(func(k *Config) { k.PinnedTTL = time.Second }), TestHooks{AckWait: time.Minute})
	e.waitFence(last)
	// The held messages are not redelivered within AckWait: the allocator
	// applied them only because it read the gap from the stream.
	if filled := testutil.ToFloat64(a.m.gapFilled); filled < float64(held) {
		t.Fatalf("%v messages read from the stream to fill the gap, want at least %d", filled, held)
	}

	want := map[int64]wire.Outcome{1: wire.OutcomeConfirmed, 2: wire.OutcomeConfirmed, 3: wire.OutcomeWaiting, 4: wire.OutcomeWaiting}
	for _, r := range append(early, late...) {
		if r.UserID == 666 {
			continue
		}
		if got := e.result(r.RequestID).Outcome; got != want[r.UserID] {
			t.Errorf("user %d: %s, want %s", r.UserID, got, want[r.UserID])
		}
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM rejected_message WHERE seq = ?", badSeq); n != 1 {
		t.Fatal("the refused request is not the one rejected")
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM rejected_message"); n != 1 {
		t.Fatalf("%d messages rejected, want only the refused one", n)
	}
	e.db.CheckInvariants(t)
}

// TestResultsDoNotWaitForTheAckConfirmation: a commit's result notices
// go out while the confirmation of its acks is still on its way.
func TestResultsDoNotWaitForTheAckConfirmation(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	notices := make(chan *nats.Msg, 64)
	sub, err := e.nc.ChanSubscribe(wire.ResultSubject, notices)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // the test's connection
	// Only the join's commit is held: the post-commit queue confirms
	// commits in order, so a held open committed alone would hold the
	// join's notice behind it.
	var hold atomic.Bool
	var confirms atomic.Int32
	release := make(chan struct{})
	e.start(conf(nil), TestHooks{BeforeConfirm: func() {
		held := hold.Load()
		confirms.Add(1)
		if held {
			<-release
		}
	}})
	t.Cleanup(func() { close(release) }) // runs before Stop, which confirms every ack
	e.publish(open(1, 5), "")
	testenv.WaitFor(t, 20*time.Second, "the open's commit at its ack confirmation", func() bool { return confirms.Load() > 0 })
	hold.Store(true)
	j := req(wire.OpJoin, 1, 7)
	e.publish(j, "")
	deadline := time.After(20 * time.Second)
	for {
		select {
		case m := <-notices:
			b, err := wire.DecodeResultBatch(m.Data)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range b.Results {
				if r.RequestID == j.RequestID {
					if r.Outcome != wire.OutcomeConfirmed {
						t.Fatalf("the join's notice: %s, want CONFIRMED", r.Outcome)
					}
					return
				}
			}
		case <-deadline:
			t.Fatal("no result notice while the acks' confirmation waits")
		}
	}
}

// TestStopConfirmsEveryAck: acks are confirmed off the apply loop, but
// Stop returns only once the server has taken every one of them, however
// slow the confirmation.
func TestStopConfirmsEveryAck(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.publish(open(1, 10), "")
	var last uint64
	for u := range int64(300) {
		last = e.publish(req(wire.OpJoin, 1, u+1), "")
	}
	a, err := New(conf(func(k *Config) { k.BatchSize = 50 }), Deps{DB: e.db.DB, NATS: e.nc, Log: e.log, Test: TestHooks{
		BeforeConfirm: func() { time.Sleep(50 * time.Millisecond) },
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.waitFence(last)
	a.Stop()
	cons, err := e.js.Consumer(context.Background(), wire.RequestStream, bus.AllocatorConsumer(0))
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending != 0 || info.AckFloor.Stream != last {
		t.Fatalf("after Stop: %d acks pending, ack floor %d, want 0 and %d", info.NumAckPending, info.AckFloor.Stream, last)
	}
}
