package allocator

import (
	"context"
	"encoding/json"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/internal/store"
	"github.com/allot-dev/allot/internal/wire"
)

// publishBatch stores reqs (all for one activity) as one batch message, with
// Nats-Msg-Id msgID (a fresh one when empty), as ingest publishes a batch.
func (e *env) publishBatch(reqs []wire.Request, msgID string) uint64 {
	e.t.Helper()
	bodies := make([][]byte, len(reqs))
	ops := make([]wire.Op, len(reqs))
	for i, r := range reqs {
		b, err := json.Marshal(r)
		if err != nil {
			e.t.Fatal(err)
		}
		bodies[i], ops[i] = b, r.Op
	}
	msg := nats.NewMsg(wire.RequestSubject(reqs[0].ActivityID))
	msg.Header.Set(wire.BatchHeader, strconv.Itoa(len(reqs)))
	msg.Header.Set(wire.OpsHeader, wire.OpsOf(ops...))
	msg.Data = wire.EncodeBatch(bodies)
	return e.publishMsg(msg, msgID)
}

// publishMsg stores msg as it is, with Nats-Msg-Id msgID (fresh when empty).
func (e *env) publishMsg(msg *nats.Msg, msgID string) uint64 {
	e.t.Helper()
	if msgID == "" {
		msgID = uuid.NewString()
	}
	ack, err := e.js.PublishMsg(context.Background(), msg, jetstream.WithMsgID(msgID))
	if err != nil {
		e.t.Fatal(err)
	}
	return ack.Sequence
}

// resultNotices collects the results published on the result subject.
type resultNotices struct {
	mu   sync.Mutex
	byID map[string][]wire.Result
}

func (e *env) watchResults() *resultNotices {
	e.t.Helper()
	n := &resultNotices{byID: map[string][]wire.Result{}}
	sub, err := e.nc.Subscribe(wire.ResultSubject, func(m *nats.Msg) {
		var b wire.ResultBatch
		if json.Unmarshal(m.Data, &b) != nil {
			return
		}
		n.mu.Lock()
		defer n.mu.Unlock()
		for _, r := range b.Results {
			n.byID[r.RequestID] = append(n.byID[r.RequestID], r)
		}
	})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.nc.Flush(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { sub.Unsubscribe() }) //nolint:errcheck
	return n
}

// wait returns the notices of id once there are at least want.
func (n *resultNotices) wait(t *testing.T, id string, want int) []wire.Result {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		n.mu.Lock()
		got := append([]wire.Result(nil), n.byID[id]...)
		n.mu.Unlock()
		if len(got) >= want {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d notices of %s on the result subject, want %d", len(got), id, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestBatchesAndSinglesInOneStream: single messages and batches of one
// activity, mixed (open, joins, a cancel that promotes, claims): every
// request is applied once, in place order; its result is at its place;
// queue_seq follows the place; the invariants hold.
func TestBatchesAndSinglesInOneStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const act = 1
	type placed struct {
		r     wire.Request
		seq   uint64
		index int
	}
	var all []placed
	single := func(r wire.Request) {
		all = append(all, placed{r, e.publish(r, ""), 0})
	}
	batch := func(rs ...wire.Request) {
		seq := e.publishBatch(rs, "")
		for i, r := range rs {
			all = append(all, placed{r, seq, i})
		}
	}
	single(open(act, 2))
	batch(req(wire.OpJoin, act, 1), req(wire.OpJoin, act, 2), req(wire.OpJoin, act, 3), req(wire.OpJoin, act, 4))
	single(req(wire.OpJoin, act, 5))
	batch(req(wire.OpCancel, act, 1), req(wire.OpClaim, act, 6), req(wire.OpClaim, act, 2))
	single(req(wire.OpCancel, act, 2))
	batch(req(wire.OpClaim, act, 3), req(wire.OpJoin, act, 7))
	last := all[len(all)-1].seq
	e.start(conf(func(k *Config) { k.BatchWait = 20 * time.Millisecond }), TestHooks{})
	e.waitFence(last)

	want := map[string]wire.Outcome{}
	outcomes := []wire.Outcome{wire.OutcomeOpened,
		wire.OutcomeConfirmed, wire.OutcomeConfirmed, wire.OutcomeWaiting, wire.OutcomeWaiting,
		wire.OutcomeWaiting,
		wire.OutcomeCancelled, wire.OutcomeSoldOut, wire.OutcomeAlreadyOwned,
		wire.OutcomeCancelled,
		wire.OutcomeAlreadyOwned, wire.OutcomeWaiting}
	for i, p := range all {
		want[p.r.RequestID] = outcomes[i]
		r := e.result(p.r.RequestID)
		if r.Seq != p.seq || r.Index != p.index {
			t.Errorf("%s of user %d: result at %d#%d, published at %d#%d", p.r.Op, p.r.UserID, r.Seq, r.Index, p.seq, p.index)
		}
		if r.Outcome != outcomes[i] {
			t.Errorf("%s of user %d: %s, want %s", p.r.Op, p.r.UserID, r.Outcome, outcomes[i])
		}
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM processed_request"); n != int64(len(all)) {
		t.Fatalf("%d results, want one per request: %d", n, len(all))
	}
	// The cancel of user 1 promoted user 3, the cancel of user 2 user 4.
	if p := e.result(all[6].r.RequestID).PromotedUserID; p == nil || *p != 3 {
		t.Errorf("the cancel in a batch promoted %v, want user 3", deref(p))
	}
	if p := e.result(all[9].r.RequestID).PromotedUserID; p == nil || *p != 4 {
		t.Errorf("the single cancel promoted %v, want user 4", deref(p))
	}
	// queue_seq is the place of the user's join, and grows with it.
	rows, err := e.db.Query("SELECT user_id, queue_seq FROM activity_signup WHERE activity_id = ? ORDER BY user_id", act)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	joinAt := map[int64]uint64{}
	for _, p := range all {
		if p.r.Op == wire.OpJoin {
			joinAt[p.r.UserID] = wire.Place(p.seq, p.index)
		}
	}
	var prev uint64
	for rows.Next() {
		var (
			user int64
			q    uint64
		)
		if err := rows.Scan(&user, &q); err != nil {
			t.Fatal(err)
		}
		if q != joinAt[user] {
			t.Errorf("user %d: queue_seq %d, want the join's place %s", user, q, wire.FormatPlace(joinAt[user]))
		}
		if q <= prev {
			t.Errorf("user %d: queue_seq %d not after %d", user, q, prev)
		}
		prev = q
	}
	e.db.CheckInvariants(t)
}

// poison makes MySQL refuse the signup row of user 666 (a CHECK violation).
func (e *env) poison() {
	e.t.Helper()
	if _, err := e.db.Exec(`CREATE TRIGGER poison_signup BEFORE INSERT ON activity_signup FOR EACH ROW
		BEGIN IF NEW.user_id = 666 THEN SET NEW.status = 'BOGUS'; END IF; END`); err != nil {
		e.t.Fatal(err)
	}
}

// TestBatchRejectsOnlyTheRefusedRequest: in a batch, the one request MySQL
// refuses is rejected alone, at its place; the batch's other requests
// (before and after it) are applied, and the fence moves past the message.
func TestBatchRejectsOnlyTheRefusedRequest(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.poison()
	notices := e.watchResults()
	e.publish(open(1, 2), "")
	reqs := []wire.Request{req(wire.OpJoin, 1, 1), req(wire.OpJoin, 1, 666), req(wire.OpJoin, 1, 2), req(wire.OpJoin, 1, 3)}
	seq := e.publishBatch(reqs, "")
	after := req(wire.OpJoin, 1, 4)
	last := e.publish(after, "")
	e.start(conf(func(k *Config) { k.BatchWait = 50 * time.Millisecond }), TestHooks{})
	e.waitFence(last)

	for r, want := range map[wire.Request]wire.Outcome{reqs[0]: wire.OutcomeConfirmed, reqs[2]: wire.OutcomeConfirmed,
		reqs[3]: wire.OutcomeWaiting, after: wire.OutcomeWaiting} {
		if got := e.result(r.RequestID).Outcome; got != want {
			t.Errorf("user %d: %s, want %s", r.UserID, got, want)
		}
	}
	bad := e.result(reqs[1].RequestID)
	if bad.Outcome != wire.OutcomeRejected || bad.Seq != seq || bad.Index != 1 || bad.UserID != 666 {
		t.Fatalf("the refused request reads %+v, want REJECTED at %d#1", bad, seq)
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM rejected_message"); n != 1 {
		t.Fatalf("%d rejections, want the refused request's only", n)
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM rejected_message WHERE seq = ? AND batch_index = 1 AND request_id = ?", seq, reqs[1].RequestID); n != 1 {
		t.Fatal("the rejection is not at the refused request's place")
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE request_id = ?", reqs[1].RequestID); n != 0 {
		t.Fatal("the refused request has a result")
	}
	// Its waiting client is told what a poll reads.
	if got := notices.wait(t, reqs[1].RequestID, 1); !reflect.DeepEqual(got[len(got)-1], bad) {
		t.Errorf("told %+v, a poll reads %+v", got[len(got)-1], bad)
	}
	e.db.CheckInvariants(t)
}

// TestRequestInTwoMessagesAppliedOnce: a request id carried by two batches,
// by a batch and then a single message, or twice in one batch is applied
// once; every later copy is answered with the first application's
// recorded result.
func TestRequestInTwoMessagesAppliedOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	notices := e.watchResults()
	e.publish(open(1, 1), "")
	x, y, z := req(wire.OpJoin, 1, 1), req(wire.OpJoin, 1, 2), req(wire.OpJoin, 1, 3)
	first := e.publishBatch([]wire.Request{x, y}, "")
	a := e.start(conf(nil), TestHooks{})
	e.waitFence(first)
	recorded := map[string]wire.Result{x.RequestID: e.result(x.RequestID), y.RequestID: e.result(y.RequestID)}
	if r := recorded[x.RequestID]; r.Seq != first || r.Index != 0 || r.Outcome != wire.OutcomeConfirmed {
		t.Fatalf("first application of x: %+v", r)
	}

	// Another batch with x again (a different Nats-Msg-Id), a single
	// republish of y, and a batch holding z twice.
	e.publishBatch([]wire.Request{req(wire.OpJoin, 1, 4), x}, "")
	e.publish(y, "republished-"+y.RequestID)
	last := e.publishBatch([]wire.Request{z, z}, "")
	e.waitFence(last)
	a.Stop()

	for _, r := range []wire.Request{x, y, z} {
		if n := e.db.Count(t, "SELECT COUNT(*) FROM processed_request WHERE request_id = ?", r.RequestID); n != 1 {
			t.Fatalf("user %d's request has %d results, want 1", r.UserID, n)
		}
	}
	recorded[z.RequestID] = e.result(z.RequestID)
	if r := recorded[z.RequestID]; r.Seq != last || r.Index != 0 || r.Outcome != wire.OutcomeWaiting {
		t.Fatalf("z applied %+v, want WAITING at its first place %d#0", r, last)
	}
	// x and y: the first application's notice and the repeat's; z: the
	// application's and its repeat's in the same batch. All the same.
	for id, rec := range recorded {
		for _, got := range notices.wait(t, id, 2) {
			if !reflect.DeepEqual(got, rec) {
				t.Errorf("a notice of %s is %+v, the recorded result %+v", id, got, rec)
			}
		}
	}
	e.db.CheckInvariants(t)
}

// TestTwoHoldsOfOneUserInABatch: join, cancel, join of one user in one batch
// on an activity with holds gives two holds at two places, whose expires
// have two ids; the relay schedules both, the dead hold's expire finds no
// hold and the live one's lapses it. A user promoted by a cancel inside a
// batch holds the hold at the cancel's place, and its expire lapses it.
func TestTwoHoldsOfOneUserInABatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const act, user = 7, 1
	const hold = time.Second
	const other = 8 // the promotion's activity
	e.publish(openHold(act, 1, hold), "")
	e.publish(openHold(other, 1, hold), "")
	e.publish(req(wire.OpJoin, other, 1), "")
	promoting := e.publishBatch([]wire.Request{req(wire.OpJoin, other, 2), req(wire.OpCancel, other, 1)}, "")
	reqs := []wire.Request{req(wire.OpJoin, act, user), req(wire.OpCancel, act, user), req(wire.OpJoin, act, user)}
	seq := e.publishBatch(reqs, "")
	e.start(conf(nil), TestHooks{})
	e.waitFence(seq)

	for i, want := range []wire.Outcome{wire.OutcomeHeld, wire.OutcomeCancelled, wire.OutcomeHeld} {
		if r := e.result(reqs[i].RequestID); r.Outcome != want || r.Seq != seq || r.Index != i {
			t.Fatalf("request %d: %+v, want %s at %d#%d", i, r, want, seq, i)
		}
	}
	dead, live := wire.Place(seq, 0), wire.Place(seq, 2)
	if n := e.db.Count(t, "SELECT COUNT(*) FROM activity_signup WHERE activity_id = ? AND user_id = ? AND status = 'HELD' AND hold_seq = ?",
		act, user, live); n != 1 {
		t.Fatalf("the user's hold is not the second join's (place %s)", wire.FormatPlace(live))
	}
	deadID, liveID := wire.ExpireRequestID(act, user, dead), wire.ExpireRequestID(act, user, live)
	if deadID == liveID {
		t.Fatal("the two holds' expires have one id")
	}
	if r := e.waitResult(liveID, 30*time.Second); r.Op != wire.OpExpire || r.Outcome != wire.OutcomeExpired || r.UserID != user {
		t.Fatalf("the live hold's expire: %+v", r)
	}
	if r := e.waitResult(deadID, 30*time.Second); r.Op != wire.OpExpire || r.Outcome != wire.OutcomeNotHeld {
		t.Fatalf("the dead hold's expire: %+v, want NOT_HELD", r)
	}
	s, ok, err := store.GetActivity(context.Background(), e.db, act)
	if err != nil || !ok || s.Held != 0 || s.Confirmed != 0 {
		t.Fatalf("after the hold lapsed: %+v %v %v", s, ok, err)
	}
	promotedID := wire.ExpireRequestID(other, 2, wire.Place(promoting, 1))
	if r := e.waitResult(promotedID, 30*time.Second); r.Outcome != wire.OutcomeExpired || r.UserID != 2 {
		t.Fatalf("the promoted user's expire (hold at %d#1): %+v", promoting, r)
	}
	e.db.CheckInvariants(t)
}

// TestMalformedBatchRefusedWhole: a batch whose header and body disagree,
// or whose body is no array, is refused whole at (seq, 0), nothing in it
// applied; a malformed request inside a well-formed batch is refused
// alone at its place. The partition moves on.
func TestMalformedBatchRefusedWhole(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.publish(open(1, 5), "")
	j1, j2 := req(wire.OpJoin, 1, 1), req(wire.OpJoin, 1, 2)
	b1, _ := json.Marshal(j1)
	b2, _ := json.Marshal(j2)
	short := nats.NewMsg(wire.RequestSubject(1))
	short.Header.Set(wire.BatchHeader, "3")
	short.Data = wire.EncodeBatch([][]byte{b1, b2})
	shortSeq := e.publishMsg(short, "")
	notArray := nats.NewMsg(wire.RequestSubject(1))
	notArray.Header.Set(wire.BatchHeader, "1")
	notArray.Data = b1
	notArraySeq := e.publishMsg(notArray, "")
	bad := req(wire.OpJoin, 1, 0) // a join needs a user
	good := req(wire.OpJoin, 1, 3)
	mixedSeq := e.publishBatch([]wire.Request{good, bad}, "")
	last := e.publish(req(wire.OpJoin, 1, 4), "")
	e.start(conf(nil), TestHooks{})
	e.waitFence(last)

	for _, seq := range []uint64{shortSeq, notArraySeq} {
		if n := e.db.Count(t, "SELECT COUNT(*) FROM rejected_message WHERE seq = ? AND batch_index = 0 AND request_id IS NULL", seq); n != 1 {
			t.Errorf("the malformed batch at %d is not refused whole at index 0", seq)
		}
	}
	for _, r := range []wire.Request{j1, j2} {
		if _, ok, err := store.GetResult(context.Background(), e.db, r.RequestID); err != nil || ok {
			t.Errorf("a request of a malformed batch has an answer (%v, %v)", ok, err)
		}
	}
	if r := e.result(bad.RequestID); r.Outcome != wire.OutcomeRejected || r.Seq != mixedSeq || r.Index != 1 {
		t.Errorf("the malformed request reads %+v, want REJECTED at %d#1", r, mixedSeq)
	}
	if r := e.result(good.RequestID); r.Outcome != wire.OutcomeConfirmed || r.Seq != mixedSeq || r.Index != 0 {
		t.Errorf("its neighbour reads %+v, want CONFIRMED at %d#0", r, mixedSeq)
	}
	if n := e.db.Count(t, "SELECT COUNT(*) FROM rejected_message"); n != 3 {
		t.Errorf("%d rejections, want 3", n)
	}
	e.db.CheckInvariants(t)
}

// TestTransactionBoundCountsRequests: BatchSize bounds the requests of one
// transaction, not its messages: whole messages until the requests reach
// it. (A transaction's results share its one clock reading.)
func TestTransactionBoundCountsRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.publish(open(1, 100), "")
	var last uint64
	for b := range int64(3) {
		last = e.publishBatch([]wire.Request{req(wire.OpJoin, 1, 3*b+1), req(wire.OpJoin, 1, 3*b+2), req(wire.OpJoin, 1, 3*b+3)}, "")
	}
	e.start(conf(func(k *Config) { k.BatchSize = 4; k.BatchWait = 200 * time.Millisecond }), TestHooks{})
	e.waitFence(last)
	if n := e.db.Count(t, "SELECT COUNT(*) FROM processed_request"); n != 10 {
		t.Fatalf("%d results, want 10", n)
	}
	// The open and a batch (4 requests), then two batches (6): never all 10.
	if n := e.db.Count(t, "SELECT MAX(n) FROM (SELECT COUNT(*) AS n FROM processed_request GROUP BY applied_at) x"); n > 6 {
		t.Fatalf("one transaction applied %d requests, over the bound of 4 by more than a message", n)
	}
	e.db.CheckInvariants(t)
}
